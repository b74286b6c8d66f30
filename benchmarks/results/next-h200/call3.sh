# Next H200 session, call 3 (about 8 min): the shape micro-benchmarks with this session's new families (attention
# to 128K tokens, the loss head) for a refit of h200-x1's curves, then Qwen3-14B in bf16+int8 at batch 4 and 16
# (predicted before: 8.557 and 16.42 s/step, tuned host-only). Carry: .whl.
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
timeout $(left 240) python3 -m benchmarks.shape_validation --only calibrate --out $OUT/shapes > $OUT/c3_shapes.log 2>&1
timeout $(left 585) python3 -m benchmarks.compact_state big --batches 4 16 --steps 3 --out $OUT/big > $OUT/c3_big.log 2>&1
pack_runs c3_runs.tgz $OUT
