# Device call (about 4 min, timeout 300): #14's contention experiments held out once more, now with kernel v8
# (v7's dynamic schedule: threads claim 65,536-element runs). c25 (kernel v6) predicted 20 of 22 within 10%; its
# two misses were the pass alone and with both copies at 10 threads (-17%, -19%: the thread curve, not the
# contention model). `--calibrate-first` calibrates this host first, writes the predictions, then measures thread
# counts 15, 11, 5 (never used) and 10 (c25's miss). Prediction written before: every experiment within 10%,
# the 10-thread pass alone included (a static schedule waits for the slowest vCPU; a dynamic one does not).
# Carry .whl. Run: bash benchmarks/results/next-h200/call33.sh
OUT=$OUT C=c33 bash benchmarks/results/next-h200/call25.sh 15 11 10 5
