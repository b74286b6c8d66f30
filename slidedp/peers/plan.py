"""A peer system's step as a :class:`~slidedp.schedule.Plan`, for the same simulator that runs SlideDP's.

The order is what the peers do: forward layer by layer, each layer's weights fetched (host copy and/or all-gather)
at most ``PEER_WINDOW`` layers ahead (only after the previous layer's pass where the system's copy cannot overlap
one, ``PeerSystem.fetch_overlaps_passes``); backward in reverse, re-fetching where the system reshards, each layer's
gradient reduced over the ranks and copied to the host as soon as it is computed, a layer's gradient buffer reused
``PEER_WINDOW`` layers later (or, where the system's offload runs in series with backward, ``serial_grad_copy``,
the next layer's backward waiting for this one's reduction, GPU passes, host reads and copy); then the optimizer:
on the CPU after the whole backward (clip passes, AdamW, the bf16 cast and the copy of the new weights back to the
GPUs where the system keeps weights there), or fused AdamW on each GPU; or, for a system that updates per unit
(SlideFormer), each unit's CPU AdamW as soon as its gradient has landed, overlapping the rest of backward, its
gradient copy waiting for the buffer it reuses. Systems that keep checkpoints on the host copy each decoder layer's
input out after its forward and back before its backward (at most ``PEER_WINDOW`` layers ahead). Byte counts come
from :class:`~slidedp.peers.step.PeerStep`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slidedp.peers.step import GRAD_SYNC_OP, PEER_WINDOW, PeerStep
from slidedp.resources import CORES, collective_usage, cpu_pass_usage, dma_usage
from slidedp.schedule import Plan

if TYPE_CHECKING:
    import pandas as pd

# Whole-model ops (the optimizer after backward) are recorded against unit 0, chunk -1, as SlideDP's gpu_adam is.
_WHOLE = dict(unit=0, chunk=-1)


class _PeerBuilder:
    def __init__(self, step: PeerStep):
        self.step, self.w = step, step.w
        self.plan = Plan()
        self.n, self.count = step.n, step.w.num_units
        self.fwd: dict[tuple[int, int], int] = {}
        self.bwd: dict[tuple[int, int], int] = {}
        self.grad_done: dict[tuple[int, int], int] = {}
        self.unit_update: dict[tuple[int, int], int] = {}
        self.ckpt_out: dict[tuple[int, int], int] = {}
        self._groups = 0

    def _group(self) -> int:
        self._groups += 1
        return self._groups - 1

    def _collective(self, op: str, r: int, u: int, nbytes: float, deps: list[int], group: int, stream: str,
                    **where) -> int:
        w = self.w
        usage = collective_usage(w.hw, r)
        where = where or dict(unit=u, chunk=-1)
        return self.plan.add(op=op, rank=r, stream=f"{stream}[{r}]", resource=f"link[{r}]", amount=nbytes, flops=0.0,
                             host_bytes=nbytes * usage.get("hostmem", 0.0), deps=deps, usage=usage,
                             cap=w.collective_cap(), latency=w.link_latency, group=group, **where)

    def _h2d(self, r: int, nbytes: float, deps: list[int], fetch: bool = False, op: str = "h2d_param",
             stream: str = "h2d", **where) -> int:
        """A host-to-GPU copy on the H2D link, queued on ``stream`` (the fetches' own by default); a weight
        ``fetch`` also carries the CPU cast that feeds it where the system casts on fetch (its DRAM bytes on the
        copy's, its rate as the copy's cap)."""
        w, step = self.w, self.step
        usage = dma_usage(w.hw, r, "h2d")
        per_byte = step.fetch_host_per_byte() if fetch else 1.0
        usage["hostmem"] = per_byte
        if fetch and step.system.cast_on_fetch:  # the cast feeding the copy runs on every core
            usage[CORES] = 1.0 / step.fetch_cap()
        return self.plan.add(op=op, rank=r, stream=f"{stream}[{r}]", resource=f"h2d[{r}]", amount=nbytes, flops=0.0,
                             host_bytes=nbytes * per_byte, deps=deps, usage=usage,
                             cap=step.fetch_cap() if fetch else float("inf"), latency=w.pcie_latency, **where)

    def _d2h(self, r: int, nbytes: float, deps: list[int], op: str, **where) -> int:
        """A GPU-to-host copy on the D2H link, queued on the rank's d2h stream."""
        w = self.w
        return self.plan.add(op=op, rank=r, stream=f"d2h[{r}]", resource=f"d2h[{r}]", amount=nbytes, flops=0.0,
                             host_bytes=nbytes, deps=deps, usage=dma_usage(w.hw, r, "d2h"), latency=w.pcie_latency,
                             **where)

    def fetch(self, u: int, window_dep, backward: bool = False) -> dict[int, list[int]]:
        """Copy each rank's shard of unit ``u`` from the host and/or all-gather it; the ops compute waits on."""
        step = self.step
        ready: dict[int, list[int]] = {r: [] for r in range(self.n)}
        h2d_bytes, ag_bytes = step.h2d_fetch_bytes(u, backward), step.allgather_bytes(u)
        for r in range(self.n):
            deps = [d for d in (window_dep(r),) if d is not None]
            if h2d_bytes > 0:
                ready[r] = [self._h2d(r, h2d_bytes, deps, fetch=True, unit=u, chunk=-1)]
            elif ag_bytes > 0:
                ready[r] = deps
        if ag_bytes > 0:
            group = self._group()
            for r in range(self.n):
                ready[r] = [self._collective("allgather", r, u, ag_bytes, ready[r], group, "ag")]
        return ready

    def forward(self) -> None:
        window = self.step.fetch_window
        for u in range(self.count):
            ready = ({r: [] for r in range(self.n)} if not self.step.fetches(u, backward=False)
                     else self.fetch(u, lambda r, u=u: self.fwd.get((u - window, r))))
            unit = self.w.units[u]
            for r in range(self.n):
                self.fwd[(u, r)] = self.plan.add(op="fwd", rank=r, stream=f"gpu[{r}]", resource=f"gpu[{r}]", unit=u,
                                                 chunk=-1, amount=self.step.forward_s(u), flops=unit.fwd_flops,
                                                 host_bytes=0.0, deps=ready[r])
                ckpt = self.step.checkpoint_bytes(u)
                if ckpt > 0:
                    self.ckpt_out[(u, r)] = self._d2h(r, ckpt, [self.fwd[(u, r)]], "d2h_ckpt", unit=u, chunk=-1)

    def backward(self) -> None:
        step = self.step
        serial = step.system.serial_grad_copy is not None
        for u in range(self.count - 1, -1, -1):
            later = u + PEER_WINDOW
            ahead = u + step.fetch_window
            ready = ({r: [] for r in range(self.n)} if not step.fetches(u, backward=True)
                     else self.fetch(u, lambda r, ahead=ahead: self.bwd.get((ahead, r)), backward=True))
            seconds, flops = step.backward_s(u)
            ckpt = step.checkpoint_bytes(u)
            for r in range(self.n):
                deps = list(ready[r])
                if (later, r) in self.grad_done:  # that layer's gradient buffer must have been reduced / copied out
                    deps.append(self.grad_done[(later, r)])
                if serial and (u + 1, r) in self.grad_done:  # the previous unit's gradient is on the host first
                    deps.append(self.grad_done[(u + 1, r)])
                if ckpt > 0:  # the layer's input comes back from the host, at most PEER_WINDOW layers ahead
                    window = [d for d in (self.bwd.get((later, r)),) if d is not None]
                    deps.append(self._h2d(r, ckpt, [self.ckpt_out[(u, r)], *window], op="h2d_ckpt", unit=u, chunk=-1))
                self.bwd[(u, r)] = self.plan.add(op="bwd", rank=r, stream=f"gpu[{r}]", resource=f"gpu[{r}]", unit=u,
                                                 chunk=-1, amount=seconds, flops=flops, host_bytes=0.0, deps=deps)
            self.gradient_out(u)

    def gradient_out(self, u: int) -> None:
        step = self.step
        done = {r: self.bwd[(u, r)] for r in range(self.n)}
        nbytes = step.grad_collective_bytes(u)
        if nbytes > 0:
            op = step.system.grad_op
            group = self._group()
            for r in range(self.n):
                done[r] = self._collective(op, r, u, nbytes, [done[r]], group, "rs")
        d2h, staged = step.d2h_grad_bytes(u), step.grad_staging_bytes(u)
        sync_s = step.grad_sync_s(u)
        per_unit = step.system.update_per_unit
        buffers = step.system.grad_buffers
        for r in range(self.n):
            if sync_s > 0:  # the unit's GPU passes and host reads before its copy, on the offload's own chain
                done[r] = self.plan.add(op=GRAD_SYNC_OP, rank=r, stream=f"d2h[{r}]", resource=f"gpu[{r}]", unit=u,
                                        chunk=-1, amount=sync_s, flops=0.0, host_bytes=0.0, deps=[done[r]])
            if staged > 0:  # the partition to a pinned host buffer and straight back, before its fp32 copy; the
                # way back is queued behind the gradient chain (DeepSpeed's reduce stream), not behind the fetches
                done[r] = self._d2h(r, staged, [done[r]], "d2h_grad", unit=u, chunk=-1)
                done[r] = self._h2d(r, staged, [done[r]], op="h2d_grad", stream="d2h", unit=u, chunk=-1)
            if d2h > 0:
                deps = [done[r]]
                if per_unit and buffers and (u + buffers, r) in self.unit_update:  # its host buffer is free again
                    deps.append(self.unit_update[(u + buffers, r)])
                done[r] = self._d2h(r, d2h, deps, "d2h_grad", unit=u, chunk=-1)
            self.grad_done[(u, r)] = done[r]
            if per_unit:
                nbytes = step.unit_adam_bytes(u)
                self.unit_update[(u, r)] = self.plan.add(
                    op="adam", rank=r, stream=f"cpu[{r}]", resource=f"cpu[{r}]", unit=u, chunk=-1, amount=nbytes,
                    flops=0.0, host_bytes=nbytes, deps=[done[r]], usage=cpu_pass_usage(step.adam_cap()),
                    cap=step.adam_cap())

    def optimizer(self) -> None:
        """After the whole backward of every rank (the global gradient norm needs all of it)."""
        step, plan = self.step, self.plan
        if step.system.update_per_unit:  # every unit's update is already in the plan, behind its gradient
            return
        backward_end = [self.grad_done[(u, r)] for u in range(self.count) for r in range(self.n)]
        backward_end += [plan.streams[f"gpu[{r}]"][-1] for r in range(self.n)]
        if not step.system.updates_on_cpu:
            for r in range(self.n):
                plan.add(op="gpu_adam", rank=r, stream=f"gpu[{r}]", resource=f"gpu[{r}]", amount=step.gpu_adam_s(),
                         flops=0.0, host_bytes=0.0, deps=backward_end, **_WHOLE)
            return
        passes = (("clip", step.clip_host_bytes(), step.clip_cap), ("adam", step.adam_host_bytes(), step.adam_cap),
                  ("cast", step.cast_host_bytes(), step.cast_cap))
        updated = {}
        for r in range(self.n):
            deps, stream = backward_end, f"cpu[{r}]"
            for op, nbytes, cap in passes:
                if nbytes > 0:
                    deps = [plan.add(op=op, rank=r, stream=stream, resource=stream, amount=nbytes, flops=0.0,
                                     host_bytes=nbytes, deps=deps, usage=cpu_pass_usage(cap()), cap=cap(),
                                     **_WHOLE)]
            updated[r] = deps
        nbytes = step.writeback_h2d_bytes()
        if nbytes <= 0:
            return
        copied = {r: self._h2d(r, nbytes, updated[r], **_WHOLE) for r in range(self.n)}
        ag = step.writeback_allgather_bytes()
        if ag > 0:
            group = self._group()
            for r in range(self.n):
                self._collective("allgather", r, 0, ag, [copied[r]], group, "ag", **_WHOLE)

    def build(self) -> Plan:
        self.step.check_rates()
        self.forward()
        self.backward()
        self.optimizer()
        return self.plan


def build_peer_plan(step: PeerStep) -> Plan:
    return _PeerBuilder(step).build()


# The ops a peer runs once per step after its whole backward (optimizer()), where it does not update per unit.
AFTER_BACKWARD_OPS = ("clip", "adam", "cast", "gpu_adam")


def phase_seconds(step: PeerStep, trace: pd.DataFrame, step_s: float, rank: int = 0) -> dict[str, float]:
    """The phases a peer's benchmark times (benchmarks.peer_setup.PhaseClock) in a simulated step of ``step``:
    ``forward`` (until rank ``rank``'s last forward pass ends), ``backward`` (until the first op after backward
    starts: every gradient reduced and copied, since those ops wait for all of it), and ``after_backward`` (the
    rest of the step: clip, optimizer, the new weights' copy back), of which ``clip`` where the system clips on the
    CPU. A system that updates per unit has no phase after backward beyond the last updates' tail. Why: a step time
    within 2% can hide a forward 22% short and a clip 27% long (FSDP2-offload on the H200, twentieth session)."""
    ops = trace[trace["rank"] == rank]
    if not (ops["op"] == "fwd").any():
        raise ValueError(f"the trace has no forward pass of rank {rank}: not a peer step's trace")
    forward_end = float(ops.loc[ops["op"] == "fwd", "end_s"].max())
    after = ops[ops["op"].isin(AFTER_BACKWARD_OPS)]
    if step.system.update_per_unit or after.empty:
        backward_end = float(ops.loc[ops["op"] == "bwd", "end_s"].max())
    else:
        backward_end = float(after["start_s"].min())
    phases = {"forward": forward_end, "backward": backward_end - forward_end, "after_backward": step_s - backward_end}
    clip = ops[ops["op"] == "clip"]
    if not clip.empty and not step.system.update_per_unit:
        phases["clip"] = float((clip["end_s"] - clip["start_s"]).sum())
    return phases
