# Device call for #14: is ZeRO-3-Offload's slow batch 1 (c42, c43: every model's batch 1, the first batch of its
# process, slower than batch 2) a warm-up of the process, not of the batch? Qwen3-0.6B, batch 1, 2, then 1 again,
# eight steps each (peer_compare's row keeps every step's time).
# Predicted before (13:20 UTC): the first batch-1 row's steps fall towards the later batch-1 row's, which runs no
# slower than batch 2 (a process warm-up); refuted if the second batch-1 row is as slow as the first.
# Carry .whl. Run: bash benchmarks/results/next-h200/call44.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
timeout $(left 200) python3 -m benchmarks.peer_compare --systems deepspeed-zero3-offload --model qwen3-0.6b \
  --seq 4096 --batches 1 2 1 --steps 8 --phases --timeout 180 --deadline 185 --out $OUT/c44 > $OUT/c44.log 2>&1
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c44.log
