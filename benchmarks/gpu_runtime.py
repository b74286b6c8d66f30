"""Streaming runtime on a real GPU: batch sweep, and the resident-weights reference.

    python -m benchmarks.gpu_runtime --models qwen3-4b --batches 1 2 4 8 16 --out results/
    python -m benchmarks.gpu_runtime --cpu-bench                  # host AdamW throughput only

The GPU correctness check this script used to run with --check (the streaming engine on CUDA against the
plain-PyTorch CPU reference on a tiny model) is a test now: `python -m pytest -m gpu`
(tests/runtime/test_gpu_engine.py; skipped where CUDA is not available).

For each model the host state is allocated (pinned) once; for each batch the policy comes from the
tuner (h200-x1 profile), the runtime runs --steps steps (the first is warm-up), and the same compute
with all weights already resident on the GPU (same kernels, no transfers, no CPU update:
``EngineConfig.resident_weights``) is timed in the same process as the reference. Results go to
results.jsonl, traces to traces.parquet.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from benchmarks.common import log, synthetic_tokens
from benchmarks.streaming_measure import BENCH_OPTIM, StreamingModel, measure_policy
from slidedp.hardware import GIB, load_hardware
from slidedp.problem import resolve_budget
from slidedp.runtime.device import Device, cuda_memory_gib
from slidedp.runtime.engine import EngineConfig, StreamingEngine
from slidedp.runtime.optim import OptimConfig
from slidedp.runtime.tracing import TraceRecorder
from slidedp.tune import tune


def cpu_update_bench(results, params: int = 400_000_000) -> None:
    """Host AdamW throughput at this machine's thread count: torch's path (upcast, fused AdamW, cast)
    against the one-pass kernel, on the bf16-slot layout the runtime uses."""
    from slidedp.runtime.cpu_adam import fused_kernel
    from slidedp.runtime.optim import adamw_chunk_

    kernel = fused_kernel()
    p, m, v = torch.randn(params), torch.zeros(params), torch.zeros(params)
    slot = torch.randn(params).bfloat16()
    scratch = torch.empty(params)
    cfg = OptimConfig()
    timings = {}
    for name in ("torch", "fused"):
        runs = []
        for step in range(1, 4):
            t0 = time.perf_counter()
            if name == "torch":
                adamw_chunk_(p, slot, m, v, step, 1e-5, cfg, 1.0, scratch)
                slot.copy_(p)
            else:
                kernel.adamw_bf16(p, m, v, slot, 1e-5, 0.9, 0.95, 1e-8, 0.0, float(step), 1.0)
            runs.append(time.perf_counter() - t0)
        timings[name] = params / statistics.median(runs[1:]) / 1e9
    log(f"CPU AdamW + bf16 cast, {params / 1e6:.0f} M params, {torch.get_num_threads()} threads: torch path "
        f"{timings['torch']:.2f} G params/s, one-pass kernel {timings['fused']:.2f} G params/s")
    results.write(json.dumps({"cpu_update_gparams_per_s": timings, "threads": torch.get_num_threads()}) + "\n")


def run_model(model: str, seq: int, batches: list[int], steps: int, out: Path, results, traces: list) -> None:
    sm = StreamingModel.open(model, Device("cuda"), log)
    hw = load_hardware("h200-x1")
    budget = resolve_budget(hw, None, hw.host.memory_gib, cuda_memory_gib("cuda"))
    for batch in batches:
        t0 = time.perf_counter()
        tuned = tune(sm.spec, hw, seq, batch, budget, refine_top=4)
        policy = tuned.best.policy
        log(f"  batch {batch}: tuned in {time.perf_counter() - t0:.1f} s -> {policy}")
        row, trace = measure_policy(sm, hw, policy, seq, batch, steps)
        torch.cuda.empty_cache()
        # Reference: the same compute with every weight already on the GPU.
        ref = StreamingEngine(EngineConfig(policy, BENCH_OPTIM, seq, torch.bfloat16, resident_weights=True), sm.adapter,
                              sm.spec, sm.host, sm.device, TraceRecorder(sm.device, enabled=False))
        tokens = synthetic_tokens(sm.config.vocab_size, batch, seq)
        ref_times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            ref.step(tokens)
            ref_times.append(time.perf_counter() - t0)
        ref.close()
        del ref
        torch.cuda.empty_cache()
        ref_time = statistics.median(ref_times[1:])
        row.update(predicted_gpu_peak_gib=tuned.best.memory.gpu_peak / GIB, resident_compute_s=ref_time,
                   resident_step_times_s=ref_times, ratio_to_resident=row["step_time_s"] / ref_time)
        results.write(json.dumps(row) + "\n")
        results.flush()
        trace = trace.copy()
        trace.insert(0, "run", f"{model}-b{batch}")
        traces.append(trace)
        log(f"  batch {batch}: {row['step_time_s']:.3f} s/step, {row['tokens_per_s']:,.0f} tok/s, "
            f"{row['model_tflops']:.0f} TFLOP/s, resident {ref_time:.3f} s (x{row['ratio_to_resident']:.3f}), "
            f"peak {row['gpu_peak_gib']:.1f} GiB (pred {row['predicted_gpu_peak_gib']:.1f}), "
            f"RSS {row['host_rss_gib']:.1f} GiB, limiter {row['limiter']}, predicted "
            f"{row['predicted_step_time_s']:.3f} s ({row['predicted_limiter']})")
    sm.close()
    del sm
    gc.collect()  # the pinned host state must be gone before the next model allocates its own


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-bench", action="store_true")
    p.add_argument("--models", nargs="*", default=[])
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="gpu_results")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {torch.get_num_threads()} threads")
    traces: list = []
    with open(out / "results.jsonl", "a") as results:
        if args.cpu_bench:
            cpu_update_bench(results)
        try:
            for model in args.models:
                run_model(model, args.seq, args.batches, args.steps, out, results, traces)
                pd.concat(traces).to_parquet(out / "traces.parquet", index=False)
        finally:
            if traces:
                pd.concat(traces).to_parquet(out / "traces.parquet", index=False)


if __name__ == "__main__":
    main()
