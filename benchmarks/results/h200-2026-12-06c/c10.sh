# 2026-12-06 (third session) call c10 (#18): the GPU-held units on the two route pairs not yet run with them, and
# the final-weights check (new in tests/runtime/test_gpu_ranks.py) on those and on 3 ranks sharded/per_rank.
# Carry .whl. Run: bash benchmarks/results/h200-2026-12-06c/c10.sh
source benchmarks/results/h200-2026-12-04/setup.sh
T=tests/runtime/test_gpu_ranks.py::test_ranks_sharing_the_gpu_train_like_one_rank
timeout $(left 250) python3 -m pytest -m gpu -v -rA -p no:cacheprovider --durations=0 \
  "$T[2-replicated-reduce_scatter-next_forward-2]" "$T[2-sharded-per_rank-next_forward-2]" \
  "$T[3-sharded-per_rank-next_forward-0]" > $OUT/c10_ranks.log 2>&1
