# Device call for #14 (nineteenth session), right after call49 on the same machine (written 17:20 UTC, before it):
# FSDP2 + CPUOffloadPolicy, Qwen3-4B, batch 1 4 8, predicted from call49's host calibration A (predictions.json
# before the runs). #14's target: within 10%.
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
timeout $(left 280) python3 -m benchmarks.peer_validation --out $OUT/c50 --calibrate none \
  --base benchmarks/results/h100-2026-12-07h/c49/host_a.yaml --systems fsdp2-offload --batches 1 4 8 --steps 3 \
  --no-contention --phases --deadline 240 --timeout 240 > $OUT/c50.log 2>&1
rm -rf $OUT/c50/peers
echo "done at $(( $(date +%s) - T0 )) s" > $OUT/c50_env.txt
