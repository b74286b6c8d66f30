# 2026-12-06 call 1 (#19), on an H200 (needs its 139 GiB): Qwen3-14B-wide x 8 layers at 512K tokens on the whole
# GPU (predicted before, RESULTS "Next H200 session": 197.9 s/step, GPU peak 134.3 GiB), then 256K under the hard
# 80 GiB cap with expandable segments (predicted 56.6 s/step, peak 79.8 GiB). Same as h200-2026-12-05/c1.sh, which
# never ran (no H200 started that day). Carry .whl. Run: bash benchmarks/results/h200-2026-12-06/c1.sh
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
O=/tmp/c1; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv > $OUT/c1_env.txt 2>&1
lscpu | head -20 >> $OUT/c1_env.txt 2>&1
timeout $(left 380) python3 -m benchmarks.long_seq_tiled --layers 8 --parts whole --max-seq 524288 --steps 1 \
  --deadline 150 --out $O/whole > $OUT/c1_whole.log 2>&1
timeout $(left 585) python3 -m benchmarks.long_seq_tiled --layers 8 --parts cap --steps 2 --deadline 150 \
  --out $O/cap > $OUT/c1_cap.log 2>&1
cat $O/whole/results.jsonl $O/cap/results.jsonl > $OUT/c1_results.jsonl 2>/dev/null
pack_runs c1_runs.tgz $O
