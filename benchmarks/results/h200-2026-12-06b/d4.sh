# 2026-12-06 (second session) call d4 (#21): SlideDP (tuned) and SlideDP host-only on the same machine as d3,
# Qwen3-4B, seq 4096, batches 1-16, profile h200-x1 (the lent host's measured CPU side) with the GPU budget
# capped to what an H100 holds. Carry .whl. Run: bash benchmarks/results/h200-2026-12-06b/d4.sh
source benchmarks/results/h200-2026-12-04/setup.sh
timeout $(left 585) python3 -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 2 4 8 16 --steps 3 \
  --systems slidedp slidedp-host --profile h200-x1 --slidedp-gpu-budget 74 --timeout 280 --deadline 570 \
  --out $OUT/p21b > $OUT/d4.log 2>&1
