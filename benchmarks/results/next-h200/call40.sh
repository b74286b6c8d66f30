# Device call (about 2 min, timeout 240): #14's contention held out with the curves on a fresh machine (after c35's
# 18, c36's 20 and c38's 22 of 22), at thread counts 13, 9, 6 and 3 (none in the grid 16/12/8/4/2). New: the
# all-core pass alone is timed before and after the experiments (benchmarks.contention's closing line), so a miss
# of the pass's own time can be set against how far the host's rate moved meanwhile.
# Prediction written before (2026-12-07, twenty-second session): the copies within 10% at every thread count; the
# pass alone and with copies within 10% where the reference pass keeps within ~5% of the calibration's; on the
# three blind calls the pass alone ran 5% slower than predicted on average (10 of 12 slower), so expect a negative
# bias of that size.
# Carry .whl. Run: bash benchmarks/results/next-h200/call40.sh
OUT=$OUT C=c40 bash benchmarks/results/next-h200/call25.sh 13 9 6 3
