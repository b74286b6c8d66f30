"""Shared by the streaming-runtime benchmark scripts (gpu_runtime, validation_runs, peer_systems): open a
model's host state once, time the streaming runtime under a policy, and keep each measured step as a run
directory that `slidedp validate` reads.

Step time is wall clock around `engine.step` (which synchronises the device at its end), the median of
every step after the first (the first pays allocator growth and kernel autotuning).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from benchmarks.common import rss_gib, synthetic_tokens
from slidedp.exposure import exposure_from_trace, limiter
from slidedp.hardware import GIB, HardwareProfile
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.report.rundir import write_run_dir
from slidedp.run_summary import RunSummary
from slidedp.runtime.device import Device
from slidedp.runtime.engine import EngineConfig, StreamingEngine
from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
from slidedp.runtime.host_state import HostState
from slidedp.runtime.optim import OptimConfig
from slidedp.runtime.tracing import TraceRecorder
from slidedp.sim import simulate
from slidedp.trace import EXPOSURE_CATEGORIES
from slidedp.workload import StepWorkload

BENCH_OPTIM = OptimConfig(lr=1e-5, max_grad_norm=1.0, total_steps=1000)


@dataclass
class StreamingModel:
    """One model's adapter, spec and pinned host state (allocated once, reused by every policy)."""

    name: str
    config: object
    adapter: ModelAdapter
    spec: ModelSpec
    host: HostState
    device: Device

    @classmethod
    def open(cls, model: str, device: Device, log=print) -> StreamingModel:
        cfg = load_hf_config(model)
        adapter = ModelAdapter(cfg)
        spec = ModelSpec.from_hf_config(cfg.to_dict(), model)
        t0 = time.perf_counter()
        dtype = torch.bfloat16 if device.is_cuda else torch.float32  # CPU: the smoke tests' fp32 reference path
        host = HostState.allocate(adapter.total_params, dtype, dtype, pin=device.is_cuda)
        t_alloc = time.perf_counter() - t0
        host.init_random(adapter, 0, device.torch_device)
        log(f"{model}: {adapter.total_params / 1e9:.2f} B params, host state {host.total_bytes() / GIB:.1f} GiB "
            f"({host.bytes_per_param():.0f} B/param, allocated in {t_alloc:.1f} s), RSS {rss_gib():.1f} GiB")
        return cls(model, cfg, adapter, spec, host, device)

    def close(self) -> None:
        self.host.close()


def measure_policy(sm: StreamingModel, hw: HardwareProfile, policy: Policy, seq: int, batch: int, steps: int,
                   optim: OptimConfig = BENCH_OPTIM) -> tuple[dict, pd.DataFrame]:
    """Run ``steps`` steps of the streaming runtime; the row holds the measured and the simulated figures."""
    w = StepWorkload(sm.spec, hw, policy, seq, batch)
    predicted = simulate(w)
    tokens = synthetic_tokens(sm.config.vocab_size, batch, seq)
    if sm.device.is_cuda:
        torch.cuda.reset_peak_memory_stats()
    config = EngineConfig(policy, optim, seq, torch.bfloat16 if sm.device.is_cuda else torch.float32,
                          adam_threads=w.adam_threads)
    engine = StreamingEngine(config, sm.adapter, sm.spec, sm.host, sm.device, TraceRecorder(sm.device))
    times, last = [], None
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            last = engine.step(tokens)
            times.append(time.perf_counter() - t0)
        engine.flush()
    finally:
        engine.close()
    step_time = statistics.median(times[1:]) if len(times) > 1 else times[0]
    exposure = exposure_from_trace(last.trace).drop(columns="rank").iloc[0].to_dict()
    peak = torch.cuda.max_memory_allocated() / GIB if sm.device.is_cuda else float("nan")
    row = {
        "system": "slidedp", "model": sm.name, "seq": seq, "batch": batch, "tokens_per_step": batch * seq,
        "policy": policy.to_dict(), "adam_threads": w.adam_threads, "step_times_s": times, "step_time_s": step_time,
        "tokens_per_s": batch * seq / step_time, "model_tflops": w.model_flops_per_step() / step_time / 1e12,
        "gpu_peak_gib": peak, "host_rss_gib": rss_gib(), "host_rss_peak_gib": rss_gib("VmHWM"),
        "host_bytes_per_param": sm.host.bytes_per_param(), "exposure_s": exposure,
        "limiter": limiter(exposure["compute"], {c: exposure[c] for c in EXPOSURE_CATEGORIES}),
        "predicted_step_time_s": predicted.step_time_s, "predicted_limiter": predicted.limiter,
        "profile": hw.name, "final_loss": last.loss, "status": "ok",
    }
    return row, last.trace


def save_run_dir(directory: Path, label: str, row: dict, trace: pd.DataFrame, spec: ModelSpec) -> Path:
    """The measured step as a run directory (trace, exposure, summary) for `slidedp validate`/`calibrate`."""
    summary = RunSummary(model=row["model"], model_spec=spec.to_dict(), policy=row["policy"], seq=row["seq"],
                         batch=row["batch"], ranks=1, adam_threads=row["adam_threads"],
                         step_time_s=row["step_time_s"], limiter=row["limiter"], measured=True)
    return write_run_dir(directory / label, trace, exposure_from_trace(trace), summary)
