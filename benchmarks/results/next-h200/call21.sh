# Device call for #19 after c17 (2026-12-06, sixth session): c17's 557,056- and 524,288-token runs went out of
# memory under the 76 GiB cap though the memory model put their allocated peaks at 73.5 and 71.8 GiB. So the
# measured peak of c17's first policy (offload, prefetch 1, 8 chunks, sequence tile 4,096) is taken at two
# lengths, 131,072 and 262,144 tokens, and the line through them picks the longest multiple of 32,768 tokens
# whose measured-line peak stays <= 73.5 GiB allocated (2.5 GiB under the cap for the allocator's slack, capped
# at c17's failed 557,056 - 32,768); that length then runs one step under the same hard 76 GiB cap.
# First, benchmarks.layer_memory_probe measures one layer's working set per token. Carry .whl. Run: bash benchmarks/results/next-h200/call21.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT; D=benchmarks/results/next-h200; O=/tmp/c21; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c21_env.txt 2>&1
{ lscpu | grep -E "Model name|Model:"; free -g; } > $OUT/c21_host.txt 2>&1
run() {  # seq, steps
  timeout $(left 590) python3 -m slidedp.cli train --model $D/qwen3-14b-wide-8l.json --data synthetic --seq $1 \
    --policy $D/c21-tile4096.yaml --steps $2 --nproc 1 --hardware h200-x1 --device auto --no-checkpoint \
    --out $O/s$1 --gpu-budget 76.0 > $OUT/c21_s$1.log 2>&1; echo "seq $1 exit $? at $(( $(date +%s) - T0 )) s" >> $OUT/c21_runs.txt
  cp $O/s$1/summary.json $OUT/c21_s$1_summary.json 2>/dev/null; cp $O/s$1/metrics.csv $OUT/c21_s$1_metrics.csv 2>/dev/null
}
# One layer's measured working set against the memory model's, per token (seconds): the 14B-wide layer with the
# allocator history of its first (tiled) case, then Qwen3-4B's layer, which no run of this call uses.
timeout $(left 120) python3 -m benchmarks.layer_memory_probe --model $D/qwen3-14b-wide-8l.json --seqs 32768 65536 131072 \
  --tiles 4096 0 --snapshot --out $OUT/probe14 > $OUT/c21_probe14.log 2>&1
timeout $(left 150) python3 -m benchmarks.layer_memory_probe --model qwen3-4b --seqs 32768 65536 131072 \
  --tiles 4096 0 --out $OUT/probe4 > $OUT/c21_probe4.log 2>&1
run 131072 1
run 262144 1
S=$(python3 - <<'PY'
import json, os
p = {s: json.load(open(f"{os.environ['OUT']}/c21_s{s}_summary.json"))["gpu_peak_gib"] for s in (131072, 262144)}
b = (p[262144] - p[131072]) / 131072; a = p[131072] - b * 131072
s = min(int((73.5 - a) / b) // 32768 * 32768, 557056 - 32768)
print(s if s > 262144 else 0)
PY
)
echo "line-picked seq: $S" >> $OUT/c21_runs.txt
[ "${S:-0}" -gt 0 ] && run $S 1
pack_runs c21_runs.tgz $O
