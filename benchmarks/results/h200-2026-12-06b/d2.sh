# 2026-12-06 (second session) call d2, any one GPU (#18's last parts, then #16's v5 kernel on the lent host).
# 1. as_ready with two CUDA ranks sharing the GPU against one rank (tests/runtime/test_gpu_ranks.py).
# 2. Host memory of 1, 2, 3 CUDA ranks of a Qwen3-0.6B shape sharing one host state (expected before: each
#    rank's RSS holds the whole mapped state, ~8 GiB + its process; the PSS sum grows by a per-rank overhead
#    (CUDA context, torch, landing buffers), not by 8 GiB per rank).
# 3. The compact update rates of kernel v5 at 16 and 8 threads (v4 measured 2026-12-06 on the same machine type,
#    16 threads: fp32 4.825, bf16+int8 5.062, fp32+int8 5.412, fp32+bf16 5.346, bf16+bf16 4.676 G params/s;
#    expected from the dev machine's L2 gain: bf16+int8 ~6.3-6.9, still under the 1.7x target of 8.2).
# Carry .whl. Run: bash benchmarks/results/h200-2026-12-06b/d2.sh
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/d2_env.txt 2>&1
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400 >> $OUT/d2_env.txt 2>&1
timeout $(left 150) python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/runtime/test_gpu_ranks.py -k as_ready \
  > $OUT/d2_as_ready.log 2>&1
O=/tmp/d2; mkdir -p $O
timeout $(left 420) python3 -m benchmarks.rank_memory --model qwen3-0.6b --ranks 1 2 3 --seq 1024 --batch 6 \
  --device cuda --out $O/rm > $OUT/d2_rank_memory.log 2>&1
cp $O/rm/results.jsonl $OUT/d2_rank_memory.jsonl 2>/dev/null
timeout $(left 575) python3 -m benchmarks.compact_state rates --threads 16 8 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 fp32+int8 fp32+bf16 bf16+bf16 --out $O/rates > $OUT/d2_rates.log 2>&1
cp $O/rates/*.json* $OUT/ 2>/dev/null; ls $O/rates >> $OUT/d2_rates.log 2>&1
