# 2026-12-06 (fourth session) call c14 (#21/#16, Qwen3-8B, ~300 s left of the session's device time, the same warm
# H100 as c11 and c13): SlideDP tuned (its plan now fits the card; c9a's ran out of memory) and SlideDP host-only
# compact (bf16+int8), batch 1 and 4. Carry .whl. Run: bash benchmarks/results/h200-2026-12-06d/c14.sh
source benchmarks/results/h200-2026-12-04/setup.sh
timeout $(left 300) python3 -m benchmarks.peer_compare --model qwen3-8b --seq 4096 --batches 1 4 --steps 3 \
  --systems slidedp slidedp-compact --timeout 160 --deadline $(left 295) --out $OUT/p21s8 > $OUT/c14.log 2>&1
rm -rf $OUT/p21s8/slidedp_runs
