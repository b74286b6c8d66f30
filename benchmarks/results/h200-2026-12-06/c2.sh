# 2026-12-06 call 2: #18's SIGINT / killed-CUDA-rank cleanup test alone (cut by the limit twice on 2026-12-05;
# 300 s here, each 2-rank CUDA launch takes tens of seconds), then #16's update rates with the faster compact
# kernel (expected before, RESULTS 2026-12-05: fp32 ~4.56, bf16+int8 4.4-5.2, fp32+int8 5.8-6.5 G params/s at 16
# threads). Carry .whl. Run: bash benchmarks/results/h200-2026-12-06/c2.sh
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c2_env.txt 2>&1
timeout $(left 320) python3 -m pytest -m gpu -v -rA -p no:cacheprovider --durations=0 \
  tests/runtime/test_gpu_ranks.py -k sigint > $OUT/c2_sigint.log 2>&1
ls -la /dev/shm >> $OUT/c2_sigint.log 2>&1
O=/tmp/c2; mkdir -p $O
timeout $(left 560) python3 -m benchmarks.compact_state rates --threads 16 8 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 fp32+int8 fp32+bf16 bf16+bf16 --out $O/rates > $OUT/c2_rates.log 2>&1
cp $O/rates/results.jsonl $OUT/c2_rates.jsonl 2>/dev/null
