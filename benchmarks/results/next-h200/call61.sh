# Device call for #14 (twenty-first session), written 2026-12-07 21:25 UTC before it ran; predictions in
# benchmarks/RESULTS.md ("Predictions for call61"). On an H100 (the H200 kinds were refused all session).
# 1. resident_kernels at batch 1: one-call, plain queued and the new Timer's seconds side by side.
# 2. A full `slidedp calibrate` with the new Timer, the card's preset as --base.
# 3. GPU-resident Qwen3-4B batch 4, 2, 1 predicted from (2) (predictions.json before the runs).
# Run: bash benchmarks/results/next-h200/call61.sh   (carry .whl)
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
mkdir -p $OUT/c61
{ nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "^Model:"; } > $OUT/c61_env.txt 2>&1
timeout 90 python3 -m benchmarks.resident_kernels --model qwen3-4b --batches 1 --out $OUT/c61/kernels.jsonl \
  > $OUT/c61/kernels_log.txt 2>&1
echo "kernels done at $(( $(date +%s) - T0 )) s" >> $OUT/c61_env.txt
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
timeout $(left 330) python3 -m slidedp.cli calibrate --base $BASE --out $OUT/c61/full.yaml > $OUT/c61_full.log 2>&1
echo "calibrate done at $(( $(date +%s) - T0 )) s" >> $OUT/c61_env.txt
timeout $(left 420) python3 -m benchmarks.peer_validation --out $OUT/c61/peers --calibrate none \
  --base $OUT/c61/full.yaml --systems resident --batches 4 2 1 --steps 4 --no-contention --phases \
  --deadline 200 --timeout 200 > $OUT/c61_peers.log 2>&1
rm -rf $OUT/c61/peers/peers
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c61_env.txt
