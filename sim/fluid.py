"""Processor-sharing bandwidth for simpy: concurrent flows share every resource they cross by weighted max-min
fairness, and the host's CPU passes slow down while copies run.

simpy's resources are FIFO servers; a PCIe link or host DRAM instead serves all flows at once at a
shared rate. This manager keeps the set of active flows, recomputes their rates by progressive filling
whenever a flow starts or ends (once per simulated instant, however many changes that instant has), and
schedules only the next completion; stale wake-ups are recognised by a version counter.

Each flow grows in proportion to its solo rate (so all lose the same fraction of it), a CPU pass with the host's
``cpu_dram_weight`` times its own. How the host shares DRAM between CPU passes and copies was measured on the
H200 (benchmarks/RESULTS.md, fifth session): an AdamW pass ran 1.45-1.55x slower with H2D and D2H copying, at 4,
8 and 16 threads alike, even where DRAM had bandwidth left (interference, not bandwidth), and the copies got what
the pass left. So when ``classify`` is given (slidedp.resources.flow_class), a CPU pass's cap is divided by the
interference factor of the copy directions active at that instant (``interference``) and it weighs
``cpu_weight`` times its solo rate; without it every flow is "other" and weighs its solo rate. The other way
round, the capacities only copies cross (PCIe directions, duplex, switch uplinks) are divided by
``copy_slowdown`` of the CPU passes' summed solo DRAM traffic at that instant (HostSpec.copy_slowdown: copies
lose rate beside a pass even where DRAM has room). Hosts whose contention was not measured keep factors and
weight 1: proportional sharing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from slidedp.hardware import HardwareProfile
from slidedp.resources import COPY_RESOURCE_PREFIXES, CPU_PASS, dma_usage, flow_class, resource_capacities

_EPS = 1e-12


class _Flow:
    __slots__ = ("remaining", "rate", "usage", "cap", "done", "kind", "limit")

    def __init__(self, amount: float, usage: list[tuple[int, float]], cap: float, done: simpy.Event, kind: str):
        self.remaining = amount
        self.rate = 0.0
        self.usage = usage
        self.cap = cap
        self.done = done
        self.kind = kind  # slidedp.resources.flow_class, or "other" when the network does not classify
        self.limit = cap  # the cap in force now (a CPU pass's is lowered while copies run)


class FluidNetwork:
    def __init__(self, env: simpy.Environment, capacities: dict[str, float],
                 classify: Callable[[dict[str, float]], str] | None = None,
                 interference: Callable[[str, float], float] | None = None, cpu_weight: float = 1.0,
                 copy_slowdown: Callable[[float], float] | None = None):
        self.env = env
        self.classify, self.interference, self.cpu_weight = classify, interference, cpu_weight
        self.copy_slowdown = copy_slowdown
        self.names = list(capacities)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.capacity = [capacities[n] for n in self.names]
        self.copy_resources = frozenset(i for i, n in enumerate(self.names) if n.startswith(COPY_RESOURCE_PREFIXES))
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
        kind = self.classify(usage) if self.classify else "other"
        self.flows.append(_Flow(amount, [(self.index[r], k) for r, k in usage.items()], cap, done, kind))
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
        moving = [f for f in self.flows if f.rate > 0]  # a copy may wait while CPU passes take all of DRAM
        if moving:
            dt = min(f.remaining / f.rate for f in moving)
            version = self._version
            ev = self.env.timeout(max(dt, 0.0))
            ev.callbacks.append(lambda _e, v=version: self._on_wake(v))

    def _on_wake(self, version: int) -> None:
        if version == self._version:
            self._reschedule()

    def _allocate(self) -> None:
        allocate(self.flows, self.capacity, self.interference, self.cpu_weight, self.copy_slowdown,
                 self.copy_resources)

def host_network(env: simpy.Environment, hw: HardwareProfile, hosts: int = 1) -> FluidNetwork:
    """The network every simulation of ``hw`` runs on: its resources (its NICs too over several hosts), CPU
    passes classified and slowed by the host's measured DMA interference."""
    return FluidNetwork(env, resource_capacities(hw, hosts), flow_class, hw.host.interference,
                        hw.host.cpu_dram_weight, hw.host.copy_slowdown_at)


def run_flows(hw: HardwareProfile, flows: dict[str, tuple[float, dict[str, float], float]],
              until: str | float) -> dict[str, float]:
    """Start ``flows`` (name: bytes, resource usage, cap in bytes/s) together on ``hw``'s host network and run
    until flow ``until`` ends (or for ``until`` seconds): the bytes/s each flow averaged over that window, and the
    window's end as ``<until>_end``. The contention experiments (benchmarks/contention.py) are predicted with
    it, and the calibration fits the CPU passes' DRAM weight with it (calibration.profile_fit)."""
    env = simpy.Environment()
    net = host_network(env, hw)
    done = {name: net.transfer(amount, usage, cap) for name, (amount, usage, cap) in flows.items()}
    env.run(until=done[until] if isinstance(until, str) else until)
    t = env.now
    left = net.remaining()
    out = {name: (flows[name][0] - left.get(ev, 0.0)) / t for name, ev in done.items()}
    if isinstance(until, str):
        out[f"{until}_end"] = t
    return out


def endless_copy(hw: HardwareProfile, direction: str, gpu: int = 0) -> tuple[float, dict[str, float], float]:
    """A ``run_flows`` flow: an uncapped host<->GPU copy in ``direction`` (h2d, d2h) that outlasts every window
    it is run in."""
    return 1e15, dma_usage(hw, gpu, direction), math.inf


def pass_beside_copies(hw: HardwareProfile, pass_bytes: float, pass_cap: float,
                       directions: tuple[str, ...], gpu: int = 0) -> dict[str, float]:
    """A CPU pass of ``pass_bytes`` over host DRAM at up to ``pass_cap`` bytes/s while copies in ``directions``
    (h2d, d2h) run the whole time: its seconds (``cpu_end``) and each copy's bytes/s over the pass."""
    flows = {"cpu": (pass_bytes, {"hostmem": 1.0}, pass_cap)}
    flows.update({d: endless_copy(hw, d, gpu) for d in directions})
    return run_flows(hw, flows, until="cpu")


def _solo_rate(f: _Flow, capacity: list[float], cap: float) -> float:
    """The rate ``f`` would reach alone at limit ``cap``: the cap or its slowest resource."""
    rate = cap
    for i, k in f.usage:
        if k > 0:
            rate = min(rate, capacity[i] / k)
    return rate


def _solo_weight(f: _Flow, capacity: list[float], cpu_weight: float) -> float:
    """How fast ``f`` grows relative to the others while they share: its solo rate (the rate it would reach
    alone, at its current limit), times ``cpu_weight`` for a CPU pass."""
    rate = _solo_rate(f, capacity, f.limit)
    rate = rate if math.isfinite(rate) and rate > 0 else 1.0
    return rate * cpu_weight if f.kind == CPU_PASS else rate


def allocate(flows: list[_Flow], capacity: list[float], interference: Callable[[str, float], float] | None,
             cpu_weight: float = 1.0, copy_slowdown: Callable[[float], float] | None = None,
             copy_resources: frozenset[int] = frozenset()) -> None:
    """Set every flow's rate. Weighted progressive filling: every unfrozen flow grows in proportion to its weight
    until a resource saturates or a flow reaches its limit; freeze those, repeat. A CPU pass's limit is its cap
    divided by the interference of the copy directions running now; the ``copy_resources`` serve copies the
    slowdown the CPU passes running now cause less."""
    if not flows:
        return
    left: dict[int, float] = {}
    dirs: set[str] = set()
    for f in flows:
        f.rate = 0.0
        f.limit = f.cap
        dirs.update(d for d in f.kind.split("+") if d in ("h2d", "d2h"))
        for i, _ in f.usage:
            left[i] = capacity[i]
    # Each CPU pass's solo rate at its cap: the traffic both the interference and the copies' slowdown look up.
    passes = [(f, _solo_rate(f, capacity, f.cap)) for f in flows if f.kind == CPU_PASS]
    if interference is not None:
        running = "+".join(d for d in ("h2d", "d2h") if d in dirs)
        for f, solo in passes:
            f.limit = f.cap / interference(running, solo)
    if copy_slowdown is not None and copy_resources:
        # Each pass at its solo rate, also passes that time-share the cores (a peer's cast beside its update):
        # their traffic is then overstated, and the copies slowed as if both ran at full rate.
        cpu_traffic = sum(solo for _, solo in passes)
        slowdown = copy_slowdown(cpu_traffic) if math.isfinite(cpu_traffic) else 1.0
        for i in copy_resources & left.keys():
            left[i] = capacity[i] / slowdown
    weight_of = {id(f): _solo_weight(f, capacity, cpu_weight) for f in flows}
    active = flows
    while active:
        load: dict[int, float] = {}
        step = math.inf
        for f in active:
            w = weight_of[id(f)]
            room = (f.limit - f.rate) / w
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
            if f.rate >= f.limit * (1 - 1e-9):
                continue
            for i, _ in f.usage:
                if i in saturated:
                    break
            else:
                still.append(f)
        active = still

