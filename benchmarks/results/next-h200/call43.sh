# Device call for #14: ZeRO-3-Offload held out on three models it was not fitted to (c42 fitted its hooks' host
# time per module call on Qwen3-4B batch 2). `slidedp calibrate --host-only` on this host first (inside the first
# peer_validation), then each model's predictions.json is written before its runs.
# Written before the call (2026-12-07 12:55 UTC, development machine, with c42's host profile; the call predicts
# again with its own host's rates): step s, hooks per module (adopted) | no hook floor:
#   Qwen3-1.7B shape  b1 1.738 | 0.999   b2 1.762 | 1.179   b4 1.810 | 1.572
#   Llama-3.2-3B shape b1 2.173 | 1.828  b2 2.199 | 1.897   b4 2.450 | 2.437
#   Qwen3-0.6B        b1 1.290 | 0.480   b4 1.343 | 0.834
# The adopted model is refuted if the small models run near the "no floor" figures (the floor is not per module
# call) or well above both (it grows with something else, e.g. bytes fetched).
# Carry .whl. Run: bash benchmarks/results/next-h200/call43.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c43_env.txt 2>&1
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
python3 -m benchmarks.zero2_heldout --write-configs /tmp/z2cfg > /dev/null
V="python3 -m benchmarks.peer_validation --systems deepspeed-zero3-offload --steps 3 --no-contention --phases"
timeout $(left 340) $V --out $OUT/c43/q06 --calibrate host --base $BASE --model /tmp/z2cfg/qwen3-0.6b.json \
  --batches 1 4 --deadline 150 --timeout 150 > $OUT/c43_q06.log 2>&1
P=$OUT/c43/q06/profile.yaml
timeout $(left 460) $V --out $OUT/c43/q17 --calibrate none --base $P --model /tmp/z2cfg/qwen3-1.7b.json \
  --batches 1 2 4 --deadline 130 --timeout 130 > $OUT/c43_q17.log 2>&1
timeout $(left 590) $V --out $OUT/c43/llama3b --calibrate none --base $P --model /tmp/z2cfg/llama3b.json \
  --batches 1 2 4 --deadline 140 --timeout 140 > $OUT/c43_llama3b.log 2>&1
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c43_env.txt
