"""Execute a step's operation graph in simpy and measure what the GPUs waited for."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import simpy

from slidedp.exposure import exposure_from_chain, limiter
from slidedp.schedule import Plan, build_plan
from slidedp.sim.fluid import host_network
from slidedp.trace import EXPOSURE_CATEGORIES, make_trace
from slidedp.workload import StepWorkload


@dataclass
class SimResult:
    workload: StepWorkload
    step_time_s: float
    trace: pd.DataFrame
    exposure: pd.DataFrame  # one row per rank: compute and exposed seconds by category
    busy_s: dict[str, float]  # resource -> seconds of full-capacity use (streams: seconds busy)

    @property
    def tokens_per_s(self) -> float:
        return self.workload.tokens_per_step / self.step_time_s

    @property
    def utilization(self) -> dict[str, float]:
        return {r: b / self.step_time_s for r, b in self.busy_s.items()}

    @property
    def bottleneck(self) -> str:
        """The busiest resource (largest fraction of the step at full capacity)."""
        util = self.utilization
        return max(util, key=util.get)

    def mean_exposure(self) -> dict[str, float]:
        """Exposed seconds per category, averaged over ranks."""
        return {c: float(self.exposure[c].mean()) for c in EXPOSURE_CATEGORIES}

    @property
    def compute_s(self) -> float:
        return float(self.exposure["compute"].mean())

    @property
    def limiter(self) -> str:
        return limiter(self.compute_s, self.mean_exposure())


class _Execution:
    """State of one simulated step: per-op start/end times and the op whose completion released it."""

    def __init__(self, w: StepWorkload, plan: Plan):
        self.w, self.plan = w, plan
        self.env = simpy.Environment()
        self.net = host_network(self.env, w.hw, w.hosts)
        n = len(plan.ops)
        self.done = [self.env.event() for _ in range(n)]
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.blocker = [-1] * n
        self.group_ready: dict[int, simpy.Event] = {g: self.env.event() for g in plan.groups}
        self.group_finished: dict[int, simpy.Event] = {g: self.env.event() for g in plan.groups}
        self.group_arrived: dict[int, list[int]] = {g: [] for g in plan.groups}
        self.group_left: dict[int, int] = {g: len(m) for g, m in plan.groups.items()}

    def run_stream(self, ids: list[int]):
        env, ops, done, end = self.env, self.plan.ops, self.done, self.end
        prev = -1
        for i in ids:
            op = ops[i]
            pending = [done[d] for d in op.deps if not done[d].triggered]
            if pending:
                yield env.all_of(pending)
            candidates = op.deps if prev < 0 else [*op.deps, prev]
            self.blocker[i] = max(candidates, key=end.__getitem__) if candidates else -1
            if op.group >= 0:
                arrived = self.group_arrived[op.group]
                arrived.append(i)
                if len(arrived) == len(self.plan.groups[op.group]):
                    self.group_ready[op.group].succeed(i)
                yield self.group_ready[op.group]
                last = self.group_ready[op.group].value
                if last != i:
                    self.blocker[i] = self.blocker[last]
            self.start[i] = env.now
            if op.usage is None:
                yield env.timeout(op.amount)
            else:
                if op.latency > 0:
                    yield env.timeout(op.latency)
                yield self.net.transfer(op.amount, op.usage, op.cap)
            if op.group >= 0:
                self.group_left[op.group] -= 1
                if self.group_left[op.group] == 0:
                    self.group_finished[op.group].succeed()
                yield self.group_finished[op.group]
            end[i] = env.now
            done[i].succeed()
            prev = i

    def run(self) -> None:
        for ids in self.plan.streams.values():
            self.env.process(self.run_stream(ids))
        self.env.run()


def simulate(w: StepWorkload, plan: Plan | None = None) -> SimResult:
    """Simulate one steady-state step of ``w``."""
    plan = plan or build_plan(w)
    ex = _Execution(w, plan)
    ex.run()
    ops = plan.ops
    step_time = max(ex.end) if ops else 0.0
    trace = make_trace([
        (op.rank, op.resource, op.op, op.unit, op.chunk, op.micro_batch, ex.start[op.id], ex.end[op.id],
         0.0 if op.usage is None else op.amount, op.flops, op.host_bytes)
        for op in ops
    ])
    exposure = exposure_from_chain(plan, ex.start, ex.end, ex.blocker, w.ranks, step_time)
    busy = {name: served / cap for name, served, cap in zip(ex.net.names, ex.net.busy_bytes, ex.net.capacity,
                                                            strict=True)}
    for stream, ids in plan.streams.items():
        if stream.startswith(("gpu", "cpu")):
            busy[stream] = sum(ex.end[i] - ex.start[i] for i in ids)
    return SimResult(w, step_time, trace, exposure, busy)
