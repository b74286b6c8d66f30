# Device call (about 7 min, an H100 machine; call20 may follow on the same warm machine and reads
# runs/host-profile.yaml): this host's CPU rates, the GPU test of a tiled layer's working set (#19, not yet run on a
# GPU), which vCPUs share a physical core (benchmarks/cpu_siblings.py), the update rates at 8 threads placed one per
# core against the scheduler's placement, and the held-out contention experiments (#14: 17 of 22 within 10% on
# 2026-12-03; the misses were the pass at 6 and 8 threads). Hypothesis written before: the 16 vCPUs are 8 cores x 2
# hyperthreads, so (a) the compact update, bound by the vector ports (RESULTS "Why the compact update is not faster"),
# runs about as fast at 8 threads one per core as at 16, and (b) 8 threads left to the scheduler run slower and less
# steadily than 8 threads one per core.
# Carry .whl. Run: bash benchmarks/results/next-h200/call23.sh
source benchmarks/results/h200-2026-12-04/setup.sh
O=/tmp/c23; mkdir -p $O runs
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu; free -g; } > $OUT/c23_host.txt 2>&1
timeout $(left 130) python3 -m slidedp.cli calibrate --host-only --base h200-x1 \
  --out runs/host-profile.yaml > $OUT/c23_calibrate.log 2>&1 && cp runs/host-profile.yaml $O/
timeout $(left 230) python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/runtime/test_gpu_layer_memory.py \
  > $OUT/c23_gputest.log 2>&1
timeout $(left 260) python3 -m benchmarks.cpu_siblings --out $O/sib --probe 0 1 > $OUT/c23_siblings.log 2>&1
PLACES=$(python3 -c "import json; l = json.load(open('$O/sib/siblings.json'))['one_per_core']; \
print(','.join('{%d}' % c for c in l) if l else '')" 2>/dev/null)
echo "one per core: $PLACES" >> $OUT/c23_siblings.log
for run in 1 2; do
  timeout $(left 320) python3 -m benchmarks.compact_state rates --threads 8 16 --params 64000000 --repeats 3 \
    --states fp32 bf16+int8 --out $O/rates_free$run >> $OUT/c23_rates.log 2>&1
  [ -n "$PLACES" ] && OMP_PLACES="$PLACES" OMP_PROC_BIND=close timeout $(left 350) python3 -m benchmarks.compact_state \
    rates --threads 8 --params 64000000 --repeats 3 --states fp32 bf16+int8 --out $O/rates_core$run \
    | sed 's/^/one-per-core /' >> $OUT/c23_rates.log 2>&1
done
timeout $(left 470) python3 -m benchmarks.contention --out $O/ct --calibrate-first --threads 12 8 6 2 --repeats 3 \
  > $OUT/c23_ct.log 2>&1
[ -n "$PLACES" ] && OMP_PLACES="$PLACES" OMP_PROC_BIND=close timeout $(left 560) python3 -m benchmarks.contention \
  --out $O/ct_core --profile $O/ct/profile.yaml --threads 8 6 2 --repeats 3 2>&1 | sed 's/^/one-per-core /' >> $OUT/c23_ct.log
pack_runs c23.tgz $O
