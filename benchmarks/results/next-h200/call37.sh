# Device call (about 2 min, timeout 240): #14's contention held out a third time with the curves (after c35's
# 18 and c36's 20 of 22), on a fresh machine, at thread counts 15, 11, 7 and 3 (none in the grid 16/12/8/4/2).
# Prediction written before: the copies within 10% at every thread count; the pass alone and with copies within
# 10% where this host's AdamW rate keeps to its calibration (it moved ~10% within minutes on c36's).
# Carry .whl. Run: bash benchmarks/results/next-h200/call37.sh
OUT=$OUT C=c38 bash benchmarks/results/next-h200/call25.sh 15 11 7 3
