"""How much the AdamW pass's slowdown beside H2D + D2H copies varies run to run, and whether the copy thread's
spinning wait takes cores from the pass (CUDA hosts).

    python -m benchmarks.contention_spread --out DIR [--threads 16 8 6 4 3 2] [--rounds 6] [--params 268435456]

Why: on c40's machine the pass with both copies at 6 and 3 threads ran 1.83x and 1.95x its time alone, where the
calibration's grid minutes earlier gave 1.39-1.47 at 16 / 12 / 8 / 4 / 2 threads (benchmarks/RESULTS.md). A
median of three or five hides whether such a factor is one value with noise or two modes. Each round times, at
every thread count, the pass alone, the pass beside copies whose thread waits in ``torch.cuda.synchronize`` (a
spin, as ``calibration.contention_bench`` does) and beside copies whose thread sleeps on a blocking CUDA event.
For every sample the Linux scheduler's own counters (/proc/self/task/*/schedstat: nanoseconds on a CPU and waiting
on a run queue) say whether the pass's threads waited for a core and how much CPU the copy thread used.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from benchmarks.common import log, require_cuda


def _schedstat() -> dict[int, tuple[int, int]]:
    """Every thread of this process: (ns on a CPU, ns waiting on a run queue)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            on_cpu, waited, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[int(task.name)] = (int(on_cpu), int(waited))
    return out


def _delta(before: dict, after: dict) -> dict[int, tuple[int, int]]:
    """Counters' growth per thread over a sample; a thread started meanwhile counts from zero."""
    return {tid: (on - before.get(tid, (0, 0))[0], wait - before.get(tid, (0, 0))[1])
            for tid, (on, wait) in after.items()}


def _copies(rig, stop: threading.Event, blocking: bool, ident: dict) -> dict[str, float]:
    """The rig's H2D and D2H copies until ``stop``, noting this thread's id for the scheduler's counters."""
    ident["tid"] = threading.get_native_id()
    return rig.copies(("h2d", "d2h"), stop, blocking=blocking)


def sample(rig, threads: int, copies: str | None) -> dict:
    """One pass at ``threads`` threads, alone (``copies`` None) or beside "spin" / "blocking" copies that start
    0.2 s before it: seconds, and the scheduler's counters of the pass's threads and of the copy thread."""
    stop, result, ident = threading.Event(), {}, {}
    worker = None
    if copies:
        worker = threading.Thread(target=lambda: result.update(_copies(rig, stop, copies == "blocking", ident)))
        worker.start()
        time.sleep(0.2)
    before = _schedstat()
    seconds = rig.adam(threads)
    after = _schedstat()
    stop.set()
    if worker:
        worker.join()
    delta = _delta(before, after)
    wall_ns = seconds * 1e9
    copy_tid = ident.get("tid")
    busy = {tid: d for tid, d in delta.items() if tid != copy_tid and d[0] > 0.2 * wall_ns}
    row = {"threads": threads, "copies": copies or "none", "seconds": seconds, "busy_threads": len(busy),
           "pass_cpu_share": sum(d[0] for d in busy.values()) / (threads * wall_ns),
           "pass_runqueue_ms": sum(d[1] for d in busy.values()) / 1e6}
    if copy_tid in delta:
        row["copy_thread_cpu_share"] = delta[copy_tid][0] / wall_ns
    row.update(result)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, nargs="+", default=[16, 8, 6, 4, 3, 2])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--params", type=int, default=2**28)
    args = parser.parse_args()
    require_cuda("benchmarks.contention_spread")
    from slidedp.calibration.contention_bench import ContentionRig

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rig = ContentionRig(args.params)
    rig.adam()
    rows = []
    for r in range(args.rounds):
        for t in args.threads:
            for copies in (None, "spin", "blocking"):
                rows.append(sample(rig, t, copies) | {"round": r})
        log(f"round {r + 1} of {args.rounds}")
    (out / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    log("threads  copies    factor median (min-max)   pass CPU share  run-queue ms  copy thread CPU")
    for t in args.threads:
        alone = statistics.median(r["seconds"] for r in rows if r["threads"] == t and r["copies"] == "none")
        for copies in ("none", "spin", "blocking"):
            sel = [r for r in rows if r["threads"] == t and r["copies"] == copies]
            f = [r["seconds"] / alone for r in sel]
            share = statistics.median(r["pass_cpu_share"] for r in sel)
            wait = statistics.median(r["pass_runqueue_ms"] for r in sel)
            cpu = statistics.median(r.get("copy_thread_cpu_share", 0.0) for r in sel)
            log(f"{t:7d}  {copies:8s}  {statistics.median(f):5.2f} ({min(f):.2f}-{max(f):.2f})"
                f"{share:16.2f}{wait:14.1f}{cpu:17.2f}")
    log(f"the pass alone at {args.threads[0]} threads: {rows[0]['seconds']:.4f} s in round 1, "
        f"{[r for r in rows if r['threads'] == args.threads[0] and r['copies'] == 'none'][-1]['seconds']:.4f} s "
        "in the last")


if __name__ == "__main__":
    main()
