"""One training step of host-resident layer streaming on one device.

Order of work, per step (layer-major: each unit is streamed once for all micro-batches):
  forward  - for each unit: stream its chunks in (after their pending CPU update, by schedule), run every
             micro-batch through it, keep or offload its input checkpoint, release it when the prefetch
             window moves on; the head computes the chunked cross-entropy *and* its own gradients, so full
             logits never exist and the head is never fetched twice.
  backward - for each unit in reverse: re-fetch it unless it is still resident, recompute (or replay the
             kept graph), accumulate fp32 gradients over micro-batches, add the squared norm, cast, and
             copy the gradient chunk by chunk into the host slot on the D2H stream.
  update   - AdamW per chunk on the CPU worker, by the policy's schedule (see slidedp.policy.Policy); the
             leading ``gpu_state_units`` never leave the GPU and are updated there once the norm is known.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from torch.func import functional_call

from slidedp.errors import SlideDPError
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.resources import ADAM_HOST_BYTES_BASE, CAST_HOST_BYTES, FUSED_ADAM_HOST_BYTES
from slidedp.routes import shard_bounds
from slidedp.runtime.comm import Comm
from slidedp.runtime.cpu_adam import fused_kernel, fused_kernel_error
from slidedp.runtime.device import Device
from slidedp.runtime.gpu_state import GpuOptimizerState
from slidedp.runtime.hf_adapter import ModelAdapter, UnitLayout
from slidedp.runtime.host_state import HostState
from slidedp.runtime.optim import OptimConfig, adamw_chunk_, clip_coefficient, lr_at
from slidedp.runtime.tracing import TraceRecorder
from slidedp.runtime.updates import UpdateWorker
from slidedp.units import resident_in_backward, unit_work


def chunk_ranges(n: int, chunks: int) -> list[tuple[int, int]]:
    step = -(-n // chunks)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def shared_buffer_sizes(adapter: ModelAdapter, policy: Policy, world: int) -> tuple[int, int]:
    """Entries of the shared update-flag table and elements of each rank's gradient landing buffer that a
    data-parallel engine with this policy needs (see HostState.allocate_shared)."""
    flags = sum(len(chunk_ranges(u.numel, policy.chunks_per_layer)) for u in adapter.units) * world
    landing = max(u.numel for u in adapter.units) if policy.grad_route == "per_rank" else 0
    return flags, landing


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    lr: float
    skipped: bool
    tokens: int
    trace: pd.DataFrame


@dataclass
class _Step:
    """What one step carries between its forward and backward units."""

    ids: list[torch.Tensor]
    labels: list[torch.Tensor]
    pos: torch.Tensor
    pe: tuple[torch.Tensor, torch.Tensor]
    inv_tokens: float
    norm_sq: torch.Tensor
    loss_total: torch.Tensor
    head_grad: torch.Tensor | None
    embed_grad: torch.Tensor | None
    live: dict = field(default_factory=dict)  # unit -> _DeviceUnit on the GPU now
    released: dict = field(default_factory=dict)  # kept-graph units whose memory was freed until backward
    ckpt: dict = field(default_factory=dict)  # unit -> its inputs per micro-batch
    kept: dict = field(default_factory=dict)  # unit -> (input leaf, output) per micro-batch (policy keep)
    grad_done: dict = field(default_factory=dict)  # unit -> event: its gradient left the GPU
    grad_out: list = field(default_factory=list)  # gradient w.r.t. the current unit's output, per micro-batch


class _DeviceUnit:
    """A unit's weights on the device: one flat tensor and per-parameter views of it."""

    def __init__(self, layout: UnitLayout, flat: torch.Tensor, persistent: bool = False):
        self.layout, self.flat = layout, flat
        self.persistent = persistent  # a GPU-state unit's weights: never released
        self.ready = None  # event: all chunks arrived
        self.leaves: dict[str, torch.Tensor] | None = None  # kept-graph leaves (activation policy keep)

    def params(self, requires_grad: bool) -> dict[str, torch.Tensor]:
        if requires_grad and self.leaves is not None:
            return self.leaves
        views = {p.name: self.flat[p.offset:p.offset + p.numel].view(p.shape) for p in self.layout.params}
        if requires_grad:
            views = {n: v.detach().requires_grad_() for n, v in views.items()}
        return views


class StreamingEngine:
    def __init__(self, adapter: ModelAdapter, spec: ModelSpec, host: HostState, policy: Policy, optim: OptimConfig,
                 device: Device, recorder: TraceRecorder, seq: int, compute_dtype: torch.dtype,
                 adam_threads: int | None = None, fused_adam: bool | None = None, comm: Comm | None = None):
        if policy.update_schedule == "as_ready" and optim.max_grad_norm is not None:
            raise SlideDPError("update_schedule as_ready updates before the global gradient norm is known: "
                               "it cannot clip; use next_forward (exact clipping) or disable max_grad_norm")
        self.adapter, self.host, self.policy, self.optim = adapter, host, policy, optim
        self.comm = comm or Comm()
        if self.comm.active and (host.flags is None or (policy.grad_route == "per_rank" and host.landing is None)):
            raise SlideDPError("data parallel needs a shared host state (HostState.allocate_shared)")
        self.device, self.recorder, self.seq, self.cdt = device, recorder, seq, compute_dtype
        self.units = adapter.units
        self.tied = adapter.tied
        self.rotary = adapter.rotary(device.torch_device)
        self.norm_module = adapter.skeleton.model.norm
        self.worker = UpdateWorker(self._run_update, threaded=device.is_cuda, threads=adam_threads)
        # One-pass AdamW + bf16 cast when the gradient lands in the bf16 weight slot (None: when it compiles).
        slot_is_bf16 = host.grads is None and host.slot.dtype == torch.bfloat16
        self._kernel = None
        if slot_is_bf16 and fused_adam is not False:
            self._kernel = fused_kernel()
            if self._kernel is None and fused_adam:
                raise SlideDPError(f"the fused CPU AdamW kernel did not compile: {fused_kernel_error()}")
        self._pending: tuple[float, float, int] | None = None  # (lr, clip coefficient, step) of deferred updates
        self.poison_next_gradient = False  # fault injection: make the next unit's gradient NaN
        self.nonfinite_chunks = 0  # as_ready only: chunks whose update was skipped for a non-finite gradient
        self._ckpt_pool: dict[tuple[int, int], torch.Tensor] = {}
        self._unit_chunks = [chunk_ranges(u.numel, policy.chunks_per_layer) for u in self.units]
        largest_chunk = max(b - a for chunks in self._unit_chunks for a, b in chunks)
        self._chunk_base = [0]
        for chunks in self._unit_chunks[:-1]:
            self._chunk_base.append(self._chunk_base[-1] + len(chunks))
        self._scratch = torch.empty(largest_chunk, dtype=torch.float32)  # the optimizer worker's fp32 gradient
        self._sim_units = unit_work(spec, policy.activation, policy.micro_batch, policy.accumulation, seq)
        if policy.gpu_state_units > len(self.units):
            raise SlideDPError(f"policy.gpu_state_units {policy.gpu_state_units} exceeds the model's "
                               f"{len(self.units)} units")
        self._gpu = GpuOptimizerState(self.units, policy.gpu_state_units, device.torch_device, compute_dtype)
        self._gpu_units: dict[int, _DeviceUnit] = {}
        self._gpu_grads: dict[int, torch.Tensor] = {}  # this step's fp32 gradients of the GPU-state units
        self._resident = resident_in_backward(self._sim_units, policy.prefetch_depth, policy.gpu_state_units)

    # ---- CPU updates ----------------------------------------------------------------------------------------
    def _chunks(self, u: int) -> list[tuple[int, int]]:
        return self._unit_chunks[u]

    def _owners(self, u: int, c: int) -> list[int]:
        """Ranks that update chunk ``c`` of unit ``u``: every rank its shard (reduce-scatter), or one owner."""
        if self.policy.grad_route == "reduce_scatter" or not self.comm.active:
            return list(range(self.comm.world))
        return [(u * self.policy.chunks_per_layer + c) % self.comm.world]

    def _owned_range(self, u: int, c: int) -> tuple[int, int] | None:
        """This rank's part of chunk ``c`` of unit ``u`` in the flat state, or None (GPU-state units: always)."""
        unit, (a, b) = self.units[u], self._chunks(u)[c]
        comm = self.comm
        if u < len(self._gpu) or comm.rank not in self._owners(u, c):
            return None
        if self.policy.grad_route == "reduce_scatter" and comm.active:
            bounds = shard_bounds(a, b, comm.world)
            a, b = bounds[comm.rank], bounds[comm.rank + 1]
        return unit.offset + a, unit.offset + b

    def _flag_index(self, u: int, c: int, rank: int) -> int:
        return (self._chunk_base[u] + c) * self.comm.world + rank

    def _run_update(self, key: tuple, args: tuple) -> None:
        (u, c), (lr, coef, step) = key, args
        lo, hi = self._owned_range(u, c)
        self._update_range(u, c, lo, hi, lr, coef, step)
        if self.host.flags is not None:
            self.host.flags[self._flag_index(u, c, self.comm.rank)] = step  # after the data: readers poll this

    def _update_range(self, u: int, c: int, lo: int, hi: int, lr: float, coef: float, step: int) -> None:
        host = self.host
        grad = host.grad_buffer[lo:hi]
        n = hi - lo
        if self.policy.update_schedule == "as_ready" and not bool(torch.isfinite(grad).all()):
            # Updated before the norm is known, a chunk can only protect itself: skip it, keep its weights.
            host.slot[lo:hi].copy_(host.master[lo:hi])
            self.nonfinite_chunks += 1
            return
        if self._kernel is not None:  # one pass: read grad + state, write state + bf16 weights (28 B/param)
            with self.recorder.host_span("cpu", "adam", u, c, nbytes=n * FUSED_ADAM_HOST_BYTES,
                                         host_bytes=n * FUSED_ADAM_HOST_BYTES):
                o = self.optim
                self._kernel.adamw_bf16(host.master[lo:hi], host.exp_avg[lo:hi], host.exp_avg_sq[lo:hi], grad, lr,
                                        o.beta1, o.beta2, o.eps, o.weight_decay, float(step), coef)
            return
        with self.recorder.host_span("cpu", "adam", u, c, nbytes=n * (ADAM_HOST_BYTES_BASE + grad.element_size()),
                                     host_bytes=n * (ADAM_HOST_BYTES_BASE + grad.element_size())):
            adamw_chunk_(host.master[lo:hi], grad, host.exp_avg[lo:hi], host.exp_avg_sq[lo:hi], step, lr, self.optim,
                         coef, self._scratch)
        with self.recorder.host_span("cpu", "cast", u, c, nbytes=n * CAST_HOST_BYTES, host_bytes=n * CAST_HOST_BYTES):
            host.slot[lo:hi].copy_(host.master[lo:hi])

    def _submit_all(self, lr: float, coef: float, step: int) -> None:
        for u in range(len(self.units)):
            for c in range(len(self._chunks(u))):
                if self._owned_range(u, c) is not None:
                    self.worker.submit((u, c), (lr, coef, step))

    def flush(self) -> None:
        """Apply deferred updates now and write GPU-held state back (before a checkpoint, an export, or the
        end of training): afterwards the host state is complete."""
        if self._pending is not None:
            self._submit_all(*self._pending)
            self._pending = None
        self.worker.wait_all()
        if self._gpu.loaded_step is not None and self.comm.rank == 0:
            self._gpu.write_back(self.host)
        self.comm.barrier()

    def _sync_gpu_state(self) -> None:
        """(Re)load the GPU-held units from the host state when it is not what the replica was built from."""
        if len(self._gpu) and self._gpu.loaded_step != self.host.step:
            self._gpu.load(self.host, self.host.step)
            self._gpu_units = {u: _DeviceUnit(self.units[u], w, persistent=True)
                               for u, w in enumerate(self._gpu.weights)}

    def _await_update(self, u: int, c: int) -> None:
        self.worker.wait((u, c))
        if self.comm.active:  # other ranks update parts of this chunk: wait for their flags in shared memory
            flags, step = self.host.flags, self.host.step
            for owner in self._owners(u, c):
                index = self._flag_index(u, c, owner)
                while int(flags[index]) < step:
                    time.sleep(0.0002)

    # ---- streaming ------------------------------------------------------------------------------------------
    def _fetch(self, u: int, into: _DeviceUnit | None = None) -> _DeviceUnit:
        dev, unit = self.device, self.units[u]
        if into is None:
            into = _DeviceUnit(unit, torch.empty(unit.numel, dtype=self.cdt, device=dev.torch_device))
        else:  # re-materialise a released kept-graph unit in the same storage
            into.flat.untyped_storage().resize_(unit.numel * into.flat.element_size())
        allocated = dev.event()  # the block may be reused memory: copy only once compute reached this point
        dev.wait(dev.h2d, allocated)
        esize = into.flat.element_size()
        sharded = self.policy.param_route == "sharded" and self.comm.active
        for c, (a, b) in enumerate(self._chunks(u)):
            self._await_update(u, c)
            with dev.on(dev.h2d), torch.autograd._unsafe_preserve_version_counter(into.flat), torch.no_grad():
                if not sharded:
                    src = self.host.slot[unit.offset + a:unit.offset + b]
                    with self.recorder.span("h2d", "h2d_param", u, c, nbytes=(b - a) * esize,
                                            host_bytes=(b - a) * esize, stream=dev.h2d):
                        into.flat[a:b].copy_(src, non_blocking=True)
                    continue
                bounds = shard_bounds(a, b, self.comm.world)
                sa, sb = bounds[self.comm.rank], bounds[self.comm.rank + 1]
                mine = torch.empty(sb - sa, dtype=into.flat.dtype, device=dev.torch_device)
                with self.recorder.span("h2d", "h2d_param", u, c, nbytes=(sb - sa) * esize,
                                        host_bytes=(sb - sa) * esize, stream=dev.h2d):
                    mine.copy_(self.host.slot[unit.offset + sa:unit.offset + sb], non_blocking=True)
                with self.recorder.span("link", "allgather", u, c, nbytes=(b - a - (sb - sa)) * esize,
                                        stream=dev.h2d):
                    self.comm.all_gather_into(into.flat[a:b], mine, bounds)
        into.ready = dev.event(dev.h2d)
        return into

    def _release(self, du: _DeviceUnit) -> None:
        if du.persistent:  # GPU-state weights stay; only this step's kept-graph leaves go
            du.leaves = None
            return
        if du.leaves is not None:  # kept graphs reference these views: free the memory, keep the tensors
            du.flat.untyped_storage().resize_(0)
        else:
            du.flat = None

    def _offload(self, u: int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        dev = self.device
        done = dev.event()
        dev.wait(dev.d2h, done)
        out = []
        nbytes = sum(x.numel() * x.element_size() for x in xs)
        with self.recorder.span("d2h", "d2h_ckpt", u, nbytes=nbytes, host_bytes=nbytes, stream=dev.d2h), \
                dev.on(dev.d2h):
            for mb, x in enumerate(xs):
                key = (u, mb)
                if key not in self._ckpt_pool or self._ckpt_pool[key].shape != x.shape:
                    buf = torch.empty(x.shape, dtype=x.dtype, pin_memory=dev.is_cuda)
                    self._ckpt_pool[key] = buf
                self._ckpt_pool[key].copy_(x, non_blocking=True)
                dev.keep_alive(x, dev.d2h)
                out.append(self._ckpt_pool[key])
        return out

    def _reload(self, u: int, xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], object]:
        dev = self.device
        nbytes = sum(x.numel() * x.element_size() for x in xs)
        allocated = dev.event()
        dev.wait(dev.h2d, allocated)
        out = []
        with self.recorder.span("h2d", "h2d_ckpt", u, nbytes=nbytes, host_bytes=nbytes, stream=dev.h2d), \
                dev.on(dev.h2d):
            for x in xs:
                y = torch.empty(x.shape, dtype=x.dtype, device=dev.torch_device)
                y.copy_(x, non_blocking=True)
                out.append(y)
        return out, dev.event(dev.h2d)

    # ---- compute --------------------------------------------------------------------------------------------
    def _layer(self, du: _DeviceUnit, x: torch.Tensor, pos, pe, params) -> torch.Tensor:
        out = functional_call(self.adapter.layer_module(du.layout), params, (x,),
                              {"attention_mask": None, "position_embeddings": pe, "position_ids": pos})
        return out[0] if isinstance(out, tuple) else out

    def _head_loss(self, h: torch.Tensor, labels: torch.Tensor, wn: torch.Tensor, w_out: torch.Tensor,
                   inv_tokens: float, grads: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
        """Chunked fused linear cross-entropy: loss and gradients of a micro-batch, one token chunk at a time."""
        hidden = h.reshape(-1, h.shape[-1])
        flat_labels = labels.reshape(-1)
        grad_h = torch.empty_like(hidden)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        step = self.policy.loss_chunk_tokens
        for s in range(0, hidden.shape[0], step):
            hc = hidden[s:s + step].detach().requires_grad_()
            with torch.enable_grad():
                normed = functional_call(self.norm_module, {"weight": wn}, (hc,))
                logits = F.linear(normed, w_out)
                loss = F.cross_entropy(logits.float(), flat_labels[s:s + step], reduction="sum") * inv_tokens
                g_h, g_wn, g_out = torch.autograd.grad(loss, [hc, wn, w_out])
            grad_h[s:s + step] = g_h
            grads["norm"].add_(g_wn.reshape(-1).float())
            grads["out"].add_(g_out.reshape(-1).float())
            total += loss.detach()
        return total, grad_h.view_as(h)

    # ---- the step ---------------------------------------------------------------------------------------------
    def _is_resident(self, u: int) -> bool:
        """Units that stay on the GPU from forward into backward (the rule the simulator's schedule uses)."""
        return self._resident[u]

    def _ensure(self, st: _Step, u: int) -> _DeviceUnit:
        if u not in st.live:
            held = self._gpu_units.get(u)
            st.live[u] = held if held is not None else self._fetch(u, st.released.pop(u, None))
        return st.live[u]

    def step(self, tokens: torch.Tensor, total_tokens: int | None = None) -> StepStats:
        """One optimizer step on ``tokens`` [sequences, seq + 1] (inputs and shifted labels)."""
        pol, dev, host = self.policy, self.device, self.host
        n_seq = pol.micro_batch * pol.accumulation
        if tokens.shape != (n_seq, self.seq + 1):
            raise SlideDPError(f"step expects tokens of shape ({n_seq}, {self.seq + 1}), got {tuple(tokens.shape)}")
        self.recorder.begin_step()
        lr = lr_at(self.optim, host.step)
        if self._pending is not None:
            self._submit_all(*self._pending)
            self._pending = None
        self._sync_gpu_state()
        st = self._new_step(tokens.to(dev.torch_device), 1.0 / (total_tokens or n_seq * self.seq))
        n_units, depth = len(self.units), pol.prefetch_depth
        for u in range(n_units):
            for v in range(u, min(n_units, u + depth)):
                self._ensure(st, v)
            self._forward_unit(st, u)
        for u in range(n_units - 2, -1, -1):  # the head's backward ran with its loss
            for v in range(u, max(-1, u - depth), -1):
                self._ensure(st, v)
            self._backward_unit(st, u)
        for du in list(st.live.values()):
            self._release(du)
        st.live.clear()
        loss, norm, skipped = self._finish(st, lr)
        return StepStats(loss, norm, lr, skipped, n_seq * self.seq, self.recorder.end_step())

    def _new_step(self, tokens: torch.Tensor, inv_tokens: float) -> _Step:
        pol, device = self.policy, self.device.torch_device
        mb, n_seq = pol.micro_batch, tokens.shape[0]
        pos = torch.arange(self.seq, device=device).unsqueeze(0)
        with torch.no_grad():
            pe = self.rotary(torch.empty(1, dtype=self.cdt, device=device), pos)
        zeros = lambda n: torch.zeros(n, dtype=torch.float32, device=device)  # noqa: E731
        self._cpu_norm_sq = 0.0
        self._gpu_norm_sq = zeros(())
        self._gpu_grads = {}
        return _Step(ids=[tokens[i:i + mb, :-1] for i in range(0, n_seq, mb)],
                     labels=[tokens[i:i + mb, 1:] for i in range(0, n_seq, mb)], pos=pos, pe=pe,
                     inv_tokens=inv_tokens, norm_sq=zeros(()), loss_total=zeros(()),
                     head_grad=zeros(self.units[-1].numel),
                     embed_grad=zeros(self.units[0].numel) if self.tied else None)

    # ---- forward ----------------------------------------------------------------------------------------------
    def _forward_unit(self, st: _Step, u: int) -> None:
        du, kind = st.live[u], self.units[u].kind
        self.device.wait(self.device.compute, du.ready)
        with self.recorder.span("gpu", "fwd", u, flops=self._sim_units[u].fwd_flops):
            if kind == "embed":
                w = du.params(False)["weight"]
                st.ckpt[u + 1] = [F.embedding(i, w) for i in st.ids]
            elif kind == "layer":
                st.ckpt[u + 1] = self._layer_forward(st, u, du)
            else:
                self._head_forward(st, u, du)
        if self.policy.activation == "offload" and kind == "layer" and not self._is_resident(u):
            st.ckpt[u] = self._offload(u, st.ckpt[u])
        if kind == "head":
            self._send_grads(u, st.head_grad, st.norm_sq, st.grad_done)
            st.head_grad = None
        if not self._is_resident(u):
            self._release(st.live.pop(u))
            if du.leaves is not None:  # its kept graphs will want the same tensors back
                st.released[u] = du

    def _layer_forward(self, st: _Step, u: int, du: _DeviceUnit) -> list[torch.Tensor]:
        if self.policy.activation != "keep":
            with torch.no_grad():
                return [self._layer(du, x, st.pos, st.pe, du.params(False)) for x in st.ckpt[u]]
        du.leaves = du.params(True)
        st.kept[u], outs = [], []
        for x in st.ckpt[u]:
            leaf = x.detach().requires_grad_()
            with torch.enable_grad():
                out = self._layer(du, leaf, st.pos, st.pe, du.leaves)
            st.kept[u].append((leaf, out))
            outs.append(out.detach())
        return outs

    def _head_forward(self, st: _Step, u: int, du: _DeviceUnit) -> None:
        """Loss and the head's own gradients now: the head is first in backward, so it is fetched once."""
        p = du.params(True)
        w_out = st.live[0].params(False)["weight"].detach().requires_grad_() if self.tied else p["lm_head.weight"]
        norm_slot = self.units[u].params[0]
        grads = {"norm": st.head_grad[norm_slot.offset:norm_slot.offset + norm_slot.numel],
                 "out": st.embed_grad if self.tied else st.head_grad[norm_slot.numel:]}
        st.grad_out = []
        for h, lab in zip(st.ckpt[u], st.labels, strict=True):
            loss, g = self._head_loss(h, lab, p["norm.weight"], w_out, st.inv_tokens, grads)
            st.loss_total += loss
            st.grad_out.append(g)

    # ---- backward ---------------------------------------------------------------------------------------------
    def _backward_unit(self, st: _Step, u: int) -> None:
        dev, unit = self.device, self.units[u]
        du = st.live[u]
        reload_ev = None
        if self.policy.activation == "offload" and unit.kind == "layer" and not self._is_resident(u):
            st.ckpt[u], reload_ev = self._reload(u, st.ckpt[u])
        dev.wait(dev.compute, du.ready)
        dev.wait(dev.compute, reload_ev)
        dev.wait(dev.compute, st.grad_done.get(u + self.policy.prefetch_depth))  # bounded gradients in flight
        with self.recorder.span("gpu", "bwd", u, flops=self._sim_units[u].bwd_flops):
            gflat = self._layer_backward(st, u, du) if unit.kind == "layer" else self._embed_backward(st, u)
        self._send_grads(u, gflat, st.norm_sq, st.grad_done)
        del gflat
        if u in st.live:
            self._release(st.live.pop(u))
        st.released.pop(u, None)

    def _layer_backward(self, st: _Step, u: int, du: _DeviceUnit) -> torch.Tensor:
        """Recompute (or replay the kept graph) per micro-batch; fp32 parameter gradients summed over them."""
        keep = self.policy.activation == "keep"
        gflat = torch.zeros(self.units[u].numel, dtype=torch.float32, device=self.device.torch_device)
        params = du.leaves if keep else du.params(True)
        new_grad_out = []
        for mb in range(len(st.ids)):
            with torch.enable_grad():
                if keep:
                    leaf, out = st.kept[u][mb]
                else:
                    leaf = st.ckpt[u][mb].detach().requires_grad_()
                    out = self._layer(du, leaf, st.pos, st.pe, params)
                res = torch.autograd.grad(out, [leaf, *params.values()], st.grad_out[mb])
            new_grad_out.append(res[0])
            for slot, g in zip(du.layout.params, res[1:], strict=True):
                gflat[slot.offset:slot.offset + slot.numel].add_(g.reshape(-1))
        st.grad_out = new_grad_out
        st.kept.pop(u, None)
        st.ckpt.pop(u, None)
        return gflat

    def _embed_backward(self, st: _Step, u: int) -> torch.Tensor:
        """Scatter-add the input gradients into the rows that were looked up (plus the tied head's part)."""
        unit = self.units[u]
        gflat = st.embed_grad if self.tied else torch.zeros(unit.numel, dtype=torch.float32,
                                                            device=self.device.torch_device)
        table = gflat.view(unit.params[0].shape)
        for i, g in zip(st.ids, st.grad_out, strict=True):
            table.index_add_(0, i.reshape(-1), g.reshape(-1, g.shape[-1]).float())
        return gflat

    # ---- update -------------------------------------------------------------------------------------------------
    def _finish(self, st: _Step, lr: float) -> tuple[float, float, bool]:
        """Global norm and loss; then skip (non-finite) or schedule this step's updates by the policy."""
        pol, host, comm = self.policy, self.host, self.comm
        norm_sq = st.norm_sq
        if comm.active and pol.grad_route == "per_rank":  # owners hold the norms of the summed chunks
            norm_sq = comm.all_reduce_(torch.tensor(self._cpu_norm_sq, dtype=torch.float64))
        elif comm.active:  # each rank holds the norm of its reduced shards
            norm_sq = comm.all_reduce_(norm_sq)
        # GPU-state gradients were all-reduced whole: every rank already holds the same norm of them.
        gpu_norm_sq = float(self._gpu_norm_sq.item()) if self._gpu_grads else 0.0
        norm = math.sqrt(float(norm_sq.item()) + gpu_norm_sq)
        loss = float(comm.all_reduce_(st.loss_total.to(torch.float64).cpu()).item())
        skipped = not math.isfinite(norm)
        if skipped:
            self._gpu_grads = {}  # GPU-held units keep their weights: their update simply does not happen
            self.worker.wait_all()
            for u in range(len(self.units)):  # the slots hold this step's gradients: restore the weights
                for c in range(len(self._chunks(u))):
                    owned = self._owned_range(u, c)
                    if owned is not None:
                        host.slot[owned[0]:owned[1]].copy_(host.master[owned[0]:owned[1]])
            comm.barrier()
            return loss, norm, True
        host.step += 1
        coef = clip_coefficient(self.optim, norm)
        if self._gpu_grads:
            with self.recorder.span("gpu", "gpu_adam", 0):
                self._gpu.update_all([self._gpu_grads[u] for u in range(len(self._gpu))], host.step, lr, self.optim,
                                     coef)
            self._gpu.loaded_step = host.step
            self._gpu_grads = {}
        if pol.update_schedule == "next_forward":
            self._pending = (lr, coef, host.step)
        elif pol.update_schedule == "after_backward":
            self.device.synchronize()
            self._submit_all(lr, coef, host.step)
            self.worker.wait_all()
        else:
            self.worker.wait_all()
        return loss, norm, False

    def _send_grads(self, u: int, gflat: torch.Tensor, norm_sq: torch.Tensor, grad_done: dict) -> None:
        """Reduce over ranks by the gradient route, add to the squared norm, and copy the gradient chunk by
        chunk into the host slot (or, per-rank route, into this rank's landing buffer for the owner to sum)."""
        dev, host, unit, comm = self.device, self.host, self.units[u], self.comm
        if self.poison_next_gradient:
            gflat.fill_(float("nan"))
            self.poison_next_gradient = False
        if u < len(self._gpu):  # stays on the GPU: reduce over ranks, add to the norm, update in _finish
            if comm.active:
                with self.recorder.span("link", "allreduce", u, nbytes=2 * gflat.numel() * gflat.element_size()
                                        * (comm.world - 1) / comm.world):
                    comm.all_reduce_(gflat)
            self._gpu_norm_sq += torch.linalg.vector_norm(gflat).square()
            self._gpu_grads[u] = gflat
            return
        per_rank = comm.active and self.policy.grad_route == "per_rank"
        if comm.active and not per_rank:
            with self.recorder.span("link", "reduce_scatter", u, nbytes=gflat.numel() * gflat.element_size()
                                    * (comm.world - 1) / comm.world):
                src, pieces = self._reduce_scatter(u, gflat)
        else:
            src, pieces = gflat, [(a, a, b) for a, b in self._chunks(u)]
        if not per_rank:  # this rank's part of the norm (all of it with one rank); summed over ranks in _finish
            norm_sq += torch.linalg.vector_norm(src).square()
        dest = host.landing[comm.rank] if per_rank else host.grad_buffer
        base = 0 if per_rank else unit.offset
        send = src.to(dest.dtype) if dest.dtype != src.dtype else src
        ready = dev.event()
        dev.wait(dev.d2h, ready)
        esize = send.element_size()
        last = None
        for c, (off, a, b) in enumerate(pieces):
            with self.recorder.span("d2h", "d2h_grad", u, c, nbytes=(b - a) * esize, host_bytes=(b - a) * esize,
                                    stream=dev.d2h), dev.on(dev.d2h):
                dest[base + a:base + b].copy_(send[off:off + b - a], non_blocking=True)
            last = dev.event(dev.d2h)
            if self.policy.update_schedule == "as_ready" and not per_rank:
                self.worker.submit((u, c), (lr_at(self.optim, host.step), 1.0, host.step + 1), last)
        dev.keep_alive(send, dev.d2h)
        grad_done[u] = last
        if per_rank:
            self._sum_landed(u, last)

    def _reduce_scatter(self, u: int, gflat: torch.Tensor) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
        """Reduce-scatter each chunk of a unit's gradient: this rank receives the sum of its shard of every
        chunk. Returns those sums back to back (zero padding where shards are uneven) and, per chunk, where
        the shard starts in them and which unit-local range it covers."""
        comm = self.comm
        bounds = [shard_bounds(a, b, comm.world) for a, b in self._chunks(u)]
        widths = [max(bd[r + 1] - bd[r] for r in range(comm.world)) for bd in bounds]
        out = torch.empty(sum(widths), dtype=gflat.dtype, device=gflat.device)
        pieces, off = [], 0
        for bd, width in zip(bounds, widths, strict=True):
            if (bd[-1] - bd[0]) == width * comm.world:  # even shards: the chunk itself is the input
                inp = gflat[bd[0]:bd[-1]]
            else:
                inp = torch.zeros(width * comm.world, dtype=gflat.dtype, device=gflat.device)
                for r in range(comm.world):
                    inp[r * width:r * width + bd[r + 1] - bd[r]] = gflat[bd[r]:bd[r + 1]]
            comm.reduce_scatter_(out[off:off + width], inp)
            pieces.append((off, bd[comm.rank], bd[comm.rank + 1]))
            off += width
        return out, pieces

    def _sum_landed(self, u: int, landed) -> None:
        """Per-rank gradient route: each chunk's owner sums every rank's copy into the shared slot."""
        host, comm, unit = self.host, self.comm, self.units[u]
        Device.host_wait(landed)
        comm.barrier()  # every rank's copy of this unit has landed
        for c, (a, b) in enumerate(self._chunks(u)):
            if self._owned_range(u, c) is None:
                continue
            with self.recorder.host_span("cpu", "cpu_reduce", u, c, host_bytes=(b - a) * (comm.world + 1) * 2):
                total = host.landing[0][a:b].to(torch.float32)
                for r in range(1, comm.world):
                    total += host.landing[r][a:b]
                self._cpu_norm_sq += float(torch.linalg.vector_norm(total).square())
                host.grad_buffer[unit.offset + a:unit.offset + b].copy_(total)
            if self.policy.update_schedule == "as_ready":
                self.worker.submit((u, c), (lr_at(self.optim, host.step), 1.0, host.step + 1))
        comm.barrier()  # the landing buffers may be reused

    def close(self) -> None:
        self._gpu.release()
        self._gpu_units, self._gpu_grads = {}, {}
        self.worker.close()
        self.worker = None  # break the engine <-> worker cycle so the host state can be freed at once

