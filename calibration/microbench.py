"""Micro-benchmarks of this machine, each bounded in size, that feed the profile fits.

Host: DRAM traffic of a streaming copy, the CPU AdamW update (the runtime's kernel where it compiles,
torch's fused AdamW otherwise) and the fp32 -> bf16 cast, each against thread count; the update against
chunk size with bf16 and with fp32 gradients (per-call overhead + rate fits). GPU (when present): pinned
H2D/D2H time against transfer size (latency + bandwidth fit), both directions at once, aggregate bandwidth
with several streams and several GPUs copying at once, and NCCL all-gather / reduce-scatter across the
GPUs of this host; one decoder layer's forward and backward against tokens and sequence length; the
runtime's AdamW on GPU-held state (``Policy.gpu_state_units``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from slidedp.calibration.fits import fit_backward_ratios, fit_compute, fit_link, thread_curve
from slidedp.hardware import HardwareProfile, SwitchSpec
from slidedp.model_spec import load_model_spec
from slidedp.resources import ADAM_HOST_BYTES_BASE, FUSED_ADAM_HOST_BYTES

Progress = Callable[[int, int], None]


@dataclass
class Measurements:
    stream_gbps: dict[int, float] = field(default_factory=dict)
    adam_gparams_per_s: dict[int, float] = field(default_factory=dict)
    cast_gelems_per_s: dict[int, float] = field(default_factory=dict)
    h2d: dict[int, float] = field(default_factory=dict)  # bytes -> seconds
    d2h: dict[int, float] = field(default_factory=dict)
    duplex_gbps: float | None = None
    adam_fused_cast: bool = False  # the update kernel measured above writes the bf16 copy itself
    concurrent_h2d_gbps: dict[tuple[int, int], float] = field(default_factory=dict)  # (GPUs, streams) -> GB/s
    collectives: dict[str, dict[int, float]] = field(default_factory=dict)  # op -> bytes per rank -> seconds
    # (model, seq, tokens, forward seconds, backward seconds) per sample; models may differ
    layer: list[tuple[str, int, int, float, float]] = field(default_factory=list)
    gpu_adam_gparams_per_s: float | None = None
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
    m.adam_fused_cast = kernel is not None
    m.report["adam_kernel"] = "one-pass bf16 kernel" if kernel is not None else "torch fused AdamW (fp32 grads)"
    m.report["adam_vs_chunk"] = adam_chunk_benchmarks(quick)
    return m


def adam_chunk_benchmarks(quick: bool) -> dict:
    """Update time per call against chunk size, for bf16 gradients (the runtime's kernel, or torch's path
    when it does not compile) and fp32 gradients (torch's fused AdamW + a cast): t = overhead + n / rate.
    The overhead says how small the runtime's chunks may get before thread start-up dominates."""
    from slidedp.runtime.cpu_adam import fused_kernel

    sizes = [2**14, 2**16, 2**18, 2**20] if quick else [2**16, 2**18, 2**20, 2**22, 2**24]
    n = max(sizes)
    kernel = fused_kernel()
    p, mom, var = torch.randn(n), torch.zeros(n), torch.zeros(n)
    grads = {"bf16": torch.randn(n).bfloat16(), "fp32": torch.randn(n)}
    out: dict = {}
    for dtype, grad in grads.items():
        times = {}
        for size in sizes:
            if dtype == "bf16" and kernel is not None:
                update = _adam_update(kernel, p[:size], mom[:size], var[:size], grad[:size])
            else:
                update = _torch_adam_cast(p[:size], mom[:size], var[:size], grad[:size])
            times[size] = _median_time(update, 2 if quick else 5)
        fit = fit_link(list(times), list(times.values()))
        out[f"{dtype}_grads"] = {"overhead_us": fit.latency_s * 1e6, "gparams_per_s": fit.bandwidth_Bps / 1e9,
                                 "residual": fit.residual,
                                 "seconds": {str(k): v for k, v in times.items()}}
    return out


def _torch_adam_cast(p: torch.Tensor, mom: torch.Tensor, var: torch.Tensor, grad: torch.Tensor):
    """The runtime's fallback path: ``adamw_chunk_`` (upcast, torch's fused AdamW), then the bf16 cast."""
    from slidedp.runtime.optim import OptimConfig, adamw_chunk_

    cfg = OptimConfig(lr=1e-5)
    scratch = torch.empty_like(p)
    out = torch.empty(p.shape, dtype=torch.bfloat16)
    step = [0]

    def update() -> None:
        step[0] += 1
        adamw_chunk_(p, grad, mom, var, step[0], cfg.lr, cfg, 1.0, scratch)
        out.copy_(p)
    return update


def gpu_benchmarks(m: Measurements, quick: bool, progress: Progress | None = None) -> None:
    if not torch.cuda.is_available():
        m.report["gpu"] = "no CUDA device: PCIe and GPU rates kept from the base profile"
        return
    sizes = [2**20, 2**23, 2**26] if quick else [2**20, 2**22, 2**24, 2**26, 2**28, 2**30]
    host = torch.empty(max(sizes), dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(max(sizes), dtype=torch.uint8, device="cuda")
    for i, size in enumerate(sizes):
        for direction, table in (("h2d", m.h2d), ("d2h", m.d2h)):
            def copy(size=size, direction=direction):
                if direction == "h2d":
                    dev[:size].copy_(host[:size], non_blocking=True)
                else:
                    host[:size].copy_(dev[:size], non_blocking=True)
                torch.cuda.synchronize()
            table[size] = _median_time(copy, 3 if quick else 10)
        if progress:
            progress(i + 1, len(sizes) + 2)
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
    concurrent_copy_benchmarks(m, host, quick)
    if progress:
        progress(len(sizes) + 1, len(sizes) + 2)
    collective_benchmarks(m, quick)
    gpu_adam_benchmark(m, quick)
    if progress:
        progress(len(sizes) + 2, len(sizes) + 2)


def gpu_adam_benchmark(m: Measurements, quick: bool) -> None:
    """The runtime's update of GPU-held units (clip scale, fused AdamW, bf16 refresh) on 2^22 (quick) or 2^27
    parameters split like decoder layers; HBM-bound, so one size gives the rate."""
    from slidedp.runtime.gpu_state import GpuOptimizerState
    from slidedp.runtime.optim import OptimConfig

    n, pieces = (2**22, 4) if quick else (2**27, 8)
    state = GpuOptimizerState.from_tensors([torch.randn(n // pieces, device="cuda") for _ in range(pieces)],
                                           torch.bfloat16)
    grads = [torch.randn_like(t) * 1e-3 for t in state.master]
    cfg, step = OptimConfig(), [0]

    def update() -> None:
        step[0] += 1
        state.update_all(grads, step[0], cfg.lr, cfg, 0.5)
        torch.cuda.synchronize()
    update()
    m.gpu_adam_gparams_per_s = n / _median_time(update, 3 if quick else 10) / 1e9


def concurrent_copy_benchmarks(m: Measurements, host: torch.Tensor, quick: bool) -> None:
    """Aggregate pinned H2D bandwidth with 1..N GPUs copying at once, each on 1, 2 or 4 streams: what the
    host (DRAM, root complex, shared switch uplinks) delivers when ranks compete for it."""
    gpus = torch.cuda.device_count()
    size = host.numel() // 4  # each copy moves a quarter of the pinned buffer
    counts = sorted({1, gpus} | {g for g in (2, 4) if g < gpus})
    targets = {g: torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in range(gpus)}
    for g_count in counts:
        for streams in ((1, 2) if quick else (1, 2, 4)):
            pool = [(g, torch.cuda.Stream(device=g)) for g in range(g_count) for _ in range(streams)]
            part = size // streams

            def copy_all(pool=pool, part=part, streams=streams, g_count=g_count):
                for i, (g, stream) in enumerate(pool):
                    with torch.cuda.stream(stream):
                        lo = (i % streams) * part
                        targets[g][lo:lo + part].copy_(host[lo:lo + part], non_blocking=True)
                for g in range(g_count):
                    torch.cuda.synchronize(g)
            seconds = _median_time(copy_all, 3)
            m.concurrent_h2d_gbps[(g_count, streams)] = g_count * streams * part / seconds / 1e9
    m.report["concurrent_h2d_gbps"] = {f"{g} GPU x {s} streams": round(v, 2)
                                       for (g, s), v in m.concurrent_h2d_gbps.items()}


def collective_benchmarks(m: Measurements, quick: bool) -> None:
    """NCCL all-gather and reduce-scatter of bf16 buffers across every GPU of this host, from one process
    (torch.cuda.nccl), against bytes per rank: the link fit gives the collective bus bandwidth."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        m.report["collectives"] = "one GPU: no collectives to measure (link kept from the base profile)"
        return
    from torch.cuda import nccl

    sizes = [2**20, 2**24] if quick else [2**20, 2**22, 2**24, 2**26]
    for op in ("allgather", "reduce_scatter"):
        table = m.collectives.setdefault(op, {})
        for size in sizes:
            elems = size // 2
            shards = [torch.ones(elems, dtype=torch.bfloat16, device=f"cuda:{g}") for g in range(gpus)]
            fulls = [torch.empty(elems * gpus, dtype=torch.bfloat16, device=f"cuda:{g}") for g in range(gpus)]

            def run(op=op, shards=shards, fulls=fulls):
                if op == "allgather":
                    nccl.all_gather(shards, fulls)
                else:
                    nccl.reduce_scatter(fulls, shards)
                for g in range(gpus):
                    torch.cuda.synchronize(g)
            # Bytes each rank sends and receives: (N-1)/N of the full buffer.
            table[int(size * (gpus - 1))] = _median_time(run, 3 if quick else 5)


def dram_capacity_gbps(m: Measurements) -> float:
    """Host DRAM capacity as the most traffic any single measurement pushed through it: the copy pass,
    the AdamW pass (rate x bytes it reads and writes per parameter) or H2D + D2H DMA at once.

    No one benchmark saturates DRAM: a copy at 16 threads is limited by the cores' load/store rate (and
    counts no write-allocate reads), so taking it alone under-states DRAM by ~2x on the H200 host and makes
    the simulator charge DMA/optimizer contention that does not happen (validation MAPE 20.9% vs 9.9%)."""
    bytes_per_param = FUSED_ADAM_HOST_BYTES if m.adam_fused_cast else ADAM_HOST_BYTES_BASE + 4
    candidates = [max(m.stream_gbps.values(), default=0.0),
                  max(m.adam_gparams_per_s.values(), default=0.0) * bytes_per_param,
                  m.duplex_gbps or 0.0]
    return max(candidates)


def profile_from(base: HardwareProfile, m: Measurements) -> tuple[HardwareProfile, dict]:
    """``base`` with every field these measurements cover replaced; the report holds the fit residuals."""
    host = replace(base.host, cores=os.cpu_count() or base.host.cores,
                   stream_gbps=thread_curve(m.stream_gbps, m.stream_gbps.values()),
                   adam_gparams_per_s=thread_curve(m.adam_gparams_per_s, m.adam_gparams_per_s.values()),
                   cast_gelems_per_s=thread_curve(m.cast_gelems_per_s, m.cast_gelems_per_s.values()),
                   mem_bw_gbps=dram_capacity_gbps(m), fused_cast=m.adam_fused_cast)
    gpu = base.gpu
    report = dict(m.report)
    report["mem_bw_gbps"] = host.mem_bw_gbps
    for table, field_name in ((m.h2d, "h2d_gbps"), (m.d2h, "d2h_gbps")):
        if len(table) >= 2:
            fit = fit_link(list(table), list(table.values()))
            gpu = replace(gpu, **{field_name: fit.bandwidth_Bps / 1e9, "pcie_latency_us": fit.latency_s * 1e6})
            report[field_name] = {"value": fit.bandwidth_Bps / 1e9, "latency_us": fit.latency_s * 1e6,
                                  "residual": fit.residual}
    if m.duplex_gbps:
        gpu = replace(gpu, duplex_gbps=m.duplex_gbps)
    if m.gpu_adam_gparams_per_s:
        gpu = replace(gpu, adam_gparams_per_s=m.gpu_adam_gparams_per_s)
        report["gpu_adam_gparams_per_s"] = m.gpu_adam_gparams_per_s
    if m.layer:
        gpu, report["compute"] = compute_profile(gpu, m.layer)
    link, switches = base.link, base.switches
    collective_fits = {op: fit_link(list(t), list(t.values())) for op, t in m.collectives.items() if len(t) >= 2}
    if collective_fits:
        slowest = min(collective_fits.values(), key=lambda f: f.bandwidth_Bps)
        link = replace(link, bw_gbps=slowest.bandwidth_Bps / 1e9, latency_us=slowest.latency_s * 1e6)
        report["collectives"] = {op: {"bus_gbps": f.bandwidth_Bps / 1e9, "latency_us": f.latency_s * 1e6,
                                      "residual": f.residual} for op, f in collective_fits.items()}
    gpus = max((g for g, _ in m.concurrent_h2d_gbps), default=1)
    if gpus > 1 and base.num_gpus == gpus:
        together = max(v for (g, _), v in m.concurrent_h2d_gbps.items() if g == gpus)
        alone = max(v for (g, _), v in m.concurrent_h2d_gbps.items() if g == 1)
        if together < 0.9 * gpus * alone:  # the GPUs share an upstream path: model it as one shared uplink
            switches = (SwitchSpec(tuple(range(gpus)), together),)
            report["shared_uplink_gbps"] = together
    try:
        with open("/proc/meminfo") as fh:
            total = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
        host = replace(host, memory_gib=total / 2**20)
    except (OSError, StopIteration, ValueError):
        pass
    name = f"{base.name}-calibrated"
    return replace(base, name=name, gpu=gpu, host=host, link=link, switches=switches,
                   notes=f"calibrated on this machine by slidedp calibrate from {base.name}"), report


def layer_benchmarks(m: Measurements, model: str, quick: bool, progress: Progress | None = None) -> None:
    """Forward and backward time of one decoder layer of ``model`` against tokens and sequence length, on the
    device the runtime would use (CUDA when present, else CPU in fp32), through the runtime's own layer call.
    Backward = (forward + backward) - forward, with weight and input gradients as in training."""
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    adapter = ModelAdapter(load_hf_config(model))
    unit = adapter.units[1]
    layer = adapter.layer_module(unit)
    flat = (torch.randn(unit.numel, dtype=dtype, device=device) * 0.02).requires_grad_()
    rotary = adapter.rotary(device)
    grid = [(64, 1), (64, 4), (256, 1), (256, 2)] if quick else [(1024, 1), (1024, 8), (4096, 1), (4096, 4),
                                                                 (16384, 1), (32768, 1)]
    for i, (seq, batch) in enumerate(grid):
        x = torch.randn(batch, seq, adapter.config.hidden_size, dtype=dtype, device=device, requires_grad=True)
        pos = torch.arange(seq, device=device).unsqueeze(0)
        pe = rotary(x, pos)

        def run(backward: bool, x=x, pos=pos, pe=pe):
            with torch.set_grad_enabled(backward):
                params = {p.name: flat[p.offset:p.offset + p.numel].view(p.shape) for p in unit.params}
                out = torch.func.functional_call(layer, params, (x,), {"attention_mask": None,
                                                                       "position_embeddings": pe, "position_ids": pos})
                out = out[0] if isinstance(out, tuple) else out
                if backward:
                    torch.autograd.grad(out, [x, flat], torch.ones_like(out))
            if cuda:
                torch.cuda.synchronize()
        repeats = 2 if quick else 5
        fwd = _median_time(lambda: run(False), repeats)
        both = _median_time(lambda: run(True), repeats)
        m.layer.append((model, seq, batch * seq, fwd, max(both - fwd, 1e-9)))
        if progress:
            progress(i + 1, len(grid))


def compute_profile(gpu, samples: list[tuple[str, int, int, float, float]]):
    """Fit the GPUSpec compute model to the layer timings (see layer_benchmarks): the forward model first,
    then the backward/forward ratios of linears and attention against the fitted forward components."""
    specs = {name: load_model_spec(name) for name in {s[0] for s in samples}}
    lin = [specs[name].layer_linear_flops_per_token() * tokens for name, _, tokens, _, _ in samples]
    att = [specs[name].layer_attention_flops_per_token(seq) * tokens for name, seq, tokens, _, _ in samples]
    tokens = [t for _, _, t, _, _ in samples]
    fit = fit_compute(lin, att, tokens, [s[3] for s in samples])
    gpu = replace(gpu, matmul_tflops=fit.matmul_tflops, attention_tflops=fit.attention_tflops,
                  half_efficiency_tokens=fit.half_efficiency_tokens, layer_overhead_us=fit.overhead_s * 1e6)
    lin_s = [gpu.linear_time(f, t) for f, t in zip(lin, tokens, strict=True)]
    att_s = [gpu.attention_time(f) for f in att]
    back = fit_backward_ratios(lin_s, att_s, [s[4] for s in samples], fit.overhead_s)
    gpu = replace(gpu, backward_linear_ratio=back.linear_ratio, backward_attention_ratio=back.attention_ratio)
    return gpu, {"matmul_tflops": fit.matmul_tflops, "attention_tflops": fit.attention_tflops,
                 "half_efficiency_tokens": fit.half_efficiency_tokens, "residual": fit.residual,
                 "backward_linear_ratio": back.linear_ratio, "backward_attention_ratio": back.attention_ratio,
                 "backward_residual": back.residual, "models": sorted(specs)}
