# Device call for #14: the peers predicted blind on a lent host the profile never saw, ZeRO-3-Offload measured for
# the first time. Part a (any H100/H200): `slidedp calibrate --host-only` on this host (its CPU rates, the peers'
# DeepSpeedCPUAdam / torch AdamW / clip included) over the base preset for this GPU, then benchmarks.peer_validation
# writes predictions.json for GPU-resident, ZeRO-3-Offload and FSDP2-offload at batch 1 2 4 8 before any of them
# runs, then runs them in that order (whatever it had no time for is "not started"). Part b, on the same warm
# machine straight after: the systems named after "b", against the profile part a left in runs/.
# Written before the call (2026-12-07, seventeenth session, development machine, h200-x1 as shipped, only as a
# reference: the call's own predictions use this host's calibrated rates):
# - zero3-offload (spec from DeepSpeed 0.19.8's stage3.py, read this session, nothing measured of it yet):
#   2.698 / 3.014 / 3.705 / 5.088 s at batch 1 / 2 / 4 / 8, host 74.9 GiB of state (20 B/param), GPU 10.9-20.7 GiB.
# - What would refute the spec: ZeRO-3 slower than predicted by > 10% at every batch (costs the spec lacks: the
#   per-module hooks' host time, the fetch's host sync on the copy stream), or its host RSS well above 20 B/param.
# - GPU-resident on an 80 GB H100: the memory model's first batch out of memory is the row's "OOM" mark.
# Carry .whl. Run: bash benchmarks/results/next-h200/call42.sh a ; bash benchmarks/results/next-h200/call42.sh b fsdp2-offload
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
PART=${1:-a}; shift || true
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c42${PART}_env.txt 2>&1
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
mkdir -p runs
if [ "$PART" = a ]; then
  timeout $(left 590) python3 -m benchmarks.peer_validation --out $OUT/c42a --calibrate host --base $BASE \
    --systems resident deepspeed-zero3-offload fsdp2-offload --batches 1 2 4 8 --steps 3 --no-contention --phases \
    --deadline 380 --timeout 240 > $OUT/c42a.log 2>&1
  cp $OUT/c42a/profile.yaml runs/c42-profile.yaml
else
  timeout $(left 590) python3 -m benchmarks.peer_validation --out $OUT/c42b --calibrate none \
    --base runs/c42-profile.yaml --systems "$@" --batches 1 2 4 8 --steps 3 --no-contention --phases \
    --deadline 540 --timeout 540 > $OUT/c42b.log 2>&1
fi
echo "part $PART done at $(( $(date +%s) - T0 )) s" >> $OUT/c42${PART}_env.txt
