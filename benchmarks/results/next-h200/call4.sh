# Next H200 session, call 4 (about 8 min): does leaving cores to the thread that issues GPU work shorten the step?
# Qwen3-4B host-only fp32 and bf16+int8 at batch 1 with 16 / 15 / 14 / 12 optimizer threads (the in-step cost
# host.step_update_factor prices as 1.167); then #16's two fine-tunes not yet run (fp32+bf16, bf16+bf16).
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
timeout $(left 200) python3 -m benchmarks.compact_state steps --model qwen3-4b --batches 1 --states fp32 bf16+int8 \
  --adam-threads 16 15 14 12 --steps 5 --out $OUT/threads > $OUT/c4_threads.log 2>&1
# the same settings as the 2026-12-04 fine-tunes (c3.sh / c4.sh there), so fp32's curve of that day compares
timeout $(left 585) python3 -m benchmarks.compact_state finetune --states fp32+bf16 bf16+bf16 --seq 512 --batches 8 \
  --micro-batch 8 --steps 300 --eval-every 50 --out $OUT/ft > $OUT/c4_ft.log 2>&1
pack_runs c4_runs.tgz $OUT
