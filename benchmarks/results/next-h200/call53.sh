# Device call for #14 (twentieth session), written 2026-12-07 19:05 UTC on the development machine, before the call.
# #14's peer target is on the H200: ZeRO-2-Offload, FSDP2-offload and GPU-resident within 10% for Qwen3-4B, seq 4096,
# batch 1-8. The H200 rows so far were predicted from the shipped h200-x1 host rates (peer_predictions: FSDP2-offload
# MAPE 13.8%, ZeRO-2 10.3%), and the H100 sessions showed the host calibration explains most of the offload peers'
# misses (c49: with a calibration taken in the call, batch 4 and 8 within 6.4%).
# 1. `slidedp calibrate --host-only --base h200-x1` (three interleaved rounds; warnings say what stays unsettled).
# 2. ZeRO-2-Offload, the tied Qwen3-4B, batch 1 2 4 8, phases, predicted from 1 (predictions.json before the runs).
# Hypothesis: every ZeRO-2 row within 10%; refuted if any row is off by more than 10% while the calibration warned of
# nothing. Needs an H200 (run with needs_h200). Carry .whl. Run: bash benchmarks/results/next-h200/call53.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c53_env.txt 2>&1
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
mkdir -p $OUT/c53
timeout $(left 280) python3 -m slidedp.cli calibrate --host-only --base $BASE --out $OUT/c53/host.yaml \
  > $OUT/c53_host.log 2>&1
echo "host done at $(( $(date +%s) - T0 )) s" >> $OUT/c53_env.txt
timeout $(left 570) python3 -m benchmarks.peer_validation --out $OUT/c53/zero2 --calibrate none \
  --base $OUT/c53/host.yaml --systems deepspeed-offload --batches 1 2 4 8 --steps 3 --no-contention --phases \
  --deadline 280 --timeout 280 > $OUT/c53_zero2.log 2>&1
rm -rf $OUT/c53/zero2/peers
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c53_env.txt
