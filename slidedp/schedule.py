"""The step as an ordered graph of operations on per-rank streams.

Every stream (a GPU's compute stream, its H2D and D2H copy streams, its all-gather and reduce-scatter
communicators, its rank's CPU optimizer worker) executes its ops in the order listed here, each op
waiting for its dependencies, exactly as CUDA streams wait on events. The simulator executes this
graph; the runtime issues work in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slidedp.resources import NIC, collective_usage, dma_usage, nic_usage
from slidedp.workload import StepWorkload

STREAM_KINDS: tuple[str, ...] = ("gpu", "h2d", "d2h", "ag", "rs", "xh", "cpu")  # xh: cross-host collectives


@dataclass(slots=True)
class Op:
    id: int
    op: str  # trace op name (see workload.OP_CATEGORY)
    rank: int
    stream: str  # e.g. "h2d[2]"; ops on one stream run one at a time, in list order
    resource: str  # trace resource name
    unit: int
    chunk: int  # -1 for whole-unit ops
    amount: float  # bytes for flows, seconds for compute
    flops: float
    host_bytes: float  # DRAM traffic the op causes
    deps: list[int]
    usage: dict[str, float] | None = None  # None: a fixed-duration compute op
    cap: float = float("inf")  # flow rate limit in bytes/s (CPU passes, collectives)
    latency: float = 0.0
    group: int = -1  # collective: all members start together and finish together
    micro_batch: int = -1  # -1: all micro-batches of the step (layer-major order)


@dataclass
class Plan:
    ops: list[Op] = field(default_factory=list)
    streams: dict[str, list[int]] = field(default_factory=dict)
    groups: dict[int, list[int]] = field(default_factory=dict)

    def add(self, **kwargs) -> int:
        op = Op(id=len(self.ops), **kwargs)
        self.ops.append(op)
        self.streams.setdefault(op.stream, []).append(op.id)
        if op.group >= 0:
            self.groups.setdefault(op.group, []).append(op.id)
        return op.id


class _Builder:
    """Turns a StepWorkload into a Plan; one method per phase of the step."""

    def __init__(self, w: StepWorkload):
        self.w = w
        self.plan = Plan()
        self.n, self.c, self.u_count = w.ranks, w.chunks, w.num_units
        self.depth = w.policy.prefetch_depth
        self.fwd: dict[tuple[int, int], int] = {}
        self.bwd: dict[tuple[int, int], int] = {}
        self.ckpt_out: dict[tuple[int, int], int] = {}
        self.grad_out: dict[tuple[int, int, int], int] = {}
        self.updated: dict[tuple[int, int], list[int]] = {}
        self._next_group = 0

    def _group(self) -> int:
        self._next_group += 1
        return self._next_group - 1

    # ---- CPU optimizer jobs ---------------------------------------------------------------------------
    def update_chunk(self, u: int, c: int, deps_of_rank) -> None:
        w, plan = self.w, self.plan
        if w.gpu_state(u):  # updated on the GPU at the end of the step (gpu_updates)
            return
        finished = []
        for rank, params in w.update_owners(u, c):
            deps = list(deps_of_rank(rank))
            stream = f"cpu[{rank}]"
            common = dict(rank=rank, stream=stream, resource=stream, unit=u, chunk=c, flops=0.0)
            if w.routes.cpu_reduces:
                hb = w.cpu_reduce_host_bytes(params * (1.0 / w.routes.host_state_fraction))  # the whole chunk
                plan.add(op="cpu_reduce", amount=hb, host_bytes=hb, deps=deps, usage={"hostmem": 1.0},
                         cap=w.cpu_reduce_cap(), **common)
                deps = []
            if w.nic_grad_from_host:  # the owner's CPU sum, with its peers on the other hosts
                nb = w.nic_grad_bytes(u)
                plan.add(op=w.nic_grad_op, amount=nb, host_bytes=nb, deps=deps, usage=nic_usage(True),
                         latency=w.nic_latency, **{**common, "resource": NIC})
                deps = []
            hb = w.adam_host_bytes(params)
            last = plan.add(op="adam", amount=hb, host_bytes=hb, deps=deps, usage={"hostmem": 1.0},
                            cap=w.adam_cap(), latency=w.update_call_latency, **common)
            hb = w.cast_host_bytes(params)
            if hb > 0:  # a separate cast pass, unless the optimizer kernel writes the bf16 copy itself
                last = plan.add(op="cast", amount=hb, host_bytes=hb, deps=[], usage={"hostmem": 1.0},
                                cap=w.cast_cap(), **common)
            nb = w.nic_weight_bytes(u) * params / (w.units[u].params / self.c * w.routes.host_state_fraction)
            if nb > 0:  # sharded across hosts: this owner's new weights to its peers, theirs into this slot
                last = plan.add(op="weight_allgather", amount=nb, host_bytes=nb, deps=[], usage=nic_usage(True),
                                latency=w.nic_latency, **{**common, "resource": NIC})
            finished.append(last)
        self.updated[(u, c)] = finished

    def updates_in_forward_order(self, deps_of_rank) -> None:
        for u in range(self.u_count):
            for c in range(self.c):
                self.update_chunk(u, c, deps_of_rank)

    # ---- parameter delivery -----------------------------------------------------------------------------
    def deliver_params(self, u: int, window_dep) -> dict[int, list[int]]:
        """H2D (and all-gather) of every chunk of unit ``u`` to every rank; returns delivery ops per rank."""
        w, plan = self.w, self.plan
        delivered: dict[int, list[int]] = {r: [] for r in range(self.n)}
        if w.gpu_state(u):  # its weights never leave the GPU
            return delivered
        for c in range(self.c):
            h2d_ids = []
            for r in range(self.n):
                deps = list(self.updated.get((u, c), ())) if w.policy.update_schedule == "next_forward" else []
                wd = window_dep(r)
                if wd is not None:
                    deps.append(wd)
                nbytes = w.h2d_param_bytes(u)
                h2d_ids.append(plan.add(op="h2d_param", rank=r, stream=f"h2d[{r}]", resource=f"h2d[{r}]",
                                        unit=u, chunk=c, amount=nbytes, flops=0.0, host_bytes=nbytes,
                                        deps=deps, usage=dma_usage(w.hw, r, "h2d"), latency=w.pcie_latency))
            ag_bytes = w.allgather_bytes(u)
            if ag_bytes > 0:
                group = self._group()
                for r in range(self.n):
                    usage = collective_usage(w.hw, r)
                    delivered[r].append(plan.add(
                        op="allgather", rank=r, stream=f"ag[{r}]", resource=f"link[{r}]", unit=u, chunk=c,
                        amount=ag_bytes, flops=0.0, host_bytes=ag_bytes * usage.get("hostmem", 0.0),
                        deps=[h2d_ids[r]], usage=usage, cap=w.collective_cap(), latency=w.link_latency,
                        group=group))
            else:
                for r in range(self.n):
                    delivered[r].append(h2d_ids[r])
        return delivered

    # ---- forward ---------------------------------------------------------------------------------------------
    def forward(self) -> None:
        w, plan = self.w, self.plan
        for u in range(self.u_count):
            unit = w.units[u]
            delivered = self.deliver_params(
                u, lambda r, u=u: self.fwd[(u - self.depth, r)] if u - self.depth >= 0 else None)
            for r in range(self.n):
                self.fwd[(u, r)] = plan.add(op="fwd", rank=r, stream=f"gpu[{r}]", resource=f"gpu[{r}]", unit=u,
                                            chunk=-1, amount=unit.fwd_s, flops=unit.fwd_flops, host_bytes=0.0,
                                            deps=delivered[r])
                if w.offloads_checkpoint(u):
                    nbytes = unit.checkpoint_bytes
                    self.ckpt_out[(u, r)] = plan.add(
                        op="d2h_ckpt", rank=r, stream=f"d2h[{r}]", resource=f"d2h[{r}]", unit=u, chunk=-1,
                        amount=nbytes, flops=0.0, host_bytes=nbytes, deps=[self.fwd[(u, r)]],
                        usage=dma_usage(w.hw, r, "d2h"), latency=w.pcie_latency)

    # ---- backward --------------------------------------------------------------------------------------------
    def backward(self) -> None:
        w, plan = self.w, self.plan
        for u in range(self.u_count - 1, -1, -1):
            unit = w.units[u]
            later = u + self.depth  # the unit whose buffers this one reuses in backward order
            deps_by_rank: dict[int, list[int]] = {r: [] for r in range(self.n)}
            if w.refetched_in_backward(u):
                delivered = self.deliver_params(
                    u, lambda r, later=later: self.bwd[(later, r)] if later < self.u_count else None)
                for r in range(self.n):
                    deps_by_rank[r].extend(delivered[r])
            if w.offloads_checkpoint(u):
                for r in range(self.n):
                    deps = [self.ckpt_out[(u, r)]]
                    if later < self.u_count:
                        deps.append(self.bwd[(later, r)])
                    nbytes = unit.checkpoint_bytes
                    deps_by_rank[r].append(plan.add(
                        op="h2d_ckpt", rank=r, stream=f"h2d[{r}]", resource=f"h2d[{r}]", unit=u, chunk=-1,
                        amount=nbytes, flops=0.0, host_bytes=nbytes, deps=deps, usage=dma_usage(w.hw, r, "h2d"),
                        latency=w.pcie_latency))
            for r in range(self.n):
                deps = deps_by_rank[r]
                if later < self.u_count:  # gradient buffer of `later` must have left the GPU
                    deps.extend(self.grad_out[(later, c, r)] for c in range(self.c))
                self.bwd[(u, r)] = plan.add(op="bwd", rank=r, stream=f"gpu[{r}]", resource=f"gpu[{r}]", unit=u,
                                            chunk=-1, amount=unit.bwd_s, flops=unit.bwd_flops, host_bytes=0.0,
                                            deps=deps)
            self.gradients_out(u)
            if w.policy.update_schedule == "as_ready" and not w.gpu_state(u):
                for c in range(self.c):
                    self.update_chunk(u, c, self._landed_deps(u, c))

    def _landed_deps(self, u: int, c: int):
        def deps(rank: int) -> list[int]:
            if self.w.routes.shards_updates:
                return [self.grad_out[(u, c, rank)]]
            return [self.grad_out[(u, c, r)] for r in range(self.n)]
        return deps

    def gradients_out(self, u: int) -> None:
        w, plan = self.w, self.plan
        if w.gpu_state(u):
            self.gpu_gradient(u)
            return
        rs_bytes = w.reduce_scatter_bytes(u)
        for c in range(self.c):
            ready = {r: self.bwd[(u, r)] for r in range(self.n)}
            if rs_bytes > 0:
                group = self._group()
                for r in range(self.n):
                    usage = collective_usage(w.hw, r)
                    ready[r] = plan.add(op="reduce_scatter", rank=r, stream=f"rs[{r}]", resource=f"link[{r}]",
                                        unit=u, chunk=c, amount=rs_bytes, flops=0.0,
                                        host_bytes=rs_bytes * usage.get("hostmem", 0.0), deps=[ready[r]],
                                        usage=usage, cap=w.collective_cap(), latency=w.link_latency, group=group)
            if w.nic_grad_op and not w.nic_grad_from_host:  # the reduced shards, with the other hosts'
                nb = w.nic_grad_bytes(u) / self.n  # this rank's part of its host's NIC traffic
                for r in range(self.n):
                    ready[r] = plan.add(op=w.nic_grad_op, rank=r, stream=f"xh[{r}]", resource=NIC, unit=u, chunk=c,
                                        amount=nb, flops=0.0, host_bytes=0.0, deps=[ready[r]], usage=nic_usage(False),
                                        latency=w.nic_latency)
            nbytes = w.d2h_grad_bytes(u)
            for r in range(self.n):
                self.grad_out[(u, c, r)] = plan.add(
                    op="d2h_grad", rank=r, stream=f"d2h[{r}]", resource=f"d2h[{r}]", unit=u, chunk=c,
                    amount=nbytes, flops=0.0, host_bytes=nbytes, deps=[ready[r]], usage=dma_usage(w.hw, r, "d2h"),
                    latency=w.pcie_latency)

    def gpu_gradient(self, u: int) -> None:
        """A GPU-state unit's gradient stays on the GPU; with several ranks it is all-reduced (one op per
        unit, so every chunk slot of grad_out points at it)."""
        w, plan = self.w, self.plan
        nbytes = w.allreduce_bytes(u)
        group = self._group() if nbytes > 0 else -1
        for r in range(self.n):
            done = self.bwd[(u, r)]
            if nbytes > 0:
                usage = collective_usage(w.hw, r)
                done = plan.add(op="allreduce", rank=r, stream=f"rs[{r}]", resource=f"link[{r}]", unit=u, chunk=-1,
                                amount=nbytes, flops=0.0, host_bytes=nbytes * usage.get("hostmem", 0.0),
                                deps=[done], usage=usage, cap=w.collective_cap(), latency=w.link_latency,
                                group=group)
            for c in range(self.c):
                self.grad_out[(u, c, r)] = done

    def gpu_updates(self) -> None:
        """AdamW of the GPU-state units on each GPU's compute stream, once its gradients are reduced."""
        w, plan = self.w, self.plan
        gpu_units = [u for u in range(self.u_count) if w.gpu_state(u)]
        if not gpu_units:
            return
        seconds = sum(w.gpu_adam_s(u) for u in gpu_units)
        for r in range(self.n):  # one multi-tensor launch for all of them, as the runtime issues it
            plan.add(op="gpu_adam", rank=r, stream=f"gpu[{r}]", resource=f"gpu[{r}]", unit=0, chunk=-1,
                     amount=seconds, flops=0.0, host_bytes=0.0, deps=[self.grad_out[(u, 0, r)] for u in gpu_units])

    def build(self) -> Plan:
        schedule = self.w.policy.update_schedule
        if schedule == "next_forward":
            # The previous step's gradients (and the global norm) are known at step start.
            self.updates_in_forward_order(lambda rank: [])
        self.forward()
        self.backward()
        self.gpu_updates()
        if schedule == "after_backward":  # the runtime synchronises the device, then submits every update
            last = [max(self.grad_out[(u, c, r)] for u in range(self.u_count) for c in range(self.c))
                    for r in range(self.n)]
            final = [self.plan.streams[f"gpu[{r}]"][-1] for r in range(self.n)]
            self.updates_in_forward_order(lambda rank: [last[rank], final[rank]])
        return self.plan


def build_plan(w: StepWorkload) -> Plan:
    return _Builder(w).build()
