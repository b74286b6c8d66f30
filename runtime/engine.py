"""One training step of host-resident layer streaming on one device.

Order of work, per step (layer-major: each unit is streamed once for all micro-batches):
  forward  - for each unit: stream its chunks in (after their pending CPU update, by schedule), run every
             micro-batch through it, keep or offload its input checkpoint, release it when the prefetch
             window moves on; the head computes the chunked cross-entropy *and* its own gradients, so full
             logits never exist and the head is never fetched twice.
  backward - for each unit in reverse: re-fetch it unless it is still resident, recompute (or replay the
             kept graph), accumulate fp32 gradients over micro-batches, add the squared norm, cast, and
             copy the gradient chunk by chunk into the host slot on the D2H stream.
  update   - AdamW per chunk on the CPU worker, by the policy's schedule (see slidedp.policy.Policy).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch.func import functional_call

from slidedp.errors import SlideDPError
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.runtime.comm import Comm, shard_bounds
from slidedp.runtime.cpu_adam import fused_kernel, fused_kernel_error
from slidedp.runtime.device import Device
from slidedp.runtime.hf_adapter import ModelAdapter, UnitLayout
from slidedp.runtime.host_state import HostState
from slidedp.runtime.optim import OptimConfig, adamw_chunk_, clip_coefficient, lr_at
from slidedp.runtime.tracing import TraceRecorder
from slidedp.runtime.updates import UpdateWorker
from slidedp.workload import ADAM_HOST_BYTES_BASE, CAST_HOST_BYTES, build_units

FUSED_ADAM_HOST_BYTES = 28  # read p, m, v (12) + bf16 grad (2); write p, m, v (12) + bf16 weights (2)


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


class _DeviceUnit:
    """A unit's weights on the device: one flat tensor and per-parameter views of it."""

    def __init__(self, layout: UnitLayout, flat: torch.Tensor):
        self.layout, self.flat = layout, flat
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
        slot_is_bf16 = host.grads is None and host.staging.dtype == torch.bfloat16
        self._kernel = None
        if slot_is_bf16 and fused_adam is not False:
            self._kernel = fused_kernel()
            if self._kernel is None and fused_adam:
                raise SlideDPError(f"the fused CPU AdamW kernel did not compile: {fused_kernel_error()}")
        self._pending: tuple[float, float, int] | None = None  # (lr, clip coefficient, step) of deferred updates
        self.poison_next_gradient = False  # fault injection: make the next unit's gradient NaN
        self.nonfinite_chunks = 0  # as_ready only: chunks whose update was skipped for a non-finite gradient
        self._ckpt_pool: dict[tuple[int, int], torch.Tensor] = {}
        largest_chunk = max(b - a for u in range(len(self.units)) for a, b in self._chunks(u))
        self._chunk_base = [0]
        for u in range(len(self.units) - 1):
            self._chunk_base.append(self._chunk_base[-1] + len(self._chunks(u)))
        self._scratch = torch.empty(largest_chunk, dtype=torch.float32)  # the optimizer worker's fp32 gradient
        self._sim_units = build_units(spec, _dummy_gpu(), policy.activation, policy.micro_batch, policy.accumulation,
                                      seq)

    # ---- CPU updates ----------------------------------------------------------------------------------------
    def _chunks(self, u: int) -> list[tuple[int, int]]:
        return chunk_ranges(self.units[u].numel, self.policy.chunks_per_layer)

    def _owners(self, u: int, c: int) -> list[int]:
        """Ranks that update chunk ``c`` of unit ``u``: every rank its shard (reduce-scatter), or one owner."""
        if self.policy.grad_route == "reduce_scatter" or not self.comm.active:
            return list(range(self.comm.world))
        return [(u * self.policy.chunks_per_layer + c) % self.comm.world]

    def _owned_range(self, u: int, c: int) -> tuple[int, int] | None:
        """This rank's part of chunk ``c`` of unit ``u`` in the flat state, or None."""
        unit, (a, b) = self.units[u], self._chunks(u)[c]
        comm = self.comm
        if comm.rank not in self._owners(u, c):
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
            host.staging[lo:hi].copy_(host.master[lo:hi])
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
            host.staging[lo:hi].copy_(host.master[lo:hi])

    def _submit_all(self, lr: float, coef: float, step: int) -> None:
        for u in range(len(self.units)):
            for c in range(len(self._chunks(u))):
                if self._owned_range(u, c) is not None:
                    self.worker.submit((u, c), (lr, coef, step))

    def flush(self) -> None:
        """Apply deferred updates now (before a checkpoint, an export, or the end of training)."""
        if self._pending is not None:
            self._submit_all(*self._pending)
            self._pending = None
        self.worker.wait_all()

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
                    src = self.host.staging[unit.offset + a:unit.offset + b]
                    with self.recorder.span("h2d", "h2d_param", u, c, nbytes=(b - a) * esize,
                                            host_bytes=(b - a) * esize, stream=dev.h2d):
                        into.flat[a:b].copy_(src, non_blocking=True)
                    continue
                bounds = shard_bounds(a, b, self.comm.world)
                sa, sb = bounds[self.comm.rank], bounds[self.comm.rank + 1]
                mine = torch.empty(sb - sa, dtype=into.flat.dtype, device=dev.torch_device)
                with self.recorder.span("h2d", "h2d_param", u, c, nbytes=(sb - sa) * esize,
                                        host_bytes=(sb - sa) * esize, stream=dev.h2d):
                    mine.copy_(self.host.staging[unit.offset + sa:unit.offset + sb], non_blocking=True)
                with self.recorder.span("link", "allgather", u, c, nbytes=(b - a - (sb - sa)) * esize,
                                        stream=dev.h2d):
                    self.comm.all_gather_into(into.flat[a:b], mine, bounds)
        into.ready = dev.event(dev.h2d)
        return into

    def _release(self, du: _DeviceUnit) -> None:
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
    def step(self, tokens: torch.Tensor, total_tokens: int | None = None) -> StepStats:
        """One optimizer step on ``tokens`` [sequences, seq + 1] (inputs and shifted labels)."""
        pol, dev, host = self.policy, self.device, self.host
        n_seq = pol.micro_batch * pol.accumulation
        if tokens.shape != (n_seq, self.seq + 1):
            raise SlideDPError(f"step expects tokens of shape ({n_seq}, {self.seq + 1}), got {tuple(tokens.shape)}")
        total_tokens = total_tokens or n_seq * self.seq
        inv_tokens = 1.0 / total_tokens
        self.recorder.begin_step()
        lr = lr_at(self.optim, host.step)
        if self._pending is not None:
            self._submit_all(*self._pending)
            self._pending = None
        tokens = tokens.to(dev.torch_device)
        ids = [tokens[i:i + pol.micro_batch, :-1] for i in range(0, n_seq, pol.micro_batch)]
        labels = [tokens[i:i + pol.micro_batch, 1:] for i in range(0, n_seq, pol.micro_batch)]
        pos = torch.arange(self.seq, device=dev.torch_device).unsqueeze(0)
        units, depth, n_units = self.units, pol.prefetch_depth, len(self.units)
        keep = pol.activation == "keep"
        resident_from = n_units - depth
        live: dict[int, _DeviceUnit] = {}
        released: dict[int, _DeviceUnit] = {}
        ckpt: dict[int, list] = {}  # unit -> its inputs per micro-batch
        kept: dict[int, list] = {}  # unit -> (input leaf, output) per micro-batch, activation policy keep
        grad_done: dict[int, object] = {}
        norm_sq = torch.zeros((), dtype=torch.float32, device=dev.torch_device)
        head_u, embed_u = n_units - 1, 0
        head_grad = torch.zeros(units[head_u].numel, dtype=torch.float32, device=dev.torch_device)
        embed_grad = torch.zeros(units[embed_u].numel, dtype=torch.float32, device=dev.torch_device) if self.tied \
            else None
        with torch.no_grad():
            pe = self.rotary(torch.empty(1, dtype=self.cdt, device=dev.torch_device), pos)
        loss_total = torch.zeros((), dtype=torch.float32, device=dev.torch_device)
        self._cpu_norm_sq = 0.0

        def is_resident(u: int) -> bool:
            return u >= resident_from or (self.tied and u == embed_u)

        def ensure(u: int) -> _DeviceUnit:
            if u not in live:
                live[u] = self._fetch(u, released.pop(u, None))
            return live[u]

        # ---------------- forward ----------------
        for u in range(n_units):
            for v in range(u, min(n_units, u + depth)):
                ensure(v)
            du = live[u]
            dev.wait(dev.compute, du.ready)
            kind = units[u].kind
            with self.recorder.span("gpu", "fwd", u, flops=self._sim_units[u].fwd_flops):
                if kind == "embed":
                    w = du.params(False)["weight"]
                    ckpt[u + 1] = [F.embedding(i, w) for i in ids]
                elif kind == "layer":
                    xs = ckpt[u]
                    if keep:
                        du.leaves = du.params(True)
                        kept[u] = []
                        outs = []
                        for x in xs:
                            leaf = x.detach().requires_grad_()
                            with torch.enable_grad():
                                out = self._layer(du, leaf, pos, pe, du.leaves)
                            kept[u].append((leaf, out))
                            outs.append(out.detach())
                        ckpt[u + 1] = outs
                    else:
                        with torch.no_grad():
                            ckpt[u + 1] = [self._layer(du, x, pos, pe, du.params(False)) for x in xs]
                else:  # head: loss and its gradients now
                    p = du.params(True)
                    w_out = live[embed_u].params(False)["weight"].detach().requires_grad_() if self.tied \
                        else p["lm_head.weight"]
                    norm_slot = units[u].params[0]
                    grads = {"norm": head_grad[norm_slot.offset:norm_slot.offset + norm_slot.numel],
                             "out": embed_grad if self.tied else head_grad[norm_slot.numel:]}
                    grad_out = []
                    for h, lab in zip(ckpt[u], labels, strict=True):
                        loss, g = self._head_loss(h, lab, p["norm.weight"], w_out, inv_tokens, grads)
                        loss_total += loss
                        grad_out.append(g)
            if pol.activation == "offload" and kind == "layer" and not is_resident(u):
                ckpt[u] = self._offload(u, ckpt[u])
            if kind == "head":
                self._send_grads(head_u, head_grad, norm_sq, grad_done)
                del head_grad
            if not is_resident(u):
                self._release(live.pop(u))
                if du.leaves is not None:  # its kept graphs will want the same tensors back
                    released[u] = du

        # ---------------- backward ----------------
        for u in range(n_units - 2, -1, -1):
            for v in range(u, max(-1, u - depth), -1):
                ensure(v)
            du = live[u]
            reload_ev = None
            if pol.activation == "offload" and units[u].kind == "layer" and not is_resident(u):
                ckpt[u], reload_ev = self._reload(u, ckpt[u])
            dev.wait(dev.compute, du.ready)
            dev.wait(dev.compute, reload_ev)
            dev.wait(dev.compute, grad_done.get(u + depth))  # bounded number of gradients in flight
            kind = units[u].kind
            with self.recorder.span("gpu", "bwd", u, flops=self._sim_units[u].bwd_flops):
                if kind == "layer":
                    gflat = torch.zeros(units[u].numel, dtype=torch.float32, device=dev.torch_device)
                    new_grad_out = []
                    params = du.leaves if keep else du.params(True)
                    for mb in range(len(ids)):
                        with torch.enable_grad():
                            if keep:
                                leaf, out = kept[u][mb]
                            else:
                                leaf = ckpt[u][mb].detach().requires_grad_()
                                out = self._layer(du, leaf, pos, pe, params)
                            res = torch.autograd.grad(out, [leaf, *params.values()], grad_out[mb])
                        new_grad_out.append(res[0])
                        for slot, g in zip(du.layout.params, res[1:], strict=True):
                            gflat[slot.offset:slot.offset + slot.numel].add_(g.reshape(-1))
                    grad_out = new_grad_out
                    kept.pop(u, None)
                    ckpt.pop(u, None)
                else:  # embedding: scatter-add the input gradients into the rows that were looked up
                    gflat = embed_grad if self.tied else torch.zeros(units[u].numel, dtype=torch.float32,
                                                                    device=dev.torch_device)
                    table = gflat.view(units[u].params[0].shape)
                    for i, g in zip(ids, grad_out, strict=True):
                        table.index_add_(0, i.reshape(-1), g.reshape(-1, g.shape[-1]).float())
            self._send_grads(u, gflat, norm_sq, grad_done)
            del gflat
            if u in live:
                self._release(live.pop(u))
            released.pop(u, None)
        for du in list(live.values()):
            self._release(du)
        live.clear()

        # ---------------- update ----------------
        if self.comm.active and pol.grad_route == "per_rank":  # owners hold the norms of the summed chunks
            norm_sq = self.comm.all_reduce_(torch.tensor(self._cpu_norm_sq, dtype=torch.float64))
        norm = math.sqrt(float(norm_sq.item()))
        loss_value = float(self.comm.all_reduce_(loss_total.to(torch.float64).cpu()).item())
        skipped = not math.isfinite(norm)
        if skipped:
            self.worker.wait_all()
            for u in range(n_units):  # the slots hold this step's gradients: restore the weights
                for c in range(len(self._chunks(u))):
                    owned = self._owned_range(u, c)
                    if owned is not None:
                        host.staging[owned[0]:owned[1]].copy_(host.master[owned[0]:owned[1]])
            self.comm.barrier()
        else:
            host.step += 1
            coef = clip_coefficient(self.optim, norm)
            if pol.update_schedule == "next_forward":
                self._pending = (lr, coef, host.step)
            elif pol.update_schedule == "after_backward":
                dev.synchronize()
                self._submit_all(lr, coef, host.step)
                self.worker.wait_all()
            else:
                self.worker.wait_all()
        trace = self.recorder.end_step()
        return StepStats(loss_value, norm, lr, skipped, n_seq * self.seq, trace)

    def _send_grads(self, u: int, gflat: torch.Tensor, norm_sq: torch.Tensor, grad_done: dict) -> None:
        """Reduce over ranks by the gradient route, add to the squared norm, and copy the gradient chunk by
        chunk into the host slot (or, per-rank route, into this rank's landing buffer for the owner to sum)."""
        dev, host, unit, comm = self.device, self.host, self.units[u], self.comm
        if self.poison_next_gradient:
            gflat.fill_(float("nan"))
            self.poison_next_gradient = False
        per_rank = comm.active and self.policy.grad_route == "per_rank"
        if comm.active and not per_rank:
            esize = 4
            with self.recorder.span("link", "reduce_scatter", u, nbytes=gflat.numel() * esize * (comm.world - 1)
                                    / comm.world):
                comm.reduce_gradient_(gflat)
        if not per_rank:
            norm_sq += torch.linalg.vector_norm(gflat).square()
        dest = host.landing[comm.rank] if per_rank else host.grad_buffer
        base = 0 if per_rank else unit.offset
        send = gflat.to(dest.dtype) if dest.dtype != gflat.dtype else gflat
        ready = dev.event()
        dev.wait(dev.d2h, ready)
        esize = send.element_size()
        last = None
        for c, (a, b) in enumerate(self._chunks(u)):
            if comm.active and not per_rank:  # each rank copies only its shard of the reduced chunk
                bounds = shard_bounds(a, b, comm.world)
                a, b = bounds[comm.rank], bounds[comm.rank + 1]
            with self.recorder.span("d2h", "d2h_grad", u, c, nbytes=(b - a) * esize, host_bytes=(b - a) * esize,
                                    stream=dev.d2h), dev.on(dev.d2h):
                dest[base + a:base + b].copy_(send[a:b], non_blocking=True)
            last = dev.event(dev.d2h)
            if self.policy.update_schedule == "as_ready" and not per_rank:
                self.worker.submit((u, c), (lr_at(self.optim, host.step), 1.0, host.step + 1), last)
        dev.keep_alive(send, dev.d2h)
        grad_done[u] = last
        if per_rank:
            self._sum_landed(u, last)

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
        self.worker.close()
        self.worker = None  # break the engine <-> worker cycle so the host state can be freed at once


def _dummy_gpu():
    """FLOP annotations only need the model's shape; times from this GPU spec are never used."""
    from slidedp.hardware import GPUSpec

    return GPUSpec(name="trace", memory_gib=1.0, h2d_gbps=1.0, d2h_gbps=1.0, duplex_gbps=1.0, pcie_latency_us=0.0,
                   matmul_tflops=1.0, attention_tflops=1.0, half_efficiency_tokens=0.0, layer_overhead_us=0.0,
                   reserve_gib=0.0)
