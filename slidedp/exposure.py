"""Exposure: GPU idle time, attributed to the resource the GPU was waiting on.

A gap on a GPU's compute stream ends when some operation completes; that operation may itself have
started late because it waited on another. Walking this chain of blockers backwards splits the gap
among the operations actually on the critical path (a late H2D that was late because the CPU update
before it was late is CPU exposure, not H2D exposure). Used for simulated steps and, given the same
blocker chains, for measured ones.
"""

from __future__ import annotations

import bisect

import pandas as pd

from slidedp.schedule import Plan
from slidedp.trace import EXPOSURE_CATEGORIES, OP_CATEGORY


def _walk(categories: list[str], start, end, blocker, lo: float, hi: float, cur: int,
          into: dict[str, float]) -> None:
    while hi > lo and cur >= 0:
        seg_lo = max(lo, start[cur])
        category = categories[cur]
        # Waiting on another rank's compute (a collective) is load imbalance: a bubble.
        into["bubble" if category == "compute" else category] += hi - seg_lo
        hi = min(seg_lo, end[blocker[cur]]) if blocker[cur] >= 0 else seg_lo
        cur = blocker[cur]
    if hi > lo:
        into["bubble"] += hi - lo


def _exposure(categories: list[str], start, end, blocker, gpu_ops: dict[int, list[int]],
              step_time: float) -> pd.DataFrame:
    last_op = max(range(len(start)), key=end.__getitem__)
    rows = []
    for r, ids in sorted(gpu_ops.items()):
        exposed = dict.fromkeys(EXPOSURE_CATEGORIES, 0.0)
        compute = 0.0
        t = 0.0
        for i in ids:
            if start[i] > t:
                _walk(categories, start, end, blocker, t, start[i], blocker[i], exposed)
            compute += end[i] - start[i]
            t = end[i]
        if step_time > t:
            _walk(categories, start, end, blocker, t, step_time, last_op, exposed)
        rows.append({"rank": r, "compute": compute, **exposed})
    return pd.DataFrame(rows)


def exposure_from_chain(plan: Plan, start, end, blocker, ranks: int, step_time: float) -> pd.DataFrame:
    """Per-rank compute seconds and exposed seconds per category; each row sums to ``step_time``."""
    categories = [OP_CATEGORY[op.op] for op in plan.ops]
    gpu_ops = {r: plan.streams[f"gpu[{r}]"] for r in range(ranks)}
    return _exposure(categories, start, end, blocker, gpu_ops, step_time)


def exposure_from_trace(trace: pd.DataFrame, step_time: float | None = None) -> pd.DataFrame:
    """Exposure of a trace that carries no dependency information (a measured run, a trace file).

    The blocker of each operation is inferred from timestamps: the operation of the same rank (or any
    CPU update, since updates are shared) that ended last at or before it started. For a simulated
    trace this recovers the chains the simulator recorded whenever end times are distinct.
    """
    df = trace.sort_values(["start_s", "end_s"]).reset_index(drop=True)
    start, end = df["start_s"].tolist(), df["end_s"].tolist()
    categories = [OP_CATEGORY.get(op, "bubble") for op in df["op"]]
    ranks = df["rank"].tolist()
    step_time = max(end) if step_time is None else step_time
    order = sorted(range(len(df)), key=end.__getitem__)
    ends_sorted = [end[i] for i in order]
    blocker = []
    for i in range(len(df)):
        j = bisect.bisect_right(ends_sorted, start[i] + 1e-12) - 1
        found = -1
        while j >= 0:
            k = order[j]
            if k != i and (ranks[k] == ranks[i] or categories[k] == "cpu"):
                found = k
                break
            j -= 1
        blocker.append(found)
    gpu_ops: dict[int, list[int]] = {}
    for i in range(len(df)):
        if categories[i] == "compute":
            gpu_ops.setdefault(ranks[i], []).append(i)
    return _exposure(categories, start, end, blocker, gpu_ops, step_time)


def limiter(compute_s: float, exposure: dict[str, float]) -> str:
    """What a step mostly waits on.

    A step is host-bound by category X when X's exposed time is the largest exposed category and exceeds
    a tenth of the step; otherwise the GPUs are busy enough to call it compute-bound.
    """
    total = compute_s + sum(exposure.values())
    worst = max(exposure, key=exposure.get) if exposure else None
    if worst is None or exposure[worst] <= 0.1 * total:
        return "compute"
    return worst
