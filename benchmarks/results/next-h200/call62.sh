# Device call for #14 (twenty-second session), written 2026-12-07 22:58 UTC before it ran; predictions in
# benchmarks/RESULTS.md ("Predictions for call62"), made from call61's profile before this call.
# Two model shapes no calibration or earlier validation used (configs/: a Llama-3.2-1B shape, head_dim 64, no q/k
# norms; a Qwen2.5-1.5B shape, q/k/v biases, 2 KV heads), random-init:
# 1. GPU-resident (autocast over fp32 weights) at batch 8, 4, 1, each model;
# 2. FSDP2-offload on the Llama shape at batch 1 and 4 (what time is left).
# Run: bash benchmarks/results/next-h200/call62.sh PROFILE   (carry .whl; PROFILE: call61's full.yaml)
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
PROFILE=${1:?profile}
C=benchmarks/results/next-h200/configs
{ nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "^Model:"; } > $OUT/c62_env.txt 2>&1
for m in llama-3.2-1b qwen2.5-1.5b; do
  timeout $(left 200) python3 -m benchmarks.peer_validation --out $OUT/c62/$m --calibrate none --base $PROFILE \
    --model $C/$m.json --systems resident --batches 8 4 1 --steps 4 --no-contention --phases \
    --deadline 90 --timeout 90 > $OUT/c62_$m.log 2>&1
  echo "$m resident done at $(( $(date +%s) - T0 )) s" >> $OUT/c62_env.txt
done
timeout $(left 420) python3 -m benchmarks.peer_validation --out $OUT/c62/llama-fsdp2 --calibrate none --base $PROFILE \
  --model $C/llama-3.2-1b.json --systems fsdp2-offload --batches 1 4 --steps 4 --no-contention --phases \
  --deadline 200 --timeout 200 > $OUT/c62_fsdp2.log 2>&1
find $OUT/c62 -name peers -type d -prune -exec rm -rf {} +
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c62_env.txt
