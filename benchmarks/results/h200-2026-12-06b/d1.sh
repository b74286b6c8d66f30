# 2026-12-06 (second session) call d1 (#19), on an H200 (needs its 139 GiB): Qwen3-14B-wide x 8 layers at 512K
# tokens on the whole GPU (predicted before, RESULTS "Next H200 session": 197.9 s/step, GPU peak 134.3 GiB), then
# 256K under the hard 80 GiB cap with expandable segments (predicted 56.6 s/step, peak 79.8 GiB): the call of
# 2026-12-05, which never ran (no H200 started). Carry .whl. Run: bash benchmarks/results/h200-2026-12-06b/d1.sh
exec bash benchmarks/results/h200-2026-12-05/c1.sh
