# Device call for #14 after the tied-head fix (benchmarks.peer_setup.materialise_ re-ties; until now the resident
# peer and DeepSpeed trained Qwen3-4B with an untied head: 389 M parameters, 5.8 GiB of fp32 weight, gradient and
# moments more than the model). About 4 min on any H100/H200 (cut to fit the session's last 383 s of device time).
# Written before the call (2026-12-07 15:27 UTC, development machine):
# 1. `benchmarks.gpu_fit_probe`, Qwen3-4B, batch 8 1 4 (in that order), tied. Hypothesis H1 (the untied head is the c42 / c46
#    gap): allocated peaks about 5.8 GiB below c46's untied 66.2 / 66.4 / 68.3 and the H200's 74.2, so about 60.4 /
#    60.6 / 62.5 / 68.4 GiB, and batch 8 now runs on an H100 (needs about 68.4 + 0.33 x 23.4 = 76.1 of 78.4 usable).
#    The memory model as shipped (fp32 checkpoints under autocast, fitted on the untied rows) says 62.8 / 62.8 / 65.5
#    / 74.0: if H1 holds, that rule was compensating the untied head and is too high by about 2-6 GiB.
# 2. ZeRO-2-Offload, Qwen3-4B, batch 1 4 8, tied, with c45's host profile of this session (Xeon model 207, so
#    predictions made before: 2.987 / 3.394 / 4.207 / 5.834 s; predictions.json is written again before the runs);
#    untied, H100 hosts measured 2.44-2.74 / - / 3.68-3.88 / 5.04-5.39 s (c20, c37). Expected: 5-9% faster than
#    those untied rows (the CPU Adam, the copies and the cast over 9.7% fewer parameters).
# Added 15:15 UTC, before the call: the peers' memory model now (bf16 checkpoints again, the fp32 rule having
# matched only untied rows; allocator fragmentation 0.33 x the transient bytes, fitted on c46) gives allocated
# 62.8 / 62.8 / 68.2 GiB at batch 1 / 4 / 8 and a smallest cap of 68.7 / 68.7 / 75.9 GiB: batch 8 fits an H100.
# Carry .whl. Run: bash benchmarks/results/next-h200/call47.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c47_env.txt 2>&1
timeout $(left 120) python3 -m benchmarks.gpu_fit_probe --out $OUT/c47 --model qwen3-4b --batches 8 1 4 \
  --deadline 90 > $OUT/c47_probe.log 2>&1
# Added 2026-12-07 16:50 UTC (nineteenth session, before the call): c45's host profile only where the host is c45's
# (an H100 with Xeon model 207); on any other host the call calibrates its own host first, as c45 did.
HOST=(--calibrate none --base benchmarks/results/h100-2026-12-07f/c45/mistral-w12/profile.yaml)
{ nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && lscpu | grep -qE "^Model:\s+207$"; } || {
  BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
  HOST=(--calibrate host --base $BASE); }
echo "host: ${HOST[*]}" >> $OUT/c47_env.txt
timeout $(left 330) python3 -m benchmarks.peer_validation --out $OUT/c47pv "${HOST[@]}" --systems deepspeed-offload \
  --batches 1 4 8 --steps 3 --no-contention --phases --deadline 180 --timeout 180 > $OUT/c47pv.log 2>&1
rm -rf $OUT/c47pv/peers
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c47_env.txt
