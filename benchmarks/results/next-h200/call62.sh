# Device call for #14 (twenty-second session), written 2026-12-07 23:18 UTC before it ran; predictions in
# benchmarks/RESULTS.md ("Predictions for call62"), made from the shipped preset of the card (h100-sxm-x1: the
# H100's measured curves since this session; h200-x1 on an H200) before this call.
# Two model shapes no calibration or earlier validation used (configs/: a Llama-3.2-1B shape, head_dim 64, no q/k
# norms; a Qwen2.5-1.5B shape, q/k/v biases, 2 KV heads), random-init, GPU-resident (autocast over fp32 weights)
# at batch 8, 4, 1 each.
# Run: bash benchmarks/results/next-h200/call62.sh   (carry .whl)
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
C=benchmarks/results/next-h200/configs
{ nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "^Model:"; echo "base $BASE"; } > $OUT/c62_env.txt 2>&1
for m in llama-3.2-1b qwen2.5-1.5b; do
  timeout $(left 240) python3 -m benchmarks.peer_validation --out $OUT/c62/$m --calibrate none --base $BASE \
    --model $C/$m.json --systems resident --batches 8 4 1 --steps 4 --no-contention --phases \
    --deadline 110 --timeout 110 > $OUT/c62_$m.log 2>&1
  echo "$m resident done at $(( $(date +%s) - T0 )) s" >> $OUT/c62_env.txt
done
find $OUT/c62 -name peers -type d -prune -exec rm -rf {} +
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c62_env.txt
