# Call 3 (#19, #16): Qwen3-14B-wide (8 layers) at 256K tokens under a hard 80 GiB cap; Qwen3-14B (40 layers) in
# bf16+int8 at batch 1 and 4; then the 300-step fine-tune in fp32 and bf16+int8 while time is left.
source .device/setup.sh
B=${BUDGET:-520}
O=/tmp/c3; mkdir -p $O
timeout 230 python3 -m benchmarks.long_seq_tiled --layers 8 --parts cap --steps 2 --cap-retry 0.9 --deadline 120 \
  --out $O/cap
cp $O/cap/results.jsonl $OUT/c3_cap.jsonl 2>/dev/null
timeout $(left $((B - 170))) python3 -m benchmarks.compact_state big --batches 1 4 --steps 3 --out $O/big
cp $O/big/results.jsonl $OUT/c3_big.jsonl 2>/dev/null
timeout $(left $((B - 10))) python3 -m benchmarks.compact_state finetune --states fp32 bf16+int8 --seq 512 \
  --batches 8 --micro-batch 8 --steps 300 --eval-every 50 --out $O/ft
cp $O/ft/results.jsonl $OUT/c3_ft.jsonl 2>/dev/null; cp $O/ft/finetune_losses.png $O/ft/finetune.md $OUT/ 2>/dev/null
pack_runs c3_runs.tgz $O
