# Device call (about 4 min, timeout 300): #14's contention experiments held out once more, now with kernel v8
# (v7's dynamic schedule: threads claim 65,536-element runs). c25 (kernel v6) predicted 20 of 22 within 10%; its
# two misses were the pass alone and with both copies at 10 threads (-17%, -19%: the thread curve, not the
# contention model). `--calibrate-first` calibrates this host first, writes the predictions, then measures thread
# counts 15, 11, 5 (never used) and 10 (c25's miss). Prediction written before: every experiment within 10%,
# the 10-thread pass alone included (a static schedule waits for the slowest vCPU; a dynamic one does not).
# Carry .whl. Run: bash benchmarks/results/next-h200/call33.sh
source benchmarks/results/h200-2026-12-04/setup.sh
O=/tmp/c33; mkdir -p $O
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:"; } > $OUT/c33_host.txt 2>&1
timeout $(left 290) python3 -m benchmarks.contention --out $O/ct --calibrate-first --threads 15 11 10 5 --repeats 3 \
  > $OUT/c33_ct.log 2>&1
pack_runs c33.tgz $O
