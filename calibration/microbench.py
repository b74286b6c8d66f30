"""Micro-benchmarks of this machine, each bounded in size, that feed the profile fits.

Host: DRAM traffic of a streaming copy, the CPU AdamW update (the runtime's kernel where it compiles,
torch's fused AdamW otherwise) and the fp32 -> bf16 cast, each against thread count. GPU (when present):
pinned H2D/D2H time against transfer size (latency + bandwidth fit) and both directions at once.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from slidedp.calibration.fits import fit_link, thread_curve
from slidedp.hardware import HardwareProfile

Progress = Callable[[int, int], None]


@dataclass
class Measurements:
    stream_gbps: dict[int, float] = field(default_factory=dict)
    adam_gparams_per_s: dict[int, float] = field(default_factory=dict)
    cast_gelems_per_s: dict[int, float] = field(default_factory=dict)
    h2d: dict[int, float] = field(default_factory=dict)  # bytes -> seconds
    d2h: dict[int, float] = field(default_factory=dict)
    duplex_gbps: float | None = None
    layer: tuple[str, list[tuple[int, int, float]]] | None = None  # model, [(seq, tokens, forward seconds)]
    report: dict = field(default_factory=dict)


def _median_time(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up: page faults, thread pool start
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def thread_counts(cores: int) -> list[int]:
    counts = {1, cores}
    t = 2
    while t < cores:
        counts.add(t)
        t *= 2
    return sorted(counts)


def _adam_update(kernel, p: torch.Tensor, mom: torch.Tensor, var: torch.Tensor, slot: torch.Tensor):
    """One AdamW step over ``p`` the way the runtime does it: the one-pass kernel, else torch's fused."""
    steps = torch.zeros(())
    grad = slot.float() if kernel is None else None

    def update() -> None:
        steps.add_(1)
        if kernel is not None:
            kernel.adamw_bf16(p, mom, var, slot, 1e-5, 0.9, 0.95, 1e-8, 0.0, float(steps), 1.0)
        else:
            torch._fused_adamw_([p], [grad], [mom], [var], [], [steps], lr=1e-5, beta1=0.9, beta2=0.95,
                                weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    return update


def host_benchmarks(quick: bool, progress: Progress | None = None) -> Measurements:
    from slidedp.runtime.cpu_adam import fused_kernel

    m = Measurements()
    n = 4_000_000 if quick else 64_000_000
    repeats = 2 if quick else 5
    src, dst = torch.randn(n), torch.empty(n)
    p, mom, var = torch.randn(n), torch.zeros(n), torch.zeros(n)
    slot, bf16 = torch.randn(n).bfloat16(), torch.empty(n, dtype=torch.bfloat16)
    kernel = fused_kernel()
    update = _adam_update(kernel, p, mom, var, slot)
    saved = torch.get_num_threads()
    counts = thread_counts(os.cpu_count() or 1)
    try:
        for i, threads in enumerate(counts):
            torch.set_num_threads(threads)
            m.stream_gbps[threads] = 2 * n * 4 / _median_time(lambda: dst.copy_(src), repeats) / 1e9
            m.cast_gelems_per_s[threads] = n / _median_time(lambda: bf16.copy_(p), repeats) / 1e9
            m.adam_gparams_per_s[threads] = n / _median_time(update, repeats) / 1e9
            if progress:
                progress(i + 1, len(counts))
    finally:
        torch.set_num_threads(saved)
    m.report["adam_kernel"] = "one-pass bf16 kernel" if kernel is not None else "torch fused AdamW (fp32 grads)"
    return m


def gpu_benchmarks(m: Measurements, quick: bool) -> None:
    if not torch.cuda.is_available():
        m.report["gpu"] = "no CUDA device: PCIe and GPU rates kept from the base profile"
        return
    sizes = [2**20, 2**23, 2**26] if quick else [2**20, 2**22, 2**24, 2**26, 2**28, 2**30]
    host = torch.empty(max(sizes), dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(max(sizes), dtype=torch.uint8, device="cuda")
    for size in sizes:
        for direction, table in (("h2d", m.h2d), ("d2h", m.d2h)):
            def copy(size=size, direction=direction):
                if direction == "h2d":
                    dev[:size].copy_(host[:size], non_blocking=True)
                else:
                    host[:size].copy_(dev[:size], non_blocking=True)
                torch.cuda.synchronize()
            table[size] = _median_time(copy, 3 if quick else 10)
    big = max(sizes)
    other = torch.empty(big, dtype=torch.uint8, pin_memory=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    dev2 = torch.empty(big, dtype=torch.uint8, device="cuda")

    def both():
        with torch.cuda.stream(s1):
            dev[:big].copy_(host[:big], non_blocking=True)
        with torch.cuda.stream(s2):
            other.copy_(dev2, non_blocking=True)
        torch.cuda.synchronize()
    m.duplex_gbps = 2 * big / _median_time(both, 3) / 1e9


def profile_from(base: HardwareProfile, m: Measurements) -> tuple[HardwareProfile, dict]:
    """``base`` with every field these measurements cover replaced; the report holds the fit residuals."""
    host = replace(base.host, cores=os.cpu_count() or base.host.cores,
                   stream_gbps=thread_curve(m.stream_gbps, m.stream_gbps.values()),
                   adam_gparams_per_s=thread_curve(m.adam_gparams_per_s, m.adam_gparams_per_s.values()),
                   cast_gelems_per_s=thread_curve(m.cast_gelems_per_s, m.cast_gelems_per_s.values()),
                   mem_bw_gbps=max(m.stream_gbps.values()))
    gpu = base.gpu
    report = dict(m.report)
    for table, field_name in ((m.h2d, "h2d_gbps"), (m.d2h, "d2h_gbps")):
        if len(table) >= 2:
            fit = fit_link(list(table), list(table.values()))
            gpu = replace(gpu, **{field_name: fit.bandwidth_Bps / 1e9, "pcie_latency_us": fit.latency_s * 1e6})
            report[field_name] = {"value": fit.bandwidth_Bps / 1e9, "latency_us": fit.latency_s * 1e6,
                                  "residual": fit.residual}
    if m.duplex_gbps:
        gpu = replace(gpu, duplex_gbps=m.duplex_gbps)
    if m.layer is not None:
        gpu, report["compute"] = compute_profile(gpu, *m.layer)
    try:
        with open("/proc/meminfo") as fh:
            total = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
        host = replace(host, memory_gib=total / 2**20)
    except (OSError, StopIteration, ValueError):
        pass
    name = f"{base.name}-calibrated"
    return replace(base, name=name, gpu=gpu, host=host,
                   notes=f"calibrated on this machine by slidedp calibrate from {base.name}"), report


def layer_benchmarks(m: Measurements, model: str, quick: bool, progress: Progress | None = None) -> None:
    """Forward time of one decoder layer of ``model`` against tokens and sequence length, on the device the
    runtime would use (CUDA when present, else CPU in fp32), through the runtime's own layer call."""
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    adapter = ModelAdapter(load_hf_config(model))
    unit = adapter.units[1]
    layer = adapter.layer_module(unit)
    flat = torch.randn(unit.numel, dtype=dtype, device=device) * 0.02
    params = {p.name: flat[p.offset:p.offset + p.numel].view(p.shape) for p in unit.params}
    rotary = adapter.rotary(device)
    grid = [(64, 1), (64, 4), (256, 1), (256, 2)] if quick else [(1024, 1), (1024, 8), (4096, 1), (4096, 4),
                                                                 (16384, 1), (32768, 1)]
    samples = []
    for i, (seq, batch) in enumerate(grid):
        x = torch.randn(batch, seq, adapter.config.hidden_size, dtype=dtype, device=device)
        pos = torch.arange(seq, device=device).unsqueeze(0)
        pe = rotary(x, pos)

        def forward(x=x, pos=pos, pe=pe):
            with torch.no_grad():
                torch.func.functional_call(layer, params, (x,), {"attention_mask": None, "position_embeddings": pe,
                                                                "position_ids": pos})
            if cuda:
                torch.cuda.synchronize()
        samples.append((seq, batch * seq, _median_time(forward, 2 if quick else 5)))
        if progress:
            progress(i + 1, len(grid))
    m.layer = (model, samples)


def compute_profile(gpu, model: str, samples):
    """Fit the GPUSpec compute model to the layer timings (see layer_benchmarks)."""
    from slidedp.calibration.fits import fit_compute
    from slidedp.model_spec import load_model_spec

    spec = load_model_spec(model)
    lin = [spec.layer_linear_flops_per_token() * tokens for _, tokens, _ in samples]
    att = [spec.layer_attention_flops_per_token(seq) * tokens for seq, tokens, _ in samples]
    fit = fit_compute(lin, att, [t for _, t, _ in samples], [s for _, _, s in samples])
    gpu = replace(gpu, matmul_tflops=fit.matmul_tflops, attention_tflops=fit.attention_tflops,
                  half_efficiency_tokens=fit.half_efficiency_tokens, layer_overhead_us=fit.overhead_s * 1e6)
    return gpu, {"matmul_tflops": fit.matmul_tflops, "attention_tflops": fit.attention_tflops,
                 "half_efficiency_tokens": fit.half_efficiency_tokens, "residual": fit.residual}
