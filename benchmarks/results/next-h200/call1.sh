# Next H200 session, call 1 (about 9 min): #19's whole-GPU part at 512K tokens (predicted before: 197.9 s/step,
# GPU peak 134.3 GiB, 2,650 tokens/s; RESULTS "Next H200 session") and the 80 GiB plan again now that slidedp
# train asks for expandable segments (predicted 56.6 s/step, peak 79.8 GiB); then #18's remaining GPU tests.
# Carry: .whl (simpy, datasets 5.2.0, dill, multiprocess). Run: bash benchmarks/results/next-h200/call1.sh
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv > $OUT/c1_env.txt 2>&1
lscpu >> $OUT/c1_env.txt 2>&1
timeout $(left 330) python3 -m benchmarks.long_seq_tiled --layers 8 --parts whole --max-seq 524288 --steps 1 \
  --deadline 60 --out $OUT/whole > $OUT/c1_whole.log 2>&1
timeout $(left 480) python3 -m benchmarks.long_seq_tiled --layers 8 --parts cap --steps 2 --deadline 60 \
  --out $OUT/cap > $OUT/c1_cap.log 2>&1
timeout $(left 585) python3 -m pytest -m gpu -q -x tests/runtime/test_gpu_ranks.py tests/runtime/test_gpu_engine.py \
  > $OUT/c1_gpu_tests.log 2>&1
pack_runs c1_runs.tgz $OUT
