"""Exposure: GPU idle time, attributed to the resource the GPU was waiting on.

A gap on a GPU's compute stream ends when some operation completes; that operation may itself have
started late because it waited on another. Walking this chain of blockers backwards splits the gap
among the operations actually on the critical path (a late H2D that was late because the CPU update
before it was late is CPU exposure, not H2D exposure). Used for simulated steps and, given the same
blocker chains, for measured ones.
"""

from __future__ import annotations

import pandas as pd

from slidedp.schedule import Plan
from slidedp.workload import EXPOSURE_CATEGORIES, OP_CATEGORY


def _walk(plan: Plan, start, end, blocker, lo: float, hi: float, cur: int, into: dict[str, float]) -> None:
    while hi > lo and cur >= 0:
        seg_lo = max(lo, start[cur])
        category = OP_CATEGORY[plan.ops[cur].op]
        # Waiting on another rank's compute (a collective) is load imbalance: a bubble.
        into["bubble" if category == "compute" else category] += hi - seg_lo
        hi = min(seg_lo, end[blocker[cur]]) if blocker[cur] >= 0 else seg_lo
        cur = blocker[cur]
    if hi > lo:
        into["bubble"] += hi - lo


def exposure_from_chain(plan: Plan, start, end, blocker, ranks: int, step_time: float) -> pd.DataFrame:
    """Per-rank compute seconds and exposed seconds per category; each row sums to ``step_time``."""
    last_op = max(range(len(plan.ops)), key=end.__getitem__)
    rows = []
    for r in range(ranks):
        exposed = dict.fromkeys(EXPOSURE_CATEGORIES, 0.0)
        compute = 0.0
        t = 0.0
        for i in plan.streams[f"gpu[{r}]"]:
            if start[i] > t:
                _walk(plan, start, end, blocker, t, start[i], blocker[i], exposed)
            compute += end[i] - start[i]
            t = end[i]
        if step_time > t:
            _walk(plan, start, end, blocker, t, step_time, last_op, exposed)
        rows.append({"rank": r, "compute": compute, **exposed})
    return pd.DataFrame(rows)


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
