# Device call (about 2 min, timeout 300): #14's contention experiments held out with the copies' slowdown curve
# and the pass's interference curve (host.copy_slowdown, host.dma_interference_curve), both fitted by
# `--calibrate-first` from the pass and both copies at 16, 12, 8, 4 and 2 threads on this host; the predictions
# of thread counts 14, 9, 7 and 3 (none in that grid; 3 was c34's, with the rule before) are written before they are measured. c33 (the rule
# before: copies slowed only where DRAM is full) had 15 of 22 within 10%, its copies beside 5-11 threads 19-36%
# fast. Prediction written before: every experiment within 10%.
# Carry .whl. Run: bash benchmarks/results/next-h200/call34.sh
OUT=$OUT C=c35 bash benchmarks/results/next-h200/call25.sh 14 9 7 3
