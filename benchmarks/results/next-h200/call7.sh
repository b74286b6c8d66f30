# Next device session (an H200 or the lent H100: both hosts have 128 GiB; about 9 min): #16's Qwen3-14B (40 layers)
# in bf16+int8 at batch 16 and 1, tuned host-only with h200-x1 (kernel v5's rates). Predicted before (2026-12-06,
# `slidedp tune --model qwen3-14b --seq 4096 --batch B --hardware h200-x1 --no-gpu-state --state bf16+int8`, then
# `slidedp simulate` of that policy): batch 16 14.125 s/step (compute-bound), batch 1 2.125 s (cpu); batch 4 4.320 s
# (measured 8.096 s on 2026-12-06 with kernel v4 and h100-sxm-x1's policy). GPU peak predicted 33.8 GiB at batch 16,
# 57.9 at batch 1; host 108.0 and 83.0 GiB. Carry .whl.
# Run: bash benchmarks/results/next-h200/call7.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c7_env.txt 2>&1
O=/tmp/c7; mkdir -p $O
timeout $(left 570) python3 -m benchmarks.compact_state big --hardware h200-x1 --batches 16 1 --steps 3 \
  --states bf16+int8 --out $O/big > $OUT/c7_big.log 2>&1
cp $O/big/results.jsonl $OUT/c7_big.jsonl 2>/dev/null
pack_runs c7_runs.tgz $O
