# Next device session (any one GPU, about 9 min): #16's 2.0x target over ZeRO-2-Offload on ONE machine. Qwen3-4B,
# seq 4096, every optimizer state on the host, bf16+int8 and fp32 at batch 1, 4, 8 (tuned host-only, planned
# within 72 GiB so batch 4 passes the H100's preflight), then ZeRO-2-Offload at the same batches, after recording
# this host's compact and exact update rates (two lent hosts of one type differed 2.3x in the compact rate on
# 2026-12-06: RESULTS "Ninth session's device calls"). Carry .whl. Run: bash benchmarks/results/next-h200/call12.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c12_env.txt 2>&1
O=/tmp/c12; mkdir -p $O
timeout $(left 80) python3 -m benchmarks.compact_state rates --threads 16 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 --out $O/rates > $OUT/c12_rates.log 2>&1
timeout $(left 400) python3 -m benchmarks.compact_state steps --states bf16+int8 fp32 --batches 1 4 8 \
  --hardware h200-x1 --gpu-budget 72 --out $O/st > $OUT/c12_steps.log 2>&1
cp $O/st/results.jsonl $OUT/c12_steps.jsonl 2>/dev/null
pack_runs c12_runs.tgz $O
timeout $(left 590) python3 -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 4 8 --steps 3 \
  --systems deepspeed-offload --timeout 180 --deadline 185 --out $OUT/p16z > $OUT/c12_zero2.log 2>&1
