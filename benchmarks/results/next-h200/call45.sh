# Device call for #14: ZeRO-3-Offload's layer host floor (DEEPSPEED_ZERO3_LAYER_FLOOR, fitted on c42-c44's four
# models) held out on two models it was not fitted to: the Qwen2.5-3B shape (36 layers of 86 M parameters, qkv
# bias) and the Mistral-7B width at 12 layers (218 M parameters a layer: beyond the fit's 16-101 M). Five steps a
# batch (ZeRO-3's first batch needs two warm-up steps: c44).
# Written before the call (2026-12-07 14:05 UTC, development machine, c43's host profile; the call predicts again
# with its own host's rates), step s with the floor | without it:
#   Qwen2.5-3B shape  b1 2.192 | 1.549   b2 2.216 | 1.626   b4 2.264 | 2.145   host 87.1 GiB
#   Mistral w12       b1 1.656 | 1.433   b2 1.665 | 1.440   b4 1.765 | 1.742   host 81.3 GiB
# Carry .whl. Run: bash benchmarks/results/next-h200/call45.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c45_env.txt 2>&1
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
mkdir -p /tmp/c45cfg && python3 -c "
import json; from benchmarks.shape_validation import ARCHS
for n in ('qwen25-3b', 'mistral-w12'): open(f'/tmp/c45cfg/{n}.json', 'w').write(json.dumps(ARCHS[n]))"
V="python3 -m benchmarks.peer_validation --systems deepspeed-zero3-offload --steps 5 --no-contention --phases"
timeout $(left 380) $V --out $OUT/c45/qwen25-3b --calibrate host --base $BASE --model /tmp/c45cfg/qwen25-3b.json \
  --batches 1 2 4 --deadline 170 --timeout 170 > $OUT/c45_qwen25.log 2>&1
timeout $(left 590) $V --out $OUT/c45/mistral-w12 --calibrate none --base $OUT/c45/qwen25-3b/profile.yaml \
  --model /tmp/c45cfg/mistral-w12.json --batches 1 2 4 --deadline 190 --timeout 190 > $OUT/c45_mistral.log 2>&1
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c45_env.txt
