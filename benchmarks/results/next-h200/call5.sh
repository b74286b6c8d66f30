# Next device session (any one GPU, about 6 min): what #18 still lacks on a real GPU. The as_ready schedule with
# two CUDA ranks sharing the GPU (test_gpu_ranks.py's new case, against one rank, no clipping), then the host
# memory of 1, 2 and 3 ranks of a Qwen3-0.6B shape sharing one host state (0.596 B parameters: 7.8 GiB of fp32
# state at 14 B/param). Expected before: each rank's RSS includes the whole mapped state (~8 GiB + its process), the
# PSS sum stays near one state plus a per-rank overhead (CUDA context, torch, one landing buffer), i.e. grows by
# the overhead per rank, not by 8 GiB. Carry .whl. Run: bash benchmarks/results/next-h200/call5.sh
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c5_env.txt 2>&1
timeout $(left 150) python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/runtime/test_gpu_ranks.py -k as_ready \
  > $OUT/c5_as_ready.log 2>&1
O=/tmp/c5; mkdir -p $O
timeout $(left 560) python3 -m benchmarks.rank_memory --model qwen3-0.6b --ranks 1 2 3 --seq 1024 --batch 6 \
  --device cuda --out $O/rm > $OUT/c5_rank_memory.log 2>&1
cp $O/rm/results.jsonl $OUT/c5_rank_memory.jsonl 2>/dev/null
