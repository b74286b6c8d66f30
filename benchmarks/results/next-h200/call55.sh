# Device call for #14 (twentieth session), right after call54 on the same H200 (written 2026-12-07 19:25 UTC, before
# it). call54: GPU-resident Qwen3-4B from the shipped h200-x1 GPU rates: +4.4 / -3.2 / -13.1 / -8.8% at batch 1/2/4/8;
# the per-sample slope is predicted 0.346 s against 0.389 measured, while on the H100 preset it was right (0.407 vs
# 0.415). Question: are the shipped H200 GPU rates stale? A full `slidedp calibrate --base h200-x1` (the shape grid,
# not the target model), then GPU-resident batch 1 4 8 predicted from it (predictions.json before the runs).
# Hypothesis: with the fresh profile every resident row is within 10%; refuted if batch 8 is still under-predicted by
# more than 8%. Needs an H200 (needs_h200). Carry .whl. Run: bash benchmarks/results/next-h200/call55.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
mkdir -p $OUT/c55
{ nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "^Model:"; } > $OUT/c55_env.txt 2>&1
timeout $(left 420) python3 -m slidedp.cli calibrate --base h200-x1 --out $OUT/c55/full.yaml > $OUT/c55_cal.log 2>&1
echo "calibrated at $(( $(date +%s) - T0 )) s" >> $OUT/c55_env.txt
timeout $(left 580) python3 -m benchmarks.peer_validation --out $OUT/c55/resident --calibrate none \
  --base $OUT/c55/full.yaml --systems resident --batches 1 4 8 --steps 3 --no-contention --phases \
  --deadline 150 --timeout 150 > $OUT/c55_resident.log 2>&1
rm -rf $OUT/c55/resident/peers $OUT/c55/resident/profile.yaml
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c55_env.txt
