# Device call for #19 on an H100 80GB (the GPU the paper names): Qwen3-14B-wide x 8 layers at 262,144 tokens
# under a hard cap of 76 GiB (torch.cuda.set_per_process_memory_fraction(76 / 79.6)): the H100's own memory
# proves the fit, not a cap set on a larger card. Predicted before (h200-x1 profile, `python -m
# benchmarks.long_seq_tiled --layers 8 --parts cap --cap-gib 76 --predict-only`): offload, 8 chunks, prefetch 3,
# sequence tile 131,072, 56.8 s/step, GPU peak 70.5 GiB (allocated 68.5). Carry .whl.
# Run: bash benchmarks/results/next-h200/call16.sh
source benchmarks/results/h200-2026-12-04/setup.sh
O=/tmp/c16; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c16_env.txt 2>&1
timeout $(left 430) python3 -m benchmarks.long_seq_tiled --layers 8 --parts cap --cap-gib 76 --steps 2 \
  --deadline 120 --out $O/cap > $OUT/c16_cap.log 2>&1
cp $O/cap/results.jsonl $OUT/c16_results.jsonl 2>/dev/null
pack_runs c16_runs.tgz $O
