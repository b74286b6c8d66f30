"""Which vCPUs of this host share a physical core, measured rather than read from sysfs.

    python -m benchmarks.cpu_siblings --out DIR [--probe 0 1] [--seconds 0.4]

A cloud guest may list 16 cores of one thread each while its vCPUs are the two hyperthreads of 8 physical
cores. That matters to every CPU rate SlideDP calibrates: two hyperthreads share one core's vector ports, so a
pass bound by them (the compact-state update, RESULTS "Why the compact update is not faster") gains nothing
from the second thread, and a pass at fewer threads than vCPUs runs at a rate that depends on where the
scheduler put its threads (the contention experiments' misses at 6 and 8 threads, RESULTS 2026-12-03).

For each probed vCPU p and every other vCPU q: a single-threaded fp32 matmul loop (bound by the vector
ports) runs on p alone, then on p and q at once, each pinned with sched_setaffinity; the ratio of p's rate
with q busy to its rate alone is about 1 for separate cores and well below 1 (about 0.5-0.6) for siblings.
Writes siblings.json: the rates, the ratios, the siblings found and one vCPU per physical core (an OMP_PLACES
list) if the pairs are regular.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

SIBLING_RATIO = 0.8  # p's rate with q busy below this fraction of its rate alone: q shares p's core


def _spin(cpu: int, seconds: float, start, result) -> None:
    """Matmuls of 128x128 fp32 on ``cpu`` for ``seconds`` after ``start`` is set; iterations per second."""
    import torch

    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    a = torch.randn(128, 128)
    c = torch.empty(128, 128)
    for _ in range(50):  # warm-up
        torch.mm(a, a, out=c)
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            torch.mm(a, a, out=c)
        n += 20
    result.put((cpu, n / (time.perf_counter() - t0)))


def rates_together(cpus: list[int], seconds: float) -> dict[int, float]:
    """Each of ``cpus``' loop rate while all of them run at once."""
    ctx = mp.get_context("fork")
    start, result = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(c, seconds, start, result)) for c in cpus]
    for p in procs:
        p.start()
    time.sleep(0.3)  # every process pinned and warmed up
    start.set()
    out = dict(result.get() for _ in procs)
    for p in procs:
        p.join()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--probe", type=int, nargs="+", default=[0, 1], help="vCPUs to pair with every other")
    parser.add_argument("--seconds", type=float, default=0.4)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    report: dict = {"cpus": cpus, "sysfs_thread_siblings": {}}
    for c in cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        report["sysfs_thread_siblings"][c] = path.read_text().strip() if path.exists() else None
    alone = {c: rates_together([c], args.seconds)[c] for c in cpus}
    report["alone_per_s"] = alone
    ratios: dict[int, dict[int, float]] = {}
    for p in args.probe:
        ratios[p] = {q: rates_together([p, q], args.seconds)[p] / alone[p] for q in cpus if q != p}
        print(f"vCPU {p}: rate with each other vCPU busy / alone: "
              + " ".join(f"{q}:{r:.2f}" for q, r in ratios[p].items()), flush=True)
    report["ratio_with_other_busy"] = ratios
    found = {p: [q for q, r in row.items() if r < SIBLING_RATIO] for p, row in ratios.items()}
    report["siblings_found"] = found
    report["pair_offset"], report["one_per_core"] = regular_pairs(cpus, found)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "siblings.json").write_text(json.dumps(report, indent=1))
    print(f"siblings: {found}; one vCPU per core: {report['one_per_core']}")


if __name__ == "__main__":
    main()
