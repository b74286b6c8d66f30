"""Processor-sharing bandwidth for simpy: concurrent flows share every resource they cross, each slowed by the
same fraction of the rate it would reach alone (weighted max-min fairness, weights = solo rates).

simpy's resources are FIFO servers; a PCIe link or host DRAM instead serves all flows at once at a
shared rate. This manager keeps the set of active flows, recomputes their rates by weighted progressive
filling whenever a flow starts or ends (once per simulated instant, however many changes that instant has),
and schedules only the next completion; stale wake-ups are recognised by a version counter.

Why weighted, not plain max-min: on the H200 host (benchmarks/RESULTS.md, "Host contention"), the CPU AdamW
pass (113 GB/s alone) and H2D + D2H copies (50 + 50 GB/s alone) run together at 82 and 39.5 + 39.5 GB/s: each
lost the same ~28% of its solo rate, where plain max-min would have given the copies their whole solo rate
first and charged the pass alone. Flows of equal solo rate (two GPUs' copies through one switch, say) split a
resource equally under both rules.
"""

from __future__ import annotations

import math

import simpy

_EPS = 1e-12


class _Flow:
    __slots__ = ("remaining", "rate", "usage", "cap", "done")

    def __init__(self, amount: float, usage: list[tuple[int, float]], cap: float, done: simpy.Event):
        self.remaining = amount
        self.rate = 0.0
        self.usage = usage
        self.cap = cap
        self.done = done


class FluidNetwork:
    def __init__(self, env: simpy.Environment, capacities: dict[str, float]):
        self.env = env
        self.names = list(capacities)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.capacity = [capacities[n] for n in self.names]
        self.busy_bytes = [0.0] * len(self.names)  # resource-bytes served, for utilisation
        self.flows: list[_Flow] = []
        self._last = 0.0
        self._version = 0
        self._dirty = False

    def transfer(self, amount: float, usage: dict[str, float], cap: float = math.inf) -> simpy.Event:
        """Start a flow of ``amount`` bytes; ``usage`` maps resources to bytes used per flow byte."""
        done = self.env.event()
        if amount <= 0:
            done.succeed()
            return done
        self._advance()
        self.flows.append(_Flow(amount, [(self.index[r], k) for r, k in usage.items()], cap, done))
        self._mark_dirty()
        return done

    def remaining(self) -> dict[simpy.Event, float]:
        """Bytes each active flow has left as of now, keyed by its completion event (experiments that stop a
        run at a chosen time read what each flow moved from this)."""
        self._advance()
        return {f.done: f.remaining for f in self.flows}

    # ---- internals ------------------------------------------------------------------------------------
    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            busy = self.busy_bytes
            for f in self.flows:
                moved = f.rate * dt
                f.remaining -= moved
                for i, k in f.usage:
                    busy[i] += moved * k
        self._last = self.env.now

    def _mark_dirty(self) -> None:
        if not self._dirty:
            self._dirty = True
            ev = self.env.timeout(0)
            ev.callbacks.append(self._reschedule)

    def _reschedule(self, _event=None) -> None:
        self._dirty = False
        self._advance()
        finished = [f for f in self.flows if f.remaining <= _EPS * max(1.0, f.rate)]
        if finished:
            self.flows = [f for f in self.flows if f.remaining > _EPS * max(1.0, f.rate)]
            for f in finished:
                f.done.succeed()
        self._allocate()
        self._version += 1
        if self.flows:
            dt = min(f.remaining / f.rate for f in self.flows)
            version = self._version
            ev = self.env.timeout(max(dt, 0.0))
            ev.callbacks.append(lambda _e, v=version: self._on_wake(v))

    def _on_wake(self, version: int) -> None:
        if version == self._version:
            self._reschedule()

    def _solo_rate(self, f: _Flow) -> float:
        """The rate ``f`` would reach alone: its own cap or its tightest resource."""
        rate = f.cap
        for i, k in f.usage:
            if k > 0:
                rate = min(rate, self.capacity[i] / k)
        return rate if math.isfinite(rate) and rate > 0 else 1.0

    def _allocate(self) -> None:
        """Weighted progressive filling: every unfrozen flow runs at the same fraction ``t`` of its solo rate;
        raise ``t`` until a resource saturates or a flow reaches its own cap, freeze those flows, repeat."""
        flows = self.flows
        if not flows:
            return
        capacity = self.capacity
        left: dict[int, float] = {}
        weight_of: dict[int, float] = {}
        for f in flows:
            f.rate = 0.0
            weight_of[id(f)] = self._solo_rate(f)
            for i, _ in f.usage:
                left[i] = capacity[i]
        active = flows
        while active:
            load: dict[int, float] = {}
            step = math.inf
            for f in active:
                w = weight_of[id(f)]
                room = (f.cap - f.rate) / w
                if room < step:
                    step = room
                for i, k in f.usage:
                    load[i] = load.get(i, 0.0) + k * w
            for i, total in load.items():
                s = left[i] / total
                if s < step:
                    step = s
            for f in active:
                f.rate += step * weight_of[id(f)]
            saturated = set()
            for i, total in load.items():
                remaining = left[i] - step * total
                left[i] = remaining
                if remaining <= 1e-9 * capacity[i]:
                    saturated.add(i)
            still = []
            for f in active:
                if f.rate >= f.cap * (1 - 1e-9):
                    continue
                for i, _ in f.usage:
                    if i in saturated:
                        break
                else:
                    still.append(f)
            active = still
