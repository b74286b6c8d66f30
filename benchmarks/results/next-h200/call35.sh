# Device call (about 3 min, timeout 400): #14's contention held out once more after c35 (18 of 22 re-predicted,
# not blind). Changes since c35: the curves are keyed by the profile's pass traffic at each grid thread count
# (c35's keys came from the timed 2**28-parameter pass, 6-10% slower than the 64M-parameter rates the simulator
# prices a pass with, so a 9-thread pass found the 12-thread point) and the grid takes five repeats. Held out:
# thread counts 13, 10, 6 and 5 (none in the grid 16/12/8/4/2). Then the AdamW rate at 16M, 64M and 2**28
# parameters, 16 and 8 threads: whether the pass-alone misses are the pass's size.
# Prediction written before: the copies within 10% at every thread count; the pass alone and with copies within
# 10% only where this host's 2**28 pass keeps to the 64M curve (c35: -5% to -11% alone).
# Carry .whl. Run: bash benchmarks/results/next-h200/call35.sh
OUT=$OUT C=c36 bash benchmarks/results/next-h200/call25.sh 13 10 6 5
source benchmarks/results/h200-2026-12-04/setup.sh
for P in 16000000 64000000 268435456; do
  timeout $(left 120) python3 -m benchmarks.compact_state rates --threads 16 8 --params $P --repeats 5 --states fp32 \
    --out /tmp/c36r$P > $OUT/c36_rates_$P.log 2>&1
done
