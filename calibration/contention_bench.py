"""Host DRAM under contention (CUDA hosts): the CPU AdamW pass alone and while H2D and D2H copies run on their own
streams the whole time, and the copies' rates during the pass.

Why it is measured: no single benchmark saturates host DRAM (the AdamW pass alone is bound by the cores, a copy
by the PCIe link), so the capacity the simulator shares between the CPU passes and DMA can only be read off a run
of both at once. On the H200 host the pass and the copies together moved 161 GB/s where the busiest single
benchmark moved 127 (benchmarks/RESULTS.md, "Host contention"). ``benchmarks.contention`` uses the same
primitives for its held-out experiments.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import torch

from slidedp.calibration.measurements import Measurements, torch_threads

PIECE_BYTES = 2**30  # one copy: long enough that launch gaps do not matter, short enough to stop promptly


@dataclass
class ContentionRig:
    """Buffers and streams for the experiments: an AdamW pass over ``params`` fp32 parameters (the runtime's
    one-pass kernel, bf16 gradient/weight slot) and pinned 1 GiB copies in each direction."""

    params: int

    def __post_init__(self) -> None:
        from slidedp.runtime.cpu_adam import fused_kernel
        from slidedp.runtime.host_state import host_buffer, placed_copy

        self.kernel = fused_kernel()
        n = self.params
        self.p, self.slot = placed_copy(torch.randn(n)), placed_copy(torch.randn(n).bfloat16())
        self.m, self.v = host_buffer(n, torch.float32), host_buffer(n, torch.float32)
        self.step = 0
        piece = PIECE_BYTES
        self.host_src = torch.empty(piece, dtype=torch.uint8, pin_memory=True)
        self.host_dst = torch.empty(piece, dtype=torch.uint8, pin_memory=True)
        self.dev = {d: torch.empty(piece, dtype=torch.uint8, device="cuda") for d in ("h2d", "h2d_b", "d2h")}
        self.streams = {d: torch.cuda.Stream() for d in self.dev}

    @property
    def adam_bytes_per_param(self) -> int:
        """DRAM bytes the pass moves per parameter: read p, m, v, g; write p, m, v, bf16 weight (or the torch
        path's fp32 gradient and separate cast)."""
        from slidedp.resources import adam_host_bytes_per_param

        return adam_host_bytes_per_param(2, self.kernel is not None)

    def adam(self, threads: int | None = None) -> float:
        """Seconds of one AdamW pass (``threads`` intra-op threads, default: as set)."""
        self.step += 1
        with torch_threads(threads):
            t0 = time.perf_counter()
            if self.kernel is not None:
                self.kernel.adamw_bf16(self.p, self.m, self.v, self.slot, 1e-5, 0.9, 0.95, 1e-8, 0.0,
                                       float(self.step), 1.0)
            else:
                g = self.slot.float()
                torch._fused_adamw_([self.p], [g], [self.m], [self.v], [], [torch.tensor(float(self.step))],
                                    lr=1e-5, beta1=0.9, beta2=0.95, weight_decay=0.0, eps=1e-8, amsgrad=False,
                                    maximize=False)
                self.slot.copy_(self.p)
            return time.perf_counter() - t0

    def copies(self, directions: tuple[str, ...], stop: threading.Event | None = None,
               seconds: float = 0.0, blocking: bool = False) -> dict[str, float]:
        """Copy 1 GiB pieces back to back in each of ``directions`` ("h2d", "h2d_b" = a second H2D stream,
        "d2h") until ``stop`` is set (or for ``seconds``); GB/s of each. The wait for each round spins in
        ``torch.cuda.synchronize``, or with ``blocking`` sleeps on a blocking CUDA event per stream (which frees
        the core: benchmarks.contention_spread compares the two)."""
        moved = dict.fromkeys(directions, 0)
        done = torch.cuda.Event(blocking=True) if blocking else None
        t0 = time.perf_counter()
        while (stop is None and time.perf_counter() - t0 < seconds) or (stop is not None and not stop.is_set()):
            for d in directions:
                with torch.cuda.stream(self.streams[d]):
                    if d == "d2h":
                        self.host_dst.copy_(self.dev[d], non_blocking=True)
                    else:
                        self.dev[d].copy_(self.host_src, non_blocking=True)
                moved[d] += PIECE_BYTES
            if done is None:
                torch.cuda.synchronize()
            else:
                for d in directions:
                    done.record(self.streams[d])
                    done.synchronize()
        dt = time.perf_counter() - t0
        return {d: b / dt / 1e9 for d, b in moved.items()}

    def adam_during(self, directions: tuple[str, ...], threads: int | None = None) -> tuple[float, dict]:
        """One pass while ``directions`` copy the whole time (started 0.2 s before it): the pass's seconds and
        the copies' GB/s over the window."""
        stop, result = threading.Event(), {}
        worker = threading.Thread(target=lambda: result.update(rates=self.copies(directions, stop)))
        worker.start()
        time.sleep(0.2)  # copies at full rate before the pass starts
        try:
            seconds = self.adam(threads)
        finally:
            stop.set()
            worker.join()
        return seconds, result.get("rates", {})

    def copies_during_adam(self, directions: tuple[str, ...], threads: int | None = None) -> dict[str, float]:
        """The copies' GB/s while one pass runs (the kernel releases the GIL; copies stop when it ends)."""
        stop = threading.Event()
        t = threading.Thread(target=lambda: (self.adam(threads), stop.set()))
        t.start()
        rates = self.copies(directions, stop)
        t.join()
        return rates


def contention_grid_threads(cores: int, quick: bool) -> list[int]:
    """Thread counts below ``cores`` at which the pass and the copies are timed together: 3/4, 1/2, 1/4 and 1/8
    of the cores (1/2 only with --quick), so both slowdown curves have points across the pass's DRAM traffic."""
    fractions = (0.5,) if quick else (0.75, 0.5, 0.25, 0.125)
    return sorted({max(1, round(cores * f)) for f in fractions} - {cores}, reverse=True)


def contention_benchmark(m: Measurements, quick: bool) -> None:
    """The pass alone, with H2D only, D2H only and both copying, and the copies' rates during it with both (at
    every core and at fewer threads): what ``profile_fit.contention_host`` turns into the DRAM capacity, the
    interference factors, the copies' slowdown curve and the CPU passes' DRAM weight."""
    if not torch.cuda.is_available():
        return
    rig = ContentionRig(2**25 if quick else 2**28)
    repeats = 2 if quick else 3
    rig.adam()  # warm-up: pages touched, threads started
    rig.copies(("h2d", "d2h"), seconds=0.3)
    out: dict[str, float] = {"params": rig.params, "adam_bytes_per_param": rig.adam_bytes_per_param,
                             "threads": torch.get_num_threads()}
    spread: dict[str, float] = {}

    def timed(key: str, samples: list[float]) -> None:
        out[key], spread[key] = statistics.median(samples), repeat_spread(samples)

    timed("adam_alone_s", [rig.adam() for _ in range(repeats)])
    for key, dirs in (("h2d", ("h2d",)), ("d2h", ("d2h",)), ("h2d+d2h", ("h2d", "d2h"))):
        timed(f"adam_with_{key}_s", [rig.adam_during(dirs)[0] for _ in range(repeats)])
    # The copies' rate over the pass alone (they start and stop with it), not over adam_during's longer window.
    timed("dma_gbps_with_adam", [sum(rig.copies_during_adam(("h2d", "d2h")).values()) for _ in range(repeats)])
    timed("dma_gbps_alone", [sum(rig.copies(("h2d", "d2h"), seconds=1.0).values()) for _ in range(repeats)])
    # The pass and the copies together at fewer threads (less DRAM traffic): how both slowdowns depend on the
    # pass's traffic, which one all-core point cannot give (profile_fit.copy_slowdown_curve,
    # profile_fit.interference_curve).
    # Five repeats each: the pass's factor with copies scattered 1.32-1.54 over c35's grid at three.
    grid_repeats = 2 if quick else 5
    for t in contention_grid_threads(out["threads"], quick):
        timed(f"adam{t}_alone_s", [rig.adam(t) for _ in range(grid_repeats)])
        timed(f"adam{t}_with_h2d+d2h_s", [rig.adam_during(("h2d", "d2h"), t)[0] for _ in range(grid_repeats)])
        timed(f"dma_gbps_with_adam{t}", [sum(rig.copies_during_adam(("h2d", "d2h"), t).values())
                                         for _ in range(grid_repeats)])
    adam_gbps = rig.params * rig.adam_bytes_per_param / out["adam_with_h2d+d2h_s"] / 1e9
    out["total_gbps"] = adam_gbps + out["dma_gbps_with_adam"]
    m.contention = out
    m.report["contention"] = {k: round(v, 4) for k, v in out.items()}
    # How far each experiment's repeats ranged: what a contention prediction on this host can be held to. The
    # pass beside both copies at 6 threads ran 1.45-1.72x its time alone over six rounds on one machine (c41),
    # and 1.83x in the median of three on another (c40; benchmarks/RESULTS.md).
    m.report["contention_repeat_spread"] = {k: round(v, 3) for k, v in spread.items()}


def repeat_spread(samples: list[float]) -> float:
    """The largest repeat over the smallest, less one (0.12: the repeats ranged 12%); 0 for one sample."""
    return max(samples) / min(samples) - 1 if len(samples) > 1 and min(samples) > 0 else 0.0
