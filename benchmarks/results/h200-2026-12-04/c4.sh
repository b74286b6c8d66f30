# Call 4 (#16): the fine-tune in the two 8-bit-moment modes (call 3's time ran out after fp32).
source .device/setup.sh
timeout 400 python3 -m benchmarks.compact_state finetune --states bf16+int8 fp32+int8 --seq 512 --batches 8 \
  --micro-batch 8 --steps 300 --eval-every 50 --out /tmp/ft4 > $OUT/c4.log 2>&1
cp /tmp/ft4/results.jsonl $OUT/c4_ft.jsonl; cp /tmp/ft4/finetune.md $OUT/c4_finetune.md
for d in /tmp/ft4/runs/finetune-*; do cp $d/metrics.csv $OUT/c4_$(basename $d | tr '+' 'p').csv; done
