"""Which vCPUs of this host share a physical core, measured rather than read from sysfs.

A cloud guest may list 16 cores of one thread each while its vCPUs are the two hyperthreads of 8 physical
cores, and a pass bound by a core's vector units gains nothing from the second thread of a core. The lent hosts
of one machine type ran the compact-state update at 5.1-12.6 G params/s at 16 threads; hyperthread siblings
were one suspect, and this probe found none on the one host it has run on (c23, benchmarks/RESULTS.md
"Thirteenth session's device calls": every pair with vCPU 0 or 1 at 0.98-0.99), where the rate still varied 2x.
`slidedp calibrate` reports what the probe finds, so a profile says what kind of cores measured it.

The probe: a vector-bound loop (fp32 matmul, one intra-op thread) on vCPU p alone, then on p and q at once,
each loop a Python thread pinned to its vCPU (torch releases the GIL inside the matmul). p's rate with q busy
over its rate alone is about 1 for separate cores and about 0.5-0.6 for siblings.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import torch

from slidedp.calibration.measurements import torch_threads

SIBLING_RATIO = 0.8  # p's rate with q busy below this fraction of its rate alone: q shares p's core
MATMUL = 256  # the loop's square fp32 matmul: ~0.5 ms a call, so the GIL between calls costs little


@dataclass(frozen=True)
class CoreLayout:
    """What the probe found: each probed vCPU's rate ratio with every other vCPU busy, the siblings below
    SIBLING_RATIO, and, where the pattern is regular, the pair distance and one vCPU per physical core."""

    vcpus: list[int]
    ratios: dict[int, dict[int, float]] = field(default_factory=dict)
    siblings: dict[int, list[int]] = field(default_factory=dict)
    pair_offset: int | None = None
    one_per_core: list[int] | None = None

    @property
    def cores(self) -> int | None:
        """Physical cores, where the pattern is known."""
        return None if self.one_per_core is None else len(self.one_per_core)

    def describe(self) -> str:
        """One line for calibrate's report."""
        n = len(self.vcpus)
        if self.one_per_core is None:
            return f"{n} vCPUs; the probe's siblings are irregular ({self.siblings}): cores not known"
        if self.pair_offset is None:
            return f"{n} vCPUs, no two of the probed share a core: {n} cores"
        return (f"{n} vCPUs are {self.cores} cores x 2 threads (measured: vCPU c shares a core with c +- "
                f"{self.pair_offset}); a pass bound by the cores' vector units gains nothing from the second "
                f"thread")


def _loop_rate(cpu: int, seconds: float, start: threading.Barrier, out: dict[int, float]) -> None:
    os.sched_setaffinity(threading.get_native_id(), {cpu})
    torch.set_num_threads(1)  # OpenMP's thread count is per thread: a new thread starts at every core
    a = torch.randn(MATMUL, MATMUL)
    c = torch.empty(MATMUL, MATMUL)
    for _ in range(5):
        torch.mm(a, a, out=c)
    start.wait()
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        torch.mm(a, a, out=c)
        n += 1
    out[cpu] = n / elapsed


def rates_together(cpus: list[int], seconds: float) -> dict[int, float]:
    """Each of ``cpus``' loop rate (matmuls/s) while all of them run at once, one thread per vCPU."""
    out: dict[int, float] = {}
    start = threading.Barrier(len(cpus))
    threads = [threading.Thread(target=_loop_rate, args=(c, seconds, start, out)) for c in cpus]
    with torch_threads():  # the loops' setting reaches torch's process-wide count too
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return out


def one_per_core(cpus: list[int], siblings: dict[int, int]) -> list[int] | None:
    """One vCPU of each physical core, given every vCPU's sibling (None when the pairs are not all known)."""
    if any(c not in siblings for c in cpus):
        return None
    chosen: list[int] = []
    for c in cpus:
        if siblings[c] not in chosen:
            chosen.append(c)
    return chosen


def regular_pairs(cpus: list[int], found: dict[int, list[int]]) -> tuple[int | None, list[int] | None]:
    """(k, one vCPU per core) when every probed vCPU has exactly one sibling at the same distance k, taken to
    hold for all vCPUs (pairs (c, c + 1) for k = 1, else (c, c + k) within each run of 2k); (None, cpus) when no
    probe found a sibling (one thread per core); (None, None) when the pattern is irregular."""
    if not any(found.values()):
        return None, cpus
    offsets = {abs(qs[0] - p) for p, qs in found.items() if len(qs) == 1}
    if len(offsets) != 1 or any(len(qs) != 1 for qs in found.values()):
        return None, None
    k = offsets.pop()
    pairs = {c: c + k if (c // k) % 2 == 0 else c - k for c in cpus}
    return k, one_per_core(cpus, pairs)


def layout_from(vcpus: list[int], ratios: dict[int, dict[int, float]]) -> CoreLayout:
    """The layout the probe's ratios imply."""
    found = {p: [q for q, r in row.items() if r < SIBLING_RATIO] for p, row in ratios.items()}
    offset, per_core = regular_pairs(vcpus, found)
    return CoreLayout(vcpus, ratios, found, offset, per_core)


def probe_layout(probes: tuple[int, ...] | None = None, seconds: float = 0.15) -> CoreLayout:
    """Pair each of ``probes`` (those this process may run on; default: the first vCPU it may run on) with
    every other vCPU: about (vCPUs + 1) x ``seconds`` per probe. A process limited to vCPUs without 0 (taskset,
    a container's cpuset) still probes one, rather than reporting "no siblings" from no probe at all."""
    vcpus = sorted(os.sched_getaffinity(0))
    ratios: dict[int, dict[int, float]] = {}
    for p in (p for p in (probes or vcpus[:1]) if p in vcpus):
        alone = rates_together([p], seconds)[p]
        ratios[p] = {q: rates_together([p, q], seconds)[p] / alone for q in vcpus if q != p}
    return layout_from(vcpus, ratios)
