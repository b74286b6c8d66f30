# A cut of call51 for this session's last 367 s of device time (written 2026-12-07 17:48 UTC, before the call; committed fc1ad1b):
# ZeRO-2-Offload `--batches 1 4 1` and GPU-resident `--batches 1 2 1` on the tied Qwen3-4B, predicted from call49's
# host calibration A (an H100 host of the same model; the question is the two batch-1 rows, not the host).
# Hypothesis (call51's): each system's second batch-1 row is within 5% of its prediction while the first misses as
# in c49 (ZeRO-2 +11.5%, resident +12.2%); refuted if the two batch-1 rows of a system differ by less than 3%.
# Carry .whl. Run: bash benchmarks/results/next-h200/call52.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "^Model:"; } > $OUT/c52_env.txt 2>&1
V="python3 -m benchmarks.peer_validation --steps 3 --no-contention --phases --calibrate none"
V="$V --base benchmarks/results/h100-2026-12-07h/c49/host_a.yaml"
timeout $(left 150) $V --out $OUT/c52/zero2 --systems deepspeed-offload --batches 1 4 1 --deadline 140 --timeout 140 \
  > $OUT/c52_zero2.log 2>&1
timeout $(left 205) $V --out $OUT/c52/resident --systems resident --batches 1 2 1 --deadline 50 --timeout 50 \
  > $OUT/c52_resident.log 2>&1
rm -rf $OUT/c52/*/peers
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c52_env.txt
