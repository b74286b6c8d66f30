# 2026-12-05 call 3 (#16), what the session's device time leaves (about 4 minutes): the update rates with the
# compact kernel made faster after 2026-12-04 (1.45-1.7x per thread on the development machine), at 16 and 8
# threads, 64M parameters per pass. Qwen3-14B batch 4/16 (benchmarks/results/next-h200/call3.sh) waits.
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
O=/tmp/c3; mkdir -p $O
B=${BUDGET:-200}
lscpu > $OUT/c3_lscpu.txt 2>&1
timeout $(left $((B - 5))) python3 -m benchmarks.compact_state rates --threads 16 8 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 fp32+int8 fp32+bf16 bf16+bf16 --out $O/rates > $OUT/c3_rates.log 2>&1
cp $O/rates/results.jsonl $OUT/c3_rates.jsonl 2>/dev/null
