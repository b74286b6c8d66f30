# Device call (about 4 min, timeout 420): after c40 (20 of 22; the misses the pass beside both copies at 6 and 3
# threads, factors 1.83 / 1.95 against the grid's 1.39-1.47 on the same machine), (1) how that factor spreads run
# to run and whether the copy thread's spinning wait takes cores from the pass (`benchmarks.contention_spread`:
# six rounds of the pass alone / beside spinning copies / beside copies on a blocking event at 16 8 6 4 3 2
# threads, with the scheduler's per-thread counters), then (2) the blind contention call once more on the same
# fresh machine at 14 10 7 5 threads.
# Predictions written before (2026-12-07, twenty-second session):
# - (1) the factor at 3-6 threads has two modes (about 1.4 and 1.8-2.0) in the six rounds, not one value with
#   5% noise; the pass's run-queue waits stay under 1 ms a sample (16 vCPUs for at most 7 busy threads), so the
#   slow mode is not the copy thread taking a core; blocking copies show the same factors as spinning ones.
# - (2) the copies within 10% at every thread count; the pass alone within 10%; the pass beside both copies
#   within 10% unless the slow mode of (1) shows in the held-out medians.
# Carry .whl. Run: bash benchmarks/results/next-h200/call41.sh
source benchmarks/results/h200-2026-12-04/setup.sh
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:"; } > $OUT/c41_host.txt 2>&1
timeout $(left 170) python3 -m benchmarks.contention_spread --out /tmp/c41/spread --rounds 6 > $OUT/c41_spread.log 2>&1
cp /tmp/c41/spread/samples.jsonl $OUT/c41_samples.jsonl 2>/dev/null
OUT=$OUT C=c41 bash benchmarks/results/next-h200/call25.sh 14 10 7 5
