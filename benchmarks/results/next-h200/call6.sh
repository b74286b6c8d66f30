# Next device session (any one GPU, about 8 min): #18's last GPU cases and #16's compact step with its traces.
# 1. Three ranks sharing the GPU for the three route pairs not yet run with 3 ranks, and GPU-held units with the
#    replicated/per_rank pair (tests/runtime/test_gpu_ranks.py; 2026-12-06 ran the other nine cases green).
# 2. Qwen3-4B host-only at batch 1 in bf16+int8 and fp32 with the runs packed (their folder names hold a "+",
#    which the device transfer leaves out): the compact update's time inside a step, against the simulator's
#    0.688 s (v5 rates; measured 0.897 s on 2026-12-06).
# Carry .whl. Run: bash benchmarks/results/next-h200/call6.sh
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c6_env.txt 2>&1
timeout $(left 330) python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/runtime/test_gpu_ranks.py \
  -k "3-replicated or 3-sharded-per_rank or replicated-per_rank-next_forward-2" > $OUT/c6_ranks.log 2>&1
O=/tmp/c6; mkdir -p $O
timeout $(left 560) python3 -m benchmarks.compact_state steps --states bf16+int8 fp32 --batches 1 --hardware h200-x1 \
  --out $O/st > $OUT/c6_steps.log 2>&1
cp $O/st/results.jsonl $OUT/c6_steps.jsonl 2>/dev/null
pack_runs c6_runs.tgz $O
