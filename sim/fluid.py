"""Processor-sharing bandwidth for simpy: concurrent flows share every resource they cross, max-min fair.

simpy's resources are FIFO servers; a PCIe link or host DRAM instead serves all flows at once at a
shared rate. This manager keeps the set of active flows, recomputes their rates by progressive filling
whenever a flow starts or ends (once per simulated instant, however many changes that instant has), and
schedules only the next completion; stale wake-ups are recognised by a version counter.
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

    def _allocate(self) -> None:
        """Max-min fair rates by progressive filling: raise all unfrozen flows together until a resource
        saturates or a flow reaches its own cap, freeze those, repeat."""
        flows = self.flows
        if not flows:
            return
        capacity = self.capacity
        left: dict[int, float] = {}
        for f in flows:
            f.rate = 0.0
            for i, _ in f.usage:
                left[i] = capacity[i]
        active = flows
        while active:
            weight: dict[int, float] = {}
            step = math.inf
            for f in active:
                room = f.cap - f.rate
                if room < step:
                    step = room
                for i, k in f.usage:
                    weight[i] = weight.get(i, 0.0) + k
            for i, wsum in weight.items():
                s = left[i] / wsum
                if s < step:
                    step = s
            for f in active:
                f.rate += step
            saturated = set()
            for i, wsum in weight.items():
                remaining = left[i] - step * wsum
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
