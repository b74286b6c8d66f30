"""The compact update's rate over time on one machine, beside how much core the guest's vCPUs get while all of
them are busy at once (not a test; a measurement for the device).

Why: on the lent H100/H200 hosts the `bf16+int8` update at 16 threads ran at 5.1-12.6 G params/s, twice over
on one machine within minutes, while up to 8 threads it scaled at a steady ~0.8 G/s per thread. The pairwise
sibling probe (benchmarks/cpu_siblings.py) found 16 separate cores, but it keeps only two vCPUs busy. If the
hypervisor places busy vCPUs on hyperthreads that share a physical core with other guests' vCPUs (or each
other), a pass bound by the core's vector units and divider gets about half a core per thread, and only when
every vCPU is busy; a bandwidth-bound pass (exact fp32) barely notices. Each round here times the update at
all threads and at half of them, the exact fp32 update at all threads, and then runs one vector-bound loop
per vCPU on every vCPU at once: the sum of those rates over the vCPU count times the median rate of one vCPU
alone (measured at the start) is the share of a core each busy vCPU got. Steal time from /proc/stat is
recorded per round.

    python -m benchmarks.update_spread --rounds 10 --params 128000000 --out DIR

Writes spread.jsonl (one line per round, wall-clock stamped) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from slidedp.calibration.cpu_topology import rates_together
from slidedp.calibration.host_bench import compact_state_update
from slidedp.calibration.measurements import median_time, torch_threads
from slidedp.state_precision import StatePrecision


def steal_jiffies() -> int | None:
    """The host's cumulative steal time (USER_HZ ticks), None where /proc/stat is absent."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    return int(fields[8]) if len(fields) > 8 else None


def rate_at(update, n: int, threads: int, repeats: int) -> float:
    """G params/s of ``update`` (``n`` parameters) at ``threads``: the median of ``repeats`` after a warm-up."""
    with torch_threads(threads):
        return n / median_time(update, repeats) / 1e9


def core_share(cpus: list[int], alone: float, seconds: float) -> float:
    """Each vCPU's loop rate with every vCPU busy, summed, over len(cpus) x the rate of one vCPU alone."""
    together = rates_together(cpus, seconds)
    return sum(together.values()) / (len(cpus) * alone)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--params", type=int, default=128_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--state", default="bf16+int8")
    ap.add_argument("--seconds", type=float, default=0.5, help="each busy-loop measurement")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.params < 1 or args.repeats < 1 or args.seconds <= 0:
        print("update_spread: error: --rounds, --params, --repeats and --seconds must be positive", file=sys.stderr)
        return 2
    try:
        precision = StatePrecision.parse(args.state)
    except ValueError as exc:
        print(f"update_spread: error: {exc}", file=sys.stderr)
        return 2
    cpus = sorted(os.sched_getaffinity(0))
    full, half = len(cpus), max(1, len(cpus) // 2)
    compact = compact_state_update(precision, args.params)
    exact = compact_state_update(StatePrecision.parse("fp32"), args.params)
    alone_each = {c: rates_together([c], args.seconds)[c] for c in cpus}
    alone = statistics.median(alone_each.values())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{full} vCPUs; one vCPU alone: median {alone:.0f} loops/s (min {min(alone_each.values()):.0f}, "
          f"max {max(alone_each.values()):.0f})")
    print(f"{'round':>5} {'time':>8} {args.state + ' ' + str(full) + 't':>15} {str(half) + 't':>6} "
          f"{'fp32 ' + str(full) + 't':>9} {'core share':>10} {'steal %':>7}")
    hz = os.sysconf("SC_CLK_TCK")
    with (out / "spread.jsonl").open("w") as log:
        log.write(json.dumps({"vcpus": cpus, "alone_each": alone_each, "state": args.state,
                              "params": args.params}) + "\n")
        for r in range(args.rounds):
            s0, t0 = steal_jiffies(), time.time()
            row = {"round": r, "unix_s": t0,
                   "compact_full": rate_at(compact, args.params, full, args.repeats),
                   "compact_half": rate_at(compact, args.params, half, args.repeats),
                   "fp32_full": rate_at(exact, args.params, full, args.repeats),
                   "core_share": core_share(cpus, alone, args.seconds)}
            s1, elapsed = steal_jiffies(), time.time() - t0
            row["steal_pct"] = None if s0 is None or s1 is None else 100 * (s1 - s0) / hz / elapsed / full
            log.write(json.dumps(row) + "\n")
            log.flush()
            steal = "-" if row["steal_pct"] is None else f"{row['steal_pct']:.1f}"
            print(f"{r:>5} {time.strftime('%H:%M:%S', time.gmtime(t0)):>8} {row['compact_full']:>15.2f} "
                  f"{row['compact_half']:>6.2f} {row['fp32_full']:>9.2f} {row['core_share']:>10.2f} {steal:>7}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
