"""Fast step-time estimate: a unit-level pipeline recurrence plus host-contention stretching.

The simulator resolves every chunk of every rank with bandwidth sharing; this model follows the same
stream order (slidedp.schedule) one unit at a time for one representative rank, treats consecutive
chunked stages as pipelined (a stage may start once the previous one finished its first chunk), and
then stretches each phase (forward; backward including the tail) to the host-memory and duplex-PCIe floors of the
work issued in it. It runs in well under a millisecond, which is what lets the tuner rank thousands
of policies before refining a few with the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slidedp.exposure import limiter
from slidedp.model.demands import resource_demands
from slidedp.model.memory import MemoryEstimate, estimate_memory
from slidedp.resources import collective_usage, resource_capacities
from slidedp.trace import EXPOSURE_CATEGORIES
from slidedp.workload import StepWorkload


@dataclass
class StepEstimate:
    step_time_s: float
    lower_bound_s: float
    tokens_per_s: float
    model_tflops: float  # useful model FLOPs per second per GPU
    compute_s: float
    demands: dict[str, float]  # resource -> seconds of full-capacity work
    exposure: dict[str, float] = field(default_factory=dict)  # category -> exposed seconds
    memory: MemoryEstimate | None = None

    @property
    def bottleneck(self) -> str:
        """The resource with the largest demand."""
        return max(self.demands, key=self.demands.get)

    @property
    def limiter(self) -> str:
        """What the step mostly waits on: ``compute`` or an exposure category."""
        return limiter(self.compute_s, self.exposure)


def lower_bound(w: StepWorkload) -> float:
    """No schedule can finish the step faster than its busiest resource or stream."""
    return max(resource_demands(w).values())


# The copy directions running beside the CPU update: as gradients land in backward (D2H, and H2D of the weights
# backward refetches), or beside the forward's weight copies (next_forward). After backward nothing copies.
_BESIDE_THE_UPDATE = {"as_ready": "h2d+d2h", "next_forward": "h2d", "after_backward": ""}


def _update_interference(w: StepWorkload, demands: dict[str, float] | None) -> float:
    """How much slower the CPU update runs, on average, for the copies beside it: the host's measured
    interference factor (HostSpec.interference at the update's own DRAM traffic) for the time those copies run
    (their busiest direction's demand over the step's)."""
    factor = w.hw.host.interference(_BESIDE_THE_UPDATE[w.policy.update_schedule], w.adam_cap())
    if factor == 1.0 or demands is None:
        return 1.0
    dirs = _BESIDE_THE_UPDATE[w.policy.update_schedule].split("+")
    duty = min(1.0, max(demands[f"{d}[0]"] for d in dirs) / max(demands.values()))
    return 1.0 + duty * (factor - 1.0)


class _Recurrence:
    """End times of the rank-0 streams, unit by unit, in the plan's issue order.

    Construction turns the workload into per-unit stage durations; :meth:`run` walks the forward, the
    backward and the tail, keeping each stream's time and the exposure the GPU meets on the way.
    """

    def __init__(self, w: StepWorkload, demands: dict[str, float] | None = None):
        self.w = w
        caps = resource_capacities(w.hw, w.hosts)
        self.c = w.chunks
        lat, n = w.pcie_latency, w.ranks
        h2d_bw, d2h_bw = caps["h2d[0]"], caps["d2h[0]"]
        sw = w.hw.switches[0] if w.hw.switches else None
        if sw is not None:  # GPUs behind one switch split its uplink when they copy together
            h2d_bw = min(h2d_bw, caps["uplink_h2d[0]"] / len(sw.gpus))
            d2h_bw = min(d2h_bw, caps["uplink_d2h[0]"] / len(sw.gpus))
        # Ranks run in lockstep, so every rank copies at once: each gets at most 1/N of host DRAM.
        h2d_bw = min(h2d_bw, caps["hostmem"] / n)
        d2h_bw = min(d2h_bw, caps["hostmem"] / n)
        # Host DRAM is shared in proportion to each flow's solo rate (sim/fluid.py): while the CPU update
        # streams DRAM, the flows beside it slow by the same factor. Collectives that bounce through host DRAM
        # (no peer access) meet the update for about the fraction of the step it runs (its time over the
        # busiest resource's); the copies' slowdown is left to the phases' DRAM floors below. The copies' PCIe
        # loss beside the update (HostSpec.copy_slowdown) is the simulator's alone: priced here over the update's
        # duty it moved Qwen3-4B batch 1 on h200-x1 by +8.6% where the simulator, which overlaps it chunk by chunk,
        # moves it by +1.9% (a 1.5-2x curve), and calibrated curves moved real steps by 0.1-1.6% (RESULTS, c36).
        share = 1.0
        if w.policy.update_schedule != "after_backward" and demands is not None and w.hw.link.kind != "nvlink":
            update_dram = n * sum(w.cpu_update_host_bytes_per_param()) / w.cpu_update_seconds_per_param()
            duty = min(1.0, demands["cpu[0]"] / max(demands.values()))
            share = 1.0 - duty * (1.0 - min(1.0, caps["hostmem"] / (n * (h2d_bw + d2h_bw) + update_dram)))
        coll_bw = w.collective_cap()
        if w.hw.link.kind != "nvlink":
            coll_bw = min(coll_bw, caps["h2d[0]"], caps["d2h[0]"], caps["pcie[0]"] / 2) * share
        units, routes = w.units, w.routes
        self.gpu_state = [w.gpu_state(u) for u in range(len(units))]
        # GPU-state units move nothing over PCIe and cost the CPU nothing: zero host-side parameters.
        params = [0 if g else u.params for u, g in zip(units, self.gpu_state, strict=True)]
        c = self.c
        k_h2d, k_ag = routes.h2d_param_factor, routes.allgather_factor
        k_d2h, k_rs = routes.d2h_grad_factor, routes.reduce_scatter_factor
        lat_link = w.link_latency
        self.h2d = [c * lat + k_h2d * p / h2d_bw if p else 0.0 for p in params]
        self.ag = [c * lat_link + k_ag * p / coll_bw if k_ag and p else 0.0 for p in params]
        self.rs = [c * lat_link + k_rs * p / coll_bw if k_rs and p else 0.0 for p in params]
        self.d2h = [c * lat + k_d2h * p / d2h_bw if p else 0.0 for p in params]
        # Across hosts: the reduced gradient over the host's NICs (GPU path, between reduce-scatter and D2H),
        # or the CPU sums and the sharded layout's new weights over them from host memory (in the update).
        nic_cap = w.nic_cap()
        gpu_nic = bool(w.nic_grad_op) and not w.nic_grad_from_host
        self.xh = [c * w.nic_latency + routes.nic_grad_factor * p / nic_cap if gpu_nic and p else 0.0
                   for p in params]
        cpu_nic = routes.nic_weight_factor + (routes.nic_grad_factor if w.nic_grad_from_host else 0.0)
        allreduce_bytes = [w.allreduce_bytes(u) for u in range(len(units))]  # GPU-state units with several ranks
        self.allreduce = [lat_link + b / coll_bw if b else 0.0 for b in allreduce_bytes]
        self.gpu_adam = [w.gpu_adam_s(u) for u in range(len(units))]
        offl = [w.offloads_checkpoint(u.index) for u in units]
        self.ckpt_out = [lat + u.checkpoint_bytes / d2h_bw if o else 0.0 for u, o in zip(units, offl, strict=True)]
        self.ckpt_in = [lat + u.checkpoint_bytes / h2d_bw if o else 0.0 for u, o in zip(units, offl, strict=True)]
        # CPU update work per parameter, in seconds (one rank's worker) and DRAM bytes (all ranks).
        host_b = sum(w.cpu_update_host_bytes_per_param())
        together = n * host_b / caps["hostmem"]  # all workers stream DRAM at once
        sec_per_param = max(w.cpu_update_seconds_per_param() * _update_interference(w, demands), together)
        # Update lanes: reduce-scatter gives every worker 1/N of each chunk, so one lane stands for all;
        # per-rank gradients give whole chunks to owners round-robin, so each owner is its own lane.
        # When the chunk count is a multiple of N, every owner gets the same share of every unit: one lane.
        self.lanes = 1 if routes.shards_updates or c % n == 0 else n
        self.lane_work: list[list[tuple[int, float]]] = []
        call = w.update_call_latency  # per call: one per chunk an owner updates
        for u, p in enumerate(params):
            nic = cpu_nic * p / nic_cap if cpu_nic and p else 0.0  # the host's NICs, shared by its workers
            calls_s = w.update_calls(u) * call  # every owner's calls of this unit
            if self.lanes == 1:
                self.lane_work.append([(0, sec_per_param * p / n + nic + calls_s / n)])
            else:  # one owner per chunk: owner k makes m of the c calls
                counts = routes.owner_chunk_counts(u)
                self.lane_work.append([(k, (sec_per_param * p + nic + calls_s) * m / c)
                                       for k, m in enumerate(counts) if m])
        self.upd = [max(t for _, t in lw) for lw in self.lane_work]
        self.host_upd = [(host_b + cpu_nic) * p for p in params]
        coll = collective_usage(w.hw, 0)
        k_host, k_pcie = coll.get("hostmem", 0.0), coll.get("pcie[0]", 0.0)
        self.host_h2d = [n * k_h2d * p for p in params]
        self.host_d2h = [n * k_d2h * p for p in params]
        self.host_ag = [n * k_ag * k_host * p for p in params]
        self.host_rs = [n * (k_rs * p + b) * k_host for p, b in zip(params, allreduce_bytes, strict=True)]
        # PCIe bytes (all ranks) of collectives that bounce through host memory (no peer access).
        self.pcie_ag = [n * k_ag * k_pcie * p for p in params]
        self.pcie_rs = [n * (k_rs * p + b) * k_pcie for p, b in zip(params, allreduce_bytes, strict=True)]
        self.host_ckpt = [n * u.checkpoint_bytes if o else 0.0 for u, o in zip(units, offl, strict=True)]

    def _pipelined(self, free: float, prev_start: float, prev_dur: float, prev_end: float, dur: float,
                   gate: float = 0.0) -> tuple[float, float]:
        """Start and end of a chunked stage fed chunk by chunk by the previous stage."""
        start = free if free > gate else gate
        first = prev_start + prev_dur / self.c
        if first > start:
            start = first
        end = prev_end + dur / self.c
        return start, (start + dur if start + dur > end else end)

    # ---- the walk ---------------------------------------------------------------------------------------------
    def run(self) -> dict:
        nu = len(self.w.units)
        # Stream clocks (rank 0 stands for every rank) and per-unit milestones.
        self.gpu = self.h2d_t = self.d2h_t = self.ag_t = self.rs_t = self.xh_t = 0.0
        self.lane_t = [0.0] * self.lanes
        self.upd_start, self.upd_end = [0.0] * nu, [0.0] * nu
        self.fwd_end, self.bwd_end = [0.0] * nu, [0.0] * nu
        self.ckpt_end, self.grad_end = [0.0] * nu, [0.0] * nu
        self.exposure = dict.fromkeys(EXPOSURE_CATEGORIES, 0.0)
        schedule = self.w.policy.update_schedule
        if schedule == "next_forward":
            self._updates_in_order(0.0)
        self._forward()
        fwd_done = self.gpu
        self._backward()
        if any(self.gpu_state):  # AdamW of the GPU-held units once every gradient (and the norm) is in
            self.gpu = max(self.gpu, max(self.grad_end[u] for u in range(nu) if self.gpu_state[u])) \
                + sum(self.gpu_adam)
        gpu_done = self.gpu
        if schedule == "after_backward":
            self._updates_in_order(max(self.d2h_t, self.gpu))
        cpu = max(self.lane_t)
        end = max(self.gpu, self.h2d_t, self.d2h_t, self.ag_t, self.rs_t, self.xh_t, cpu)
        tail_why = "cpu" if cpu >= max(self.d2h_t, self.rs_t) else ("d2h" if self.d2h_t >= self.rs_t else "collective")
        self.exposure[tail_why] += end - gpu_done
        return {"fwd": fwd_done, "bwd": end - fwd_done, "exposure": self.exposure}

    def _wait(self, ready: float, why: str) -> None:
        """The GPU stream waits until ``ready``; the gap is exposed time of category ``why``."""
        if ready > self.gpu:
            self.exposure[why] += ready - self.gpu

    def _update(self, u: int, feed_start: float, feed_dur: float, feed_end: float) -> None:
        """Each owner lane updates its chunks of unit ``u``, chunk-pipelined behind its feeder."""
        work, lanes = self.lane_work[u], self.lane_t
        if len(work) == 1:
            k, dur = work[0]
            self.upd_start[u], lanes[k] = self._pipelined(lanes[k], feed_start, feed_dur, feed_end, dur)
            self.upd_end[u] = lanes[k]
            return
        self.upd_start[u], self.upd_end[u] = float("inf"), 0.0
        for k, dur in work:
            start, lanes[k] = self._pipelined(lanes[k], feed_start, feed_dur, feed_end, dur)
            self.upd_start[u] = min(self.upd_start[u], start)
            self.upd_end[u] = max(self.upd_end[u], lanes[k])

    def _updates_in_order(self, gate: float) -> None:
        for u in range(len(self.w.units)):
            self._update(u, gate, 0.0, gate)

    def _deliver(self, u: int, gate: float, from_cpu: bool) -> tuple[float, str]:
        """When unit ``u``'s weights are on the GPU (H2D, then all-gather) and what delayed them."""
        c = self.c
        if from_cpu:
            hs, he = self._pipelined(self.h2d_t, self.upd_start[u], self.upd[u], self.upd_end[u], self.h2d[u], gate)
            why = "cpu" if self.upd_end[u] + self.h2d[u] / c >= he - 1e-15 and self.upd[u] > 0 else "h2d"
        else:
            hs = max(self.h2d_t, gate)
            he = hs + self.h2d[u]
            why = "h2d"
        self.h2d_t = he
        if self.ag[u]:
            _, self.ag_t = self._pipelined(self.ag_t, hs, self.h2d[u], he, self.ag[u])
            return self.ag_t, ("collective" if self.ag_t > he + self.ag[u] / c + 1e-15 else why)
        return he, why

    def _forward(self) -> None:
        units, depth = self.w.units, self.w.policy.prefetch_depth
        from_cpu = self.w.policy.update_schedule == "next_forward"
        for u in range(len(units)):
            gate = self.fwd_end[u - depth] if u >= depth else 0.0
            ready, why = (self.gpu, "bubble") if self.gpu_state[u] else self._deliver(u, gate, from_cpu)
            self._wait(ready, why)
            self.gpu = self.fwd_end[u] = (self.gpu if self.gpu > ready else ready) + units[u].fwd_s
            if self.ckpt_out[u]:
                self.d2h_t = self.ckpt_end[u] = max(self.d2h_t, self.gpu) + self.ckpt_out[u]

    def _backward(self) -> None:
        w = self.w
        nu, depth = len(w.units), w.policy.prefetch_depth
        for u in range(nu - 1, -1, -1):
            later = u + depth
            gate = self.bwd_end[later] if later < nu else 0.0
            ready, why = self.gpu, "bubble"
            if w.refetched_in_backward(u):
                ready, why = self._deliver(u, gate, False)
            if self.ckpt_in[u]:
                self.h2d_t = max(self.h2d_t, self.ckpt_end[u], gate) + self.ckpt_in[u]
                if self.h2d_t > ready:
                    ready, why = self.h2d_t, "h2d"
            if later < nu and self.grad_end[later] > ready:
                ready, why = self.grad_end[later], "d2h"
            self._wait(ready, why)
            self.gpu = self.bwd_end[u] = (self.gpu if self.gpu > ready else ready) + w.units[u].bwd_s
            self._gradient_out(u)

    def _gradient_out(self, u: int) -> None:
        """Reduce (GPU links) and copy out (D2H) unit ``u``'s gradient; ``as_ready`` updates it on landing."""
        if self.gpu_state[u]:  # the gradient stays on the GPU (all-reduced across ranks)
            if self.allreduce[u]:
                self.rs_t = max(self.rs_t, self.gpu) + self.allreduce[u]
            self.grad_end[u] = self.rs_t if self.allreduce[u] else self.gpu
            return
        rs_start = self.gpu
        if self.rs[u]:
            rs_start = max(self.rs_t, self.gpu)
            self.rs_t = rs_start + self.rs[u]
        feed_start, feed_dur, feed_end = rs_start, self.rs[u], self.rs_t if self.rs[u] else self.gpu
        if self.xh[u]:  # cross-host collective of the reduced shards, chunk-pipelined behind the reduce-scatter
            feed_start, self.xh_t = self._pipelined(self.xh_t, feed_start, feed_dur, feed_end, self.xh[u])
            feed_dur, feed_end = self.xh[u], self.xh_t
        ds, self.grad_end[u] = self._pipelined(self.d2h_t, feed_start, feed_dur, feed_end, self.d2h[u])
        self.d2h_t = self.grad_end[u]
        if self.w.policy.update_schedule == "as_ready":
            self._update(u, ds, self.d2h[u], self.grad_end[u])

    def phase_traffic(self) -> tuple[dict[str, float], dict[str, float]]:
        """Host DRAM bytes and PCIe duplex bytes (all ranks) issued in the forward and backward windows."""
        w = self.w
        nu = len(w.units)
        fwd_host = sum(self.host_h2d) + sum(self.host_ag) + sum(self.host_ckpt)
        fwd_pcie = sum(self.host_h2d) + sum(self.host_ckpt) + sum(self.pcie_ag)
        refetch = [u for u in range(nu) if w.refetched_in_backward(u)]  # GPU-state units are resident
        bwd_host = (sum(self.host_h2d[u] + self.host_ag[u] for u in refetch) + sum(self.host_ckpt)
                    + sum(self.host_d2h) + sum(self.host_rs))
        bwd_pcie = (sum(self.host_h2d[u] + self.pcie_ag[u] for u in refetch) + sum(self.host_ckpt)
                    + sum(self.host_d2h) + sum(self.pcie_rs))
        if w.policy.update_schedule == "next_forward":
            fwd_host += sum(self.host_upd)
        else:
            bwd_host += sum(self.host_upd)
        return {"fwd": fwd_host, "bwd": bwd_host}, {"fwd": fwd_pcie, "bwd": bwd_pcie}


def estimate_step(w: StepWorkload, with_memory: bool = True) -> StepEstimate:
    demands = resource_demands(w)
    recurrence = _Recurrence(w, demands)
    rec = recurrence.run()
    host, duplex = recurrence.phase_traffic()
    caps = resource_capacities(w.hw)
    exposure = rec["exposure"]
    total = 0.0
    for phase in ("fwd", "bwd"):  # the backward window runs to the end of the step (tail included)
        length = rec[phase]
        floor = max(host[phase] / caps["hostmem"], duplex[phase] / w.ranks / caps["pcie[0]"])
        if floor > length:  # the phase's host traffic cannot fit its pipelined length: DRAM-bound
            cpu_heavy = w.policy.update_schedule == ("next_forward" if phase == "fwd" else "as_ready")
            exposure["cpu" if cpu_heavy or w.policy.update_schedule == "after_backward" and phase == "bwd"
                     else "h2d" if phase == "fwd" else "d2h"] += floor - length
            length = floor
        total += length
    bound = max(demands.values())
    step = max(total, bound)
    compute = sum(u.fwd_s + u.bwd_s + w.gpu_adam_s(i) for i, u in enumerate(w.units))
    if step > total:
        exposure["bubble"] += step - total
    return StepEstimate(
        step_time_s=step,
        lower_bound_s=bound,
        tokens_per_s=w.tokens_per_step / step,
        model_tflops=w.model_flops_per_step() / step / (w.ranks * w.hosts) / 1e12,
        compute_s=compute,
        demands=demands,
        exposure=exposure,
        memory=estimate_memory(w) if with_memory else None,
    )
