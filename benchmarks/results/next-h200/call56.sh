# Device call for #14 (twentieth session), written 2026-12-07 19:26 UTC before the call. c54/c55: GPU-resident
# Qwen3-4B's backward phase is over-predicted at batch 1 (0.357 s modelled, 0.330 measured) and under-predicted at
# batch 8 (2.133 against 2.388), while its forward is within 3.4% at batch 4 and 8 (corrected 20:00 UTC, before it
# ran: c55's batch-1 forward is -14%): the modelled backward has a fixed part of
# about 0.10 s (per-kernel costs fitted from micro-benchmarks timed one call at a time) and a per-sample slope 14%
# below the measured one. Which operations? (1) CUDA kernel time of one resident step by kind at batch 1 and 8
# (torch.profiler); (2) a RMSNorm, a GEMM, residual and SDPA's backward timed as calibration.shape_bench does (one
# call between events) and queued (20 calls between two events); (3) the memory-bound modules' backward over their
# forward (slidedp.compute assumes 2, never timed). Needs an H200 (needs_h200). Carry .whl.
# Run: bash benchmarks/results/next-h200/call56.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/c56_gpu.txt
mkdir -p $OUT/c56
timeout 240 python3 -m benchmarks.resident_kernels --model qwen3-4b --batches 1 8 --out $OUT/c56/kernels.jsonl \
  > $OUT/c56/log.txt 2>&1
