# Device call for #14 (nineteenth session), run right after call47 on the same machine. Written 2026-12-07 16:52 UTC
# on the development machine, before the call.
# The tied Qwen3-4B (seq 4096) as the single-GPU GPU-resident peer (batch 1 2 4 8) and as DeepSpeed ZeRO-3-Offload
# (batch 1 2 4, phases): both trained it untied before the materialise_ fix, so their Qwen3-4B rows have never been
# predicted against the model the simulator is told about. Predictions are written to predictions.json by
# benchmarks.peer_validation before the runs; the same host rule as call47 (c45's profile only on c45's host).
# Question for ZeRO-3: c45's optimizer phase was over-predicted (1.1 s measured, about 1.39 s modelled) on a 3 B
# and a 1.6 B model; does the same hold at 4 B?
# Carry .whl. Run: bash benchmarks/results/next-h200/call48.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c48_env.txt 2>&1
HOST=(--calibrate none --base benchmarks/results/h100-2026-12-07f/c45/mistral-w12/profile.yaml)
{ nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && lscpu | grep -qE "^Model:\s+207$"; } || {
  BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
  HOST=(--calibrate host --base $BASE); }
echo "host: ${HOST[*]}" >> $OUT/c48_env.txt
V="python3 -m benchmarks.peer_validation --steps 4 --no-contention"
timeout $(left 200) $V --out $OUT/c48/resident "${HOST[@]}" --systems resident --batches 1 2 4 8 \
  --deadline 150 --timeout 150 > $OUT/c48_resident.log 2>&1
timeout $(left 570) $V --out $OUT/c48/zero3 --calibrate none --base $OUT/c48/resident/profile.yaml \
  --systems deepspeed-zero3-offload --batches 1 2 4 --phases --deadline 300 --timeout 300 > $OUT/c48_zero3.log 2>&1
rm -rf $OUT/c48/*/peers
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c48_env.txt
