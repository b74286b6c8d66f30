# Device call for #14 (nineteenth session): is the host calibration repeatable, and does ZeRO-2-Offload's model
# hold with a calibration taken in the same call? Written 2026-12-07 16:59 UTC on the development machine, before
# the call, after c47/c48 (benchmarks/RESULTS.md, "Nineteenth session"): three host calibrations of one H100 host
# model differed by up to 59% (stream) and 44% (DeepSpeedCPUAdam); with c42a's the ZeRO-2/3 rows were within 10%
# (11 of 12), with c45's 2-21% slow.
# The host benchmarks now time in three interleaved rounds (calibration.host_bench.timed_rounds), re-time
# unsettled points, and warn when a rate dips or spreads (calibration.rate_checks); the peers' optimizer curves
# re-time a dip once.
# 1. A: `slidedp calibrate --host-only --base h100-sxm-x1` (new code): its rates, spreads and warnings.
# 2. ZeRO-2-Offload, the tied Qwen3-4B, batch 1 4 8, phases, predicted from A (predictions.json before the runs).
#    Hypothesis: within 10% in every row, as c42a's profile gives (2.623 / 3.843 / 5.469 s against c47's 2.537 /
#    3.616 / 5.266). Refuted if any row is off by more than 10% while A reported no warning.
# 3. B: the host passes alone again (host_benchmarks, full size) after the runs: stream / cast / AdamW within 15%
#    of A's at every thread count unless a warning says why.
# 4. (added 17:04 UTC, before the call) GPU-resident, the tied Qwen3-4B, batch 1 2 4, phases: where its step's
#    fixed part goes. Its batch-1 rows are over-predicted on both cards (H100 c48 +16.4%, H200 +5.2%) while the
#    per-batch slope is right on the H100 (0.407 s predicted, 0.415 measured): the modelled intercept (0.217 s on
#    the H100, of which the GPU AdamW at the preset's derived 50 G params/s is 80 ms) is about 0.1 s high.
# Carry .whl. Run: bash benchmarks/results/next-h200/call49.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c49_env.txt 2>&1
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
mkdir -p $OUT/c49
timeout $(left 260) python3 -m slidedp.cli calibrate --host-only --base $BASE --out $OUT/c49/host_a.yaml \
  > $OUT/c49_host_a.log 2>&1
echo "A done at $(( $(date +%s) - T0 )) s" >> $OUT/c49_env.txt
timeout $(left 450) python3 -m benchmarks.peer_validation --out $OUT/c49/zero2 --calibrate none \
  --base $OUT/c49/host_a.yaml --systems deepspeed-offload --batches 1 4 8 --steps 3 --no-contention --phases \
  --deadline 170 --timeout 170 > $OUT/c49_zero2.log 2>&1
rm -rf $OUT/c49/zero2/peers
timeout $(left 470) python3 -m benchmarks.peer_validation --out $OUT/c49/resident --calibrate none \
  --base $OUT/c49/host_a.yaml --systems resident --batches 1 2 4 --steps 4 --no-contention --phases \
  --deadline 80 --timeout 80 > $OUT/c49_resident.log 2>&1
rm -rf $OUT/c49/resident/peers
echo "runs done at $(( $(date +%s) - T0 )) s" >> $OUT/c49_env.txt
timeout $(left 580) python3 -c "
import json
from slidedp.calibration.host_bench import host_benchmarks
m = host_benchmarks(False)
print(json.dumps({'stream_gbps': m.stream_gbps, 'cast_gelems_per_s': m.cast_gelems_per_s,
                  'adam_gparams_per_s': m.adam_gparams_per_s, 'spread': m.report['host_round_spread_pct'],
                  'warnings': m.report.get('warnings', [])}))" > $OUT/c49/host_b.json 2> $OUT/c49_host_b.log
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c49_env.txt
