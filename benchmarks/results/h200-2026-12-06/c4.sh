# 2026-12-06 call 4: #18's SIGINT / killed-CUDA-rank test again, fixed after c2: it waited for the shared state to
# appear in /dev/shm, but rank 0 removes the names as soon as every rank has mapped the pages (a fraction of a
# second), so on the H100 it never saw them and the run of 500 steps ended first (c2: 1 failed in 94.5 s). Now it
# waits for the first logged step, as the CPU test does. Then #16's Qwen3-14B (40 layers) in bf16+int8 at batch
# 4 and 16, tuned host-only for this card (--hardware h100-sxm-x1): predicted before by `slidedp tune` on the
# development machine 4.181 and 15.71 s/step, GPU peak 18.5 and 32.0 GiB, host 89.2 and 108.0 GiB; that preset
# plans 56 / 112 optimizer threads, which the trainer caps at this host's 16 cores, so the CPU update will be
# slower than planned (the 2026-12-04 plan for the H200 host at 16 threads: 8.557 and 16.42 s/step). Carry .whl.
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c4_env.txt 2>&1
timeout $(left 200) python3 -m pytest -m gpu -v -rA -p no:cacheprovider --durations=0 \
  tests/runtime/test_gpu_ranks.py -k sigint > $OUT/c4_sigint.log 2>&1
ls -la /dev/shm >> $OUT/c4_sigint.log 2>&1
O=/tmp/c4; mkdir -p $O
timeout $(left 470) python3 -m benchmarks.compact_state big --hardware h100-sxm-x1 --batches 4 16 --steps 3 \
  --out $O/big > $OUT/c4_big.log 2>&1
cp $O/big/results.jsonl $OUT/c4_big.jsonl 2>/dev/null
pack_runs c4_runs.tgz $O
