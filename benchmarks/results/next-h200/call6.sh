# Next device session (any one GPU, about 8 min): #18's last GPU cases and #16's compact step with its traces.
# 1. Three ranks sharing the GPU for the three route pairs not yet run with 3 ranks, and GPU-held units with the
#    replicated/per_rank pair (tests/runtime/test_gpu_ranks.py; 2026-12-06 ran the other nine cases green).
# 2. Qwen3-4B host-only at batch 1 in bf16+int8 and fp32 with the runs packed (their folder names hold a "+",
#    which the device transfer leaves out): the compact update's time inside a step, against the simulator's
#    0.688 s (v5 rates; measured 0.897 s on 2026-12-06).
# 3. Kernel v6's exact (fp32) update rate at 16 and 8 threads over pages placed as the runtime places them, and
#    over pages touched by one thread (v5's simple loop, one-thread placement: 4.255 / 4.935 G params/s on
#    2026-12-06; v5 inside steps: ~5.15; expected with v6: 5.5-7.3 at 16 threads, RESULTS "Kernel v6").
# Carry .whl. Run: bash benchmarks/results/next-h200/call6.sh
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c6_env.txt 2>&1
timeout $(left 330) python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/runtime/test_gpu_ranks.py \
  -k "3-replicated or 3-sharded-per_rank or replicated-per_rank-next_forward-2" > $OUT/c6_ranks.log 2>&1
O=/tmp/c6; mkdir -p $O
timeout $(left 520) python3 -m benchmarks.compact_state steps --states bf16+int8 fp32 --batches 1 --hardware h200-x1 \
  --out $O/st > $OUT/c6_steps.log 2>&1
cp $O/st/results.jsonl $OUT/c6_steps.jsonl 2>/dev/null
pack_runs c6_runs.tgz $O
lscpu > $OUT/c6_lscpu.txt 2>&1; numactl -H >> $OUT/c6_lscpu.txt 2>&1   # the memory nodes, if any
timeout $(left 575) python3 -m benchmarks.compact_state rates --threads 16 8 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 --out $O/rates > $OUT/c6_rates.log 2>&1
timeout $(left 595) python3 -m benchmarks.compact_state rates --threads 16 8 --params 64000000 --repeats 3 \
  --states fp32 --first-touch serial --out $O/rates > $OUT/c6_rates_serial.log 2>&1
