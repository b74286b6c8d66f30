# Device call for #19's last part, on an H200 only (needs its 139 GiB; pass needs_h200): the longest sequence of
# Qwen3-14B-wide x 8 layers on the whole H200, one step, c21's policy (offload, prefetch 1, 8 chunks, tile 4,096).
# Predicted before (2026-12-06 sixth session):
# - c21's measured line on the H100 (27.74 GiB at 131,072 tokens, 51.55 at 262,144, 69.42 at 360,448: 195,100
#   B/token; the allocator's bytes do not depend on the card) puts 134 GiB allocated at 715,900 tokens: the run
#   takes 688,128 (a multiple of 32,768 with 6 GiB to spare), then 655,360 if that fails;
# - the memory model with the attention backward's transients (`python -m benchmarks.long_seq_tiled --layers 8
#   --parts whole --max-seq 2097152 --predict-only`) also gives 688,128 tokens as the longest, with tile 262,144:
#   330.7 s/step, GPU peak 138.5 GiB (136.5 allocated), the same peak with c21's tile (below the attention
#   backward's floor the tile saves nothing). It ran +9.2% high at 360,448 tokens on the H100 (c21).
# Carry .whl. Run: bash benchmarks/results/next-h200/call22.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT; D=benchmarks/results/next-h200; O=/tmp/c22; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c22_env.txt 2>&1
{ lscpu | grep -E "Model name|Model:"; free -g; } > $OUT/c22_host.txt 2>&1
for S in 688128 655360; do
  timeout $(left 590) python3 -m slidedp.cli train --model $D/qwen3-14b-wide-8l.json --data synthetic --seq $S \
    --policy $D/c21-tile4096.yaml --steps 1 --nproc 1 --hardware h200-x1 --device auto --no-checkpoint \
    --out $O/s$S > $OUT/c22_s$S.log 2>&1; code=$?
  echo "seq $S exit $code at $(( $(date +%s) - T0 )) s" >> $OUT/c22_runs.txt
  [ $code -eq 0 ] && break
done
pack_runs c22_runs.tgz $O
