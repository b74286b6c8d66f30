# Device call (about 1.5 min, timeout 150): #16's update-rate target on one more fresh machine, fp32+int8 and
# bf16+int8 against exact fp32, twice in a row (c37: 1.83x and 1.55x; c36's calibration: 1.65x and 1.38x).
# Prediction written before: fp32+int8 1.6-1.9x fp32, bf16+int8 1.3-1.6x.
# Carry .whl. Run: bash benchmarks/results/next-h200/call38.sh
source benchmarks/results/h200-2026-12-04/setup.sh
lscpu | grep -E "Model name|Model:" > $OUT/c39_host.txt 2>&1
for i in 1 2; do
  timeout $(left 120) python3 -m benchmarks.compact_state rates --threads 16 --params 64000000 --repeats 3 \
    --states fp32 fp32+int8 bf16+int8 --out /tmp/c39r$i > $OUT/c39_rates_$i.log 2>&1
done
