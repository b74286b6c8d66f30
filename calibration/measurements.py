"""What the micro-benchmarks measured, and the timing helpers they share.

Kept apart from the benchmarks so the profile fit (``profile_fit``) and tests can build ``Measurements``
without importing the host or GPU benchmark code.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from slidedp.calibration.shape_fit import ShapeSamples

Progress = Callable[[int, int], None]


@dataclass
class Measurements:
    """Raw results of the micro-benchmarks, in the units each benchmark reports (see the field comments)."""

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
    # Operations timed over a grid of shapes (calibration.shape_bench): the GPU's shape-aware compute curves.
    shapes: ShapeSamples | None = None
    # The host passes ran on arrays small enough to live in the CPU caches (--quick): their rates are real
    # for the kernels, but they say nothing about DRAM capacity.
    cache_resident: bool = False
    # The AdamW pass with H2D + D2H copying (calibration.contention_bench): seconds, GB/s of each and in total.
    contention: dict[str, float] = field(default_factory=dict)
    # The peers' CPU AdamW implementations (calibration.peer_bench): implementation -> threads -> G params/s.
    peer_adam_gparams_per_s: dict[str, dict[int, float]] = field(default_factory=dict)
    # The compact host-state modes' one-pass update (calibration.host_bench): mode name -> threads -> G params/s.
    state_update_gparams_per_s: dict[str, dict[int, float]] = field(default_factory=dict)
    report: dict = field(default_factory=dict)


def median_time(fn: Callable[[], None], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls, after one untimed warm-up call."""
    fn()  # warm-up: page faults, thread pool start
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@contextmanager
def torch_threads(threads: int | None = None) -> Iterator[None]:
    """Run the block at ``threads`` intra-op threads (None: as set), then restore the count found on entry.

    torch's count is process-wide, and a benchmark that times one thread count must not leave it changed for the
    next benchmark or for the caller; ``torch.set_num_threads`` inside the block is restored too.
    """
    import torch  # here, so the profile fit and tests read Measurements without loading torch

    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
