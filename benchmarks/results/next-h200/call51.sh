# Device call for #14, written 2026-12-07 18:00 UTC (nineteenth session) for the next session, before any run.
# Question: is each peer's batch-1 miss (c49/c50 on an H100: ZeRO-2 +11.5%, GPU-resident +12.2%, FSDP2-offload
# -11.6%, while batch 4 and 8 were within 6.4%) the first batch of its process? Each run times batch 1 first and
# again last (`--batches 1 4 8 1`; results.jsonl keeps both rows, in order), predicted from a host calibration
# taken first in the same call (predictions.json before the runs).
# Hypothesis: the second batch-1 row of each system is within 5% of its prediction; the first misses as in
# c49/c50. Refuted if the two batch-1 rows of a system differ by less than 3%.
# About 8 min on any H100/H200. Carry .whl. Run: bash benchmarks/results/next-h200/call51.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c51_env.txt 2>&1
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
V="python3 -m benchmarks.peer_validation --steps 3 --no-contention --phases"
timeout $(left 330) $V --out $OUT/c51/zero2 --calibrate host --base $BASE --systems deepspeed-offload \
  --batches 1 4 8 1 --deadline 300 --timeout 300 > $OUT/c51_zero2.log 2>&1
timeout $(left 470) $V --out $OUT/c51/fsdp2 --calibrate none --base $OUT/c51/zero2/profile.yaml \
  --systems fsdp2-offload --batches 1 4 8 1 --deadline 130 --timeout 130 > $OUT/c51_fsdp2.log 2>&1
timeout $(left 560) $V --out $OUT/c51/resident --calibrate none --base $OUT/c51/zero2/profile.yaml \
  --systems resident --batches 1 2 4 1 --deadline 80 --timeout 80 > $OUT/c51_resident.log 2>&1
rm -rf $OUT/c51/*/peers
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c51_env.txt
