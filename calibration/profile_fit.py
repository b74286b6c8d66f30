"""Turn ``Measurements`` into a ``HardwareProfile``: every field the micro-benchmarks cover is refitted, the rest
kept from the base profile. No benchmarking here, so the fit can be tested on synthetic measurements.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import replace

from slidedp.calibration.fits import fit_backward_ratios, fit_compute, fit_link, thread_curve
from slidedp.calibration.measurements import Measurements
from slidedp.calibration.shape_fit import ShapeSamples, fit_curves
from slidedp.chips import CHIPS
from slidedp.errors import SlideDPError
from slidedp.hardware import HardwareProfile, HostSpec, SwitchSpec
from slidedp.model_spec import load_model_spec
from slidedp.resources import ADAM_HOST_BYTES_BASE, FUSED_ADAM_HOST_BYTES, adam_host_bytes_per_param


def dram_capacity_gbps(m: Measurements) -> float:
    """Host DRAM capacity as the most traffic any measurement pushed through it: the copy pass, the AdamW pass
    (rate x bytes it reads and writes per parameter), H2D + D2H DMA at once, or (on CUDA hosts, the one that
    counts) the AdamW pass and both copy directions together (``contention_bench``).

    No one benchmark saturates DRAM: a copy at 16 threads is limited by the cores' load/store rate (and
    counts no write-allocate reads), so taking it alone under-states DRAM by ~2x on the H200 host and makes
    the simulator charge DMA/optimizer contention that does not happen (validation MAPE 20.9% vs 9.9%)."""
    bytes_per_param = FUSED_ADAM_HOST_BYTES if m.adam_fused_cast else ADAM_HOST_BYTES_BASE + 4
    candidates = [max(m.stream_gbps.values(), default=0.0),
                  max(m.adam_gparams_per_s.values(), default=0.0) * bytes_per_param,
                  duplex_gbps(m) or 0.0,
                  m.contention.get("total_gbps", 0.0)]
    return max(candidates)


def duplex_gbps(m: Measurements) -> float | None:
    """H2D + D2H at once, both directions' GB/s together: the PCIe benchmark's, else the contention benchmark's
    copies alone (the same two copies, timed before its AdamW pass joins them). Without the second, a CPU-side
    calibration kept another machine's cap: c23's H100 host moved 73.5 GB/s both ways where h200-x1 says 101.1,
    and its held-out copy experiments were predicted 35% fast (benchmarks/RESULTS.md, "Held-out contention")."""
    return m.duplex_gbps or m.contention.get("dma_gbps_alone") or None


def contention_host(c: dict[str, float], hw: HardwareProfile) -> HostSpec:
    """``hw``'s host with its contention fitted from ``contention_bench``'s measurements on it (its DRAM capacity,
    PCIe links and AdamW curve already this host's): interference factors, the copies' slowdown curve and the CPU
    passes' DRAM weight.

    A factor is the pass's time with copies running in those directions over its time alone (at least 1). The
    slowdown curve is :func:`copy_slowdown_curve`. The weight is then fitted through the simulator's own sharing
    (:func:`fit_cpu_dram_weight`), so that the calibration experiment it came from is reproduced."""
    alone = c["adam_alone_s"]
    factors = {dirs: max(1.0, round(c[f"adam_with_{dirs}_s"] / alone, 3)) for dirs in ("h2d", "d2h", "h2d+d2h")
               if c.get(f"adam_with_{dirs}_s")}
    host = replace(hw.host, dma_interference=factors, copy_slowdown=copy_slowdown_curve(c, hw.host),
                   dma_interference_curve=interference_curve(c, hw.host))
    return replace(host, cpu_dram_weight=fit_cpu_dram_weight(replace(hw, host=host), c))


def _by_thread_count(c: dict[str, float], factor_at: Callable[[str], float | None],
                     host: HostSpec | None) -> dict[int, float]:
    """A slowdown curve keyed by the pass's DRAM traffic alone (GB/s) at each thread count timed (the all-core
    run, prefix "", and each ``adam<T>_alone_s``): ``factor_at(prefix)`` at least 1, thread counts whose passes
    move the same whole GB/s averaged. Empty without the pass's size.

    The traffic is ``host``'s AdamW rate at that thread count times the pass's bytes, the scale the simulator
    looks the curve up in (sim.fluid takes a pass's traffic from that rate curve), so a pass of T threads timed
    alone, as in the contention experiments, finds the point measured at T; the pass's own time here is only the
    fallback without ``host``. Inside a training step the update's rate is divided by ``step_update_factor`` (it
    runs slower there, so it also moves DRAM slower) and it finds a lower point, by the same rule. Keyed by the timed
    pass instead, the lookups were shifted: on a lent H100 host the 2**28-parameter pass ran 6-10% below the
    calibration's 64M-parameter rates, and a 9-thread pass found the 12-thread point (benchmarks/RESULTS.md,
    c35)."""
    per_param, params = c.get("adam_bytes_per_param"), c.get("params")
    if not (per_param and params):
        return {}
    prefixes = [""] + [key[4:-8] for key in c if key.startswith("adam") and key.endswith("_alone_s")
                       and key[4:-8].isdigit()]
    by_traffic: dict[int, list[float]] = {}
    for t in prefixes:
        seconds, factor = c.get(f"adam{t}_alone_s"), factor_at(t)
        threads = int(t or c.get("threads") or 0)
        # Whole GB/s rounded down: the point's own pass, looked up, is at or beyond its key (beyond the top key the
        # curve is flat, so the all-core pass gets exactly the all-core factor).
        if host is not None and threads > 0:
            gbps = host.adam_rate(threads) * per_param / 1e9
        else:
            gbps = params * per_param / seconds / 1e9 if seconds else 0.0
        traffic = math.floor(gbps * (1 + 1e-9))  # 119.99999 from a division is 120
        if factor and traffic > 0:
            by_traffic.setdefault(traffic, []).append(max(1.0, factor))
    return {gbps: round(sum(f) / len(f), 3) for gbps, f in sorted(by_traffic.items())}


def copy_slowdown_curve(c: dict[str, float], host: HostSpec | None = None) -> dict[int, float]:
    """The copies' slowdown beside the pass (HostSpec.copy_slowdown): at each thread count timed, their rate alone
    over their rate during the pass. Empty where the copies were not timed beside the pass."""
    alone = c.get("dma_gbps_alone")

    def factor(t: str) -> float | None:
        during = c.get(f"dma_gbps_with_adam{t}")
        return alone / during if alone and during else None

    return _by_thread_count(c, factor, host)


def interference_curve(c: dict[str, float], host: HostSpec | None = None) -> dict[int, float]:
    """The pass's slowdown with both copy directions running (HostSpec.dma_interference_curve): at each thread
    count timed, its time with them over its time alone. Empty with the all-core point only (it is then
    dma_interference itself, and a curve of one point would scale nothing)."""
    def factor(t: str) -> float | None:
        alone, with_copies = c.get(f"adam{t}_alone_s"), c.get(f"adam{t}_with_h2d+d2h_s")
        return with_copies / alone if alone and with_copies else None

    curve = _by_thread_count(c, factor, host)
    return curve if len(curve) > 1 else {}


CPU_DRAM_WEIGHT_RANGE = (1.0, 100.0)  # what slidedp.hardware accepts


def fit_cpu_dram_weight(hw: HardwareProfile, c: dict[str, float]) -> float:
    """The smallest CPU-pass DRAM weight with which the simulator (sim.fluid.pass_beside_copies), running the
    calibration's AdamW pass at its thread count beside H2D and D2H, gives the copies no more than they measured
    during it; where even the largest weight leaves them more (the pass is then at its interference limit and
    the copies get what DRAM leaves), the smallest weight that puts the pass there.

    Why fitted through the model and not read off one ratio: the earlier rule (copies' rate alone over their
    rate during the pass) was not what the sharing needs. On c23's H100 host it gave 1.444, with which the
    simulator re-running its own calibration experiment gave the copies 68 GB/s where 51 were measured, and
    the held-out experiments missed by 15-26% (benchmarks/RESULTS.md, "Fourteenth session")."""
    from slidedp.sim.fluid import pass_beside_copies

    target = c.get("dma_gbps_with_adam")
    if not target:
        return 1.0
    threads = int(c.get("threads") or hw.host.cores)  # older measurements: the pass ran on every core
    per_param = c.get("adam_bytes_per_param") or adam_host_bytes_per_param(2, hw.host.fused_cast)
    pass_bytes, cap = per_param * c.get("params", 2**28), hw.host.adam_rate(threads) * per_param

    def copies_gbps(weight: float) -> float:
        run = pass_beside_copies(replace(hw, host=replace(hw.host, cpu_dram_weight=weight)), pass_bytes, cap,
                                 ("h2d", "d2h"))
        return (run["h2d"] + run["d2h"]) / 1e9

    lo, hi = CPU_DRAM_WEIGHT_RANGE
    goal = max(target, copies_gbps(hi)) * (1 + 1e-4)
    if copies_gbps(lo) <= goal:
        return lo
    for _ in range(40):  # copies' share falls as the weight grows: bisect (geometrically) for the smallest
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if copies_gbps(mid) <= goal else (mid, hi)
    return round(hi, 3)


def _dram_capacity(base: HardwareProfile, m: Measurements) -> float:
    """--quick's host passes fit the CPU caches and say nothing of DRAM; its contention run does not (its arrays
    are hundreds of MB), so it alone sets the capacity there, and the base's value stays without it."""
    if not m.cache_resident:
        return dram_capacity_gbps(m)
    return m.contention["total_gbps"] if m.contention else base.host.mem_bw_gbps


# What a fitted value may be before it is believed: a GPU's backward costs 1.5x-4x its forward (weight and
# input gradients, attention recomputation), and a fit that runs into the optimizer's bound found nothing.
BACKWARD_RATIO_RANGE = (1.5, 4.0)
RATE_BOUND_TFLOPS = 1e4


def profile_from(base: HardwareProfile, m: Measurements) -> tuple[HardwareProfile, dict]:
    """``base`` with every field these measurements cover replaced; the report holds the fit residuals and,
    under ``warnings``, one line per fit that was not credible (its fields then keep the base's values)."""
    warnings: list[str] = list(m.report.get("warnings", []))
    peers = {**base.host.peer_adam_gparams_per_s,
             **{impl: thread_curve(curve, curve.values()) for impl, curve in m.peer_adam_gparams_per_s.items()}}
    host = replace(base.host, cores=os.cpu_count() or base.host.cores,
                   stream_gbps=thread_curve(m.stream_gbps, m.stream_gbps.values()),
                   adam_gparams_per_s=thread_curve(m.adam_gparams_per_s, m.adam_gparams_per_s.values()),
                   cast_gelems_per_s=thread_curve(m.cast_gelems_per_s, m.cast_gelems_per_s.values()),
                   mem_bw_gbps=_dram_capacity(base, m), fused_cast=m.adam_fused_cast,
                   peer_adam_gparams_per_s=peers,
                   state_update_gparams_per_s={**base.host.state_update_gparams_per_s,
                                               **{mode: thread_curve(curve, curve.values())
                                                  for mode, curve in m.state_update_gparams_per_s.items()}})
    if m.cache_resident and not m.contention:
        warnings.append(f"host DRAM capacity: the --quick passes fit the CPU caches; kept "
                        f"{base.host.mem_bw_gbps:g} GB/s from {base.name}")
    gpu = base.gpu
    report = dict(m.report)
    report["mem_bw_gbps"] = host.mem_bw_gbps
    for table, field_name in ((m.h2d, "h2d_gbps"), (m.d2h, "d2h_gbps")):
        if len(table) >= 2:
            try:
                fit = fit_link(list(table), list(table.values()))
            except SlideDPError as exc:
                warnings.append(f"{field_name}: {exc}; kept {getattr(gpu, field_name)} from {base.name}")
                continue
            gpu = replace(gpu, **{field_name: fit.bandwidth_Bps / 1e9, "pcie_latency_us": fit.latency_s * 1e6})
            report[field_name] = {"value": fit.bandwidth_Bps / 1e9, "latency_us": fit.latency_s * 1e6,
                                  "residual": fit.residual}
    duplex = duplex_gbps(m)
    if duplex:
        gpu = replace(gpu, duplex_gbps=duplex)
        report["duplex_gbps"] = duplex
    if m.gpu_adam_gparams_per_s:
        gpu = replace(gpu, adam_gparams_per_s=m.gpu_adam_gparams_per_s)
        report["gpu_adam_gparams_per_s"] = m.gpu_adam_gparams_per_s
    if m.layer:
        gpu, report["compute"] = compute_profile(gpu, m.layer, warnings)
    if m.shapes is not None and m.shapes.gemm:
        gpu, report["compute_curves"] = compute_curves_profile(gpu, m.shapes, warnings)
    link, switches = base.link, base.switches
    collective_fits = {}
    for op, t in m.collectives.items():
        if len(t) >= 2:
            try:
                collective_fits[op] = fit_link(list(t), list(t.values()))
            except SlideDPError as exc:
                warnings.append(f"{op} link: {exc}; kept the link from {base.name}")
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
    if m.contention:  # last: the weight is fitted through the simulator on this host's links and DRAM
        host = contention_host(m.contention, replace(base, gpu=gpu, host=host, link=link, switches=switches))
    try:
        with open("/proc/meminfo") as fh:
            total = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
        host = replace(host, memory_gib=total / 2**20)
    except (OSError, StopIteration, ValueError):
        pass
    report["warnings"] = warnings
    name = f"{base.name}-calibrated"
    return replace(base, name=name, gpu=gpu, host=host, link=link, switches=switches,
                   notes=f"calibrated on this machine by slidedp calibrate from {base.name}"), report


def compute_profile(gpu, samples: list[tuple[str, int, int, float, float]], warnings: list[str] | None = None):
    """Fit the GPUSpec compute model to the layer timings (see layer_benchmarks): the forward model first,
    then the backward/forward ratios of linears and attention against the fitted forward components.

    A forward fit that fails or runs into a rate bound keeps ``gpu``'s compute fields; backward ratios
    outside BACKWARD_RATIO_RANGE keep ``gpu``'s ratios; each case adds one line to ``warnings``."""
    warnings = [] if warnings is None else warnings
    specs = {name: load_model_spec(name) for name in {s[0] for s in samples}}
    lin = [specs[name].layer_linear_flops_per_token() * tokens for name, _, tokens, _, _ in samples]
    att = [specs[name].layer_attention_flops_per_token(seq) * tokens for name, seq, tokens, _, _ in samples]
    tokens = [t for _, _, t, _, _ in samples]
    try:
        fit = fit_compute(lin, att, tokens, [s[3] for s in samples])
    except SlideDPError as exc:
        warnings.append(f"layer compute: {exc}; kept the compute model of the base profile")
        return gpu, {"models": sorted(specs), "credible": False}
    bounded = [n for n, v in (("matmul_tflops", fit.matmul_tflops), ("attention_tflops", fit.attention_tflops))
               if v >= 0.99 * RATE_BOUND_TFLOPS]
    if bounded:
        warnings.append(f"layer compute: {', '.join(bounded)} ran into the fit's bound ({RATE_BOUND_TFLOPS:g} "
                        f"TFLOP/s): the timings do not constrain it; kept the compute model of the base profile")
        return gpu, {"models": sorted(specs), "credible": False, "residual": fit.residual}
    gpu = replace(gpu, matmul_tflops=fit.matmul_tflops, attention_tflops=fit.attention_tflops,
                  half_efficiency_tokens=fit.half_efficiency_tokens, layer_overhead_us=fit.overhead_s * 1e6)
    lin_s = [gpu.linear_time(f, t) for f, t in zip(lin, tokens, strict=True)]
    att_s = [gpu.attention_time(f) for f in att]
    back = fit_backward_ratios(lin_s, att_s, [s[4] for s in samples], fit.overhead_s)
    lo, hi = BACKWARD_RATIO_RANGE
    if all(lo <= r <= hi for r in (back.linear_ratio, back.attention_ratio)):
        gpu = replace(gpu, backward_linear_ratio=back.linear_ratio, backward_attention_ratio=back.attention_ratio)
    else:
        warnings.append(f"layer compute: backward/forward ratios {back.linear_ratio:.3g} (linears) and "
                        f"{back.attention_ratio:.3g} (attention) lie outside {lo}-{hi}; kept "
                        f"{gpu.backward_linear_ratio:.3g} and {gpu.backward_attention_ratio:.3g}")
    return gpu, {"matmul_tflops": fit.matmul_tflops, "attention_tflops": fit.attention_tflops,
                 "half_efficiency_tokens": fit.half_efficiency_tokens, "residual": fit.residual,
                 "backward_linear_ratio": back.linear_ratio, "backward_attention_ratio": back.attention_ratio,
                 "backward_residual": back.residual, "models": sorted(specs)}


# The fitted families of ComputeCurves: a family whose value is not credible falls back to the base as a whole.
CURVE_FAMILIES: dict[str, tuple[str, ...]] = {
    "GEMM": ("gemm_tflops", "gemm_half_m", "gemm_half_n", "gemm_half_k", "kernel_us"),
    "attention": ("attention_fwd_tflops", "attention_bwd_tflops", "attention_half_seq", "attention_fwd_us",
                  "attention_bwd_us"),
    "memory-bound": ("memory_gbps", "memory_gbps_by_kind", "memory_kernel_us"),
}
# What only timed decoder-layer passes fit (``calibrate --model M``): the CPU's dispatch floor and the fixed cost
# of a pass. Without such samples the fit has no say in them, so the base profile's stand.
LAYER_PASS_FIELDS = ("layer_dispatch_us", "layer_overhead_us", "backward_dispatch_us", "backward_overhead_us")


def compute_curves_profile(gpu, samples: ShapeSamples, warnings: list[str]):
    """Fit the shape-aware compute curves (gpu.compute); the chip's datasheet limits bound what is credible
    (a GPU slidedp.chips does not know is bounded by twice the fastest sample)."""
    chip = CHIPS.get(gpu.name)
    if chip is not None:
        peak_tflops, peak_gbps = chip.bf16_dense_tflops, chip.memory_gbps
    else:
        peak_tflops = 2 * max(op.flops / t for op, t in samples.gemm) / 1e12
        peak_gbps = 2 * max((op.nbytes / t for op, t in samples.elementwise), default=1e12) / 1e9
    try:
        fit = fit_curves(samples, peak_tflops, peak_gbps)
    except SlideDPError as exc:
        warnings.append(f"compute curves: {exc}; kept those of the base profile")
        return gpu, {"credible": False}
    warnings.extend(f"compute curves: {w}" for w in fit.warnings)
    curves = fit.curves
    if gpu.compute is not None:  # a family whose fit is not credible keeps the base profile's parameters
        for family, fields in CURVE_FAMILIES.items():
            if any(w.startswith(name) and "not credible" in w for w in fit.warnings for name in fields):
                curves = replace(curves, **{name: getattr(gpu.compute, name) for name in fields})
                warnings.append(f"compute curves: kept the {family} parameters of the base profile")
        if not samples.layers:
            curves = replace(curves, **{name: getattr(gpu.compute, name) for name in LAYER_PASS_FIELDS})
            warnings.append("compute curves: no decoder-layer passes timed (calibrate --model M times them): kept "
                            "the base profile's dispatch floor and pass costs")
    return replace(gpu, compute=curves), {"residuals": fit.residuals, "peak_tflops": peak_tflops,
                                          "peak_memory_gbps": peak_gbps}
