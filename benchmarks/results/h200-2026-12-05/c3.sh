# 2026-12-05 call 3 (#16): Qwen3-14B (40 layers) in bf16+int8 at batch 4 and 16 (predicted before: 8.557 and
# 16.42 s/step), then the update rates with the faster compact kernel at 8 and 16 threads.
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
O=/tmp/c3; mkdir -p $O
B=${BUDGET:-480}
timeout $(left $((B - 90))) python3 -m benchmarks.compact_state big --batches 4 16 --steps 3 --out $O/big \
  > $OUT/c3_big.log 2>&1
cp $O/big/results.jsonl $OUT/c3_big.jsonl 2>/dev/null
timeout $(left $((B - 5))) python3 -m benchmarks.compact_state rates --threads 16 8 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 fp32+int8 fp32+bf16 bf16+bf16 --out $O/rates > $OUT/c3_rates.log 2>&1
cp $O/rates/results.jsonl $OUT/c3_rates.jsonl 2>/dev/null
pack_runs c3_runs.tgz $O
