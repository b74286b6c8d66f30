"""Host micro-benchmarks: DRAM traffic of a streaming copy, the CPU AdamW update (the runtime's kernel where it
compiles, torch's fused AdamW otherwise) and the fp32 -> bf16 cast, each against thread count; the update
against chunk size with bf16 and with fp32 gradients (per-call overhead + rate fits); the update of each
compact host-state mode against thread count (host.state_update_gparams_per_s).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from slidedp.calibration.fits import fit_link
from slidedp.calibration.measurements import Measurements, Progress, median_time, torch_threads
from slidedp.calibration.rate_checks import combine, spread, unsettled, warning
from slidedp.errors import SlideDPError

# Interleaved rounds of the host passes (timed_rounds): three full rounds let one busy round in three pass
# without moving the median; up to two more re-time only the points still unsettled.
HOST_ROUNDS = 3
QUICK_ROUNDS = 2
EXTRA_ROUNDS = 2


def thread_counts(cores: int) -> list[int]:
    counts = {1, cores}
    t = 2
    while t < cores:
        counts.add(t)
        t *= 2
    return sorted(counts)


def peer_thread_counts() -> list[int]:
    """Thread counts the peers' optimizers are timed at (each in its own process, so fewer than ours):
    a quarter, half and all of the cores."""
    cores = os.cpu_count() or 1
    return sorted({max(1, cores // 4), max(1, cores // 2), cores})


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


def timed_rounds(rates: dict[str, Callable[[], float]], counts: list[int], rounds: int, extra_rounds: int,
                 progress: Progress | None = None) -> dict[str, dict[int, list[float]]]:
    """Each benchmark's rate (``rates[name]()``, timed at the thread count set around it) at every count, in
    ``rounds`` rounds that each visit every count once, so a busy minute touches one value of several points
    rather than every value of one; then up to ``extra_rounds`` more rounds over the counts still unsettled
    (calibration.rate_checks.judge: rounds that disagree, or a dip). Returns name -> threads -> one value per round."""
    values: dict[str, dict[int, list[float]]] = {name: {t: [] for t in counts} for name in rates}

    total = rounds + extra_rounds  # the bar's length counts the extra rounds that may come; it ends full
    for i in range(rounds):
        for threads in counts:
            with torch_threads(threads):
                for name, rate in rates.items():
                    values[name][threads].append(rate())
        if progress:
            progress(i + 1, total)
    for k in range(extra_rounds):
        redo = {name: unsettled(curve) for name, curve in values.items()}
        if not any(redo.values()):
            break
        for threads in sorted({t for ts in redo.values() for t in ts}):
            with torch_threads(threads):
                for name in rates:
                    if threads in redo[name]:  # only what is unsettled: a settled pass keeps its rounds
                        values[name][threads].append(rates[name]())
        if progress:
            progress(rounds + k + 1, total)
    if progress:
        progress(total, total)
    return values


def host_benchmarks(quick: bool, progress: Progress | None = None) -> Measurements:
    from slidedp.calibration.cpu_topology import probe_layout
    from slidedp.runtime.cpu_adam import fused_kernel
    from slidedp.runtime.host_state import host_buffer, placed_copy

    n = 4_000_000 if quick else 64_000_000
    m = Measurements(cache_resident=quick)
    # Whether this host's vCPUs are whole cores (calibration/cpu_topology.py, a few seconds): the report says
    # what kind of cores measured the rates below.
    m.report["cpu_cores"] = probe_layout(seconds=0.05 if quick else 0.15).describe()
    repeats = 2 if quick else 5
    src, p, slot = placed_copy(torch.randn(n)), placed_copy(torch.randn(n)), placed_copy(torch.randn(n).bfloat16())
    dst, mom, var = (host_buffer(n, torch.float32) for _ in range(3))
    bf16 = host_buffer(n, torch.bfloat16)
    kernel = fused_kernel()
    update = _adam_update(kernel, p, mom, var, slot)
    counts = thread_counts(os.cpu_count() or 1)
    # Samples per point per round (their median is the round's value): --quick's passes take milliseconds, where
    # thread wake-ups alone spread single samples by tens of percent.
    per_round = 7 if quick else 2
    base_rounds = QUICK_ROUNDS if quick else HOST_ROUNDS
    rounds = timed_rounds({
        "stream_gbps": lambda: 2 * n * 4 / median_time(lambda: dst.copy_(src), per_round) / 1e9,
        "cast_gelems_per_s": lambda: n / median_time(lambda: bf16.copy_(p), per_round) / 1e9,
        "adam_gparams_per_s": lambda: n / median_time(update, per_round) / 1e9,
    }, counts, base_rounds, EXTRA_ROUNDS, progress)
    m.stream_gbps, m.cast_gelems_per_s, m.adam_gparams_per_s = (
        combine(rounds[name]) for name in ("stream_gbps", "cast_gelems_per_s", "adam_gparams_per_s"))
    # The points timed in more rounds than the first ones (re-timed as unsettled), per pass.
    m.report["host_retimed"] = {name: [t for t, v in curve.items() if len(v) > base_rounds]
                                for name, curve in rounds.items()}
    # The largest round-to-round spread of each pass, in percent: how settled the host was while it was timed.
    m.report["host_round_spread_pct"] = {name: round(100 * max(spread(v) for v in curve.values()), 1)
                                         for name, curve in rounds.items()}
    line = warning({"DRAM stream": (rounds["stream_gbps"], "GB/s"), "cast": (rounds["cast_gelems_per_s"], "G/s"),
                    "AdamW": (rounds["adam_gparams_per_s"], "G/s")})
    if line:
        m.report.setdefault("warnings", []).append(line)
    m.state_update_gparams_per_s = state_update_benchmarks(n, repeats, counts)
    m.adam_fused_cast = kernel is not None
    m.report["adam_kernel"] = "one-pass bf16 kernel" if kernel is not None else "torch fused AdamW (fp32 grads)"
    m.report["adam_vs_chunk"] = adam_chunk_benchmarks(quick)
    return m


def adam_chunk_benchmarks(quick: bool) -> dict:
    """Update time per call against chunk size, for bf16 gradients (the runtime's kernel, or torch's path
    when it does not compile) and fp32 gradients (torch's fused AdamW + a cast): t = overhead + n / rate.
    The overhead says how small the runtime's chunks may get before thread start-up dominates."""
    from slidedp.runtime.cpu_adam import fused_kernel
    from slidedp.runtime.host_state import host_buffer, placed_copy

    sizes = [2**14, 2**16, 2**18, 2**20] if quick else [2**16, 2**18, 2**20, 2**22, 2**24]
    n = max(sizes)
    kernel = fused_kernel()
    p, mom, var = placed_copy(torch.randn(n)), host_buffer(n, torch.float32), host_buffer(n, torch.float32)
    grads = {"bf16": placed_copy(torch.randn(n).bfloat16()), "fp32": placed_copy(torch.randn(n))}
    out: dict = {}
    for dtype, grad in grads.items():
        times = {}
        for size in sizes:
            if dtype == "bf16" and kernel is not None:
                update = _adam_update(kernel, p[:size], mom[:size], var[:size], grad[:size])
            else:
                update = _torch_adam_cast(p[:size], mom[:size], var[:size], grad[:size])
            # Small chunks take micro- to milliseconds: a busy machine's noise needs several samples.
            times[size] = median_time(update, 7 if quick else 9)
        seconds = {str(k): v for k, v in times.items()}
        try:
            fit = fit_link(list(times), list(times.values()))
        except SlideDPError as exc:  # noise swamped the sizes: report the timings, fit nothing
            out[f"{dtype}_grads"] = {"seconds": seconds, "fit": f"not credible ({exc})"}
            continue
        out[f"{dtype}_grads"] = {"overhead_us": fit.latency_s * 1e6, "gparams_per_s": fit.bandwidth_Bps / 1e9,
                                 "residual": fit.residual, "seconds": seconds}
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


def compact_state_step(precision, n: int, seed: int = 0):
    """``step(kernel, k)``: update ``k`` of ``n`` parameters held in ``precision`` by ``kernel`` (a build of the
    one-pass kernel, or None: its torch path) as the runtime does it, bf16 gradients in the slot, on a
    zero-initialised HostState allocated here (benchmarks/kernel_ab.py times two builds on the same state)."""
    from slidedp.runtime.compact_adam import AdamScalars, compact_update
    from slidedp.runtime.host_state import HostState

    host = HostState.allocate(n, torch.bfloat16, torch.bfloat16, pin=False, precision=precision)
    host.master.copy_(torch.randn(n))
    host.grad_buffer.copy_(torch.randn(n))
    return lambda kernel, k: compact_update(kernel, host.range(0, n),
                                            AdamScalars(1e-5, 0.9, 0.95, 1e-8, 0.0, k, 1.0, seed))


def compact_state_update(precision, n: int, seed: int = 0):
    """A function that runs one update of ``n`` parameters held in ``precision`` the way the runtime does (the
    one-pass kernel, else its torch path; bf16 gradients in the slot), on a zero-initialised HostState."""
    from slidedp.runtime.cpu_adam import fused_kernel

    step, kernel, count = compact_state_step(precision, n, seed), fused_kernel(), [0]

    def update() -> None:
        count[0] += 1
        step(kernel, count[0])
    return update


def state_update_benchmarks(n: int, repeats: int, counts: list[int]) -> dict[str, dict[int, float]]:
    """G params/s of each compact mode's update (slidedp.state_precision.STATE_CHOICES) against thread count
    (with a bf16 master the slot is not rewritten, so one gradient serves every repeat)."""
    from slidedp.state_precision import STATE_CHOICES

    out: dict[str, dict[int, float]] = {}
    for precision in STATE_CHOICES:
        if precision.is_exact:
            continue  # host.adam_gparams_per_s
        update = compact_state_update(precision, n)
        curve = {}
        for threads in counts:
            with torch_threads(threads):
                curve[threads] = n / median_time(update, repeats) / 1e9
        out[precision.name] = curve
    return out
