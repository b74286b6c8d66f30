"""One training step of host-resident layer streaming on one device: the orchestration.

Order of work, per step (layer-major: each unit is streamed once for all micro-batches):
  forward  - for each unit: stream its chunks in (after their pending CPU update, by schedule), run every
             micro-batch through it, keep or offload its input checkpoint, release it when the prefetch
             window moves on; the head computes the chunked cross-entropy *and* its own gradients, so full
             logits never exist and the head is never fetched twice.
  backward - for each unit in reverse: re-fetch it unless it is still resident or its backward reads no
             weights (the embedding: slidedp.units.refetched_in_backward), recompute (or replay the
             kept graph), accumulate fp32 gradients over micro-batches, add the squared norm, cast, and
             copy the gradient chunk by chunk into the host slot on the D2H stream.
  finish   - global gradient norm, clip coefficient, skip on a non-finite norm, and AdamW per chunk on the
             CPU worker by the policy's schedule (see slidedp.policy.Policy); the leading
             ``gpu_state_units`` never leave the GPU and are updated there once the norm is known.

:class:`StreamingEngine` owns the step state and the order of work; each rule lives in one collaborator:
  runtime/chunks.py       ChunkTable: chunks, this rank's share of their updates (slidedp.routes.Routes), the
                          shared update flags; shared_buffer_sizes
  runtime/streaming.py    ParamStreamer (fetch a unit chunk by chunk after its update, sharded H2D +
                          all-gather, release), ActivationOffload, DeviceUnit
  runtime/grad_routes.py  GradientRoutes: reduce-scatter, D2H into the slot or a landing buffer, the CPU sum
                          of landed copies, this rank's part of the norm
  runtime/updates.py      HostUpdater (the CPU AdamW job of a chunk, submit / defer / as_ready) on an
                          UpdateWorker
  runtime/gpu_state.py    GpuHeldUnits: the units whose optimizer state stays on the GPU
  runtime/loss_head.py    LossHead: final norm + chunked fused linear cross-entropy
The route names themselves are only read through :class:`slidedp.routes.Routes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F

from slidedp.errors import SlideDPError
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.routes import Routes
from slidedp.runtime.chunks import ChunkTable, shared_buffer_sizes
from slidedp.runtime.comm import Comm, HostGroups
from slidedp.runtime.device import Device
from slidedp.runtime.gpu_state import GpuHeldUnits
from slidedp.runtime.grad_routes import GradientRoutes
from slidedp.runtime.hf_adapter import ModelAdapter
from slidedp.runtime.host_state import HostState
from slidedp.runtime.loss_head import LossHead
from slidedp.runtime.optim import OptimConfig, clip_coefficient, lr_at
from slidedp.runtime.packed_attention import VarlenKernel, VarlenRows, use_packed_attention, varlen_rows
from slidedp.runtime.packing import Rows, block_causal_mask
from slidedp.runtime.seq_tiles import run_layer
from slidedp.runtime.streaming import ActivationOffload, DeviceUnit, ParamStreamer
from slidedp.runtime.tracing import TraceRecorder
from slidedp.runtime.updates import HostUpdater
from slidedp.units import check_gpu_state_units, refetched_in_backward, resident_in_backward
from slidedp.workload import policy_unit_work

__all__ = ["EngineConfig", "StepStats", "StreamingEngine", "shared_buffer_sizes"]


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs, apart from its collaborators (model adapter, host state, device, recorder, comm).

    ``adam_threads``: the CPU worker's torch threads (None: torch's default). ``fused_adam``: use the
    one-pass AdamW + bf16 kernel (None: when it compiles and the gradient lands in a bf16 slot; True:
    required). ``resident_weights``: the benchmarks' reference with every weight already on the GPU: each
    unit is fetched once and kept, no gradient leaves the device and nothing is updated; the loss and the
    gradient norm are still computed (one rank only).
    """

    policy: Policy
    optim: OptimConfig
    seq: int
    compute_dtype: torch.dtype
    adam_threads: int | None = None
    fused_adam: bool | None = None
    resident_weights: bool = False
    rounding_seed: int = 0  # compact state: the stochastic rounding's seed (a resumed run keeps its run's)
    varlen_kernel: VarlenKernel | None = None  # packed rows: this varlen attention kernel (None: the mask)

    def __post_init__(self) -> None:
        if self.policy.update_schedule == "as_ready" and self.optim.max_grad_norm is not None:
            raise SlideDPError("update_schedule as_ready updates before the global gradient norm is known: "
                               "it cannot clip; use next_forward (exact clipping) or disable max_grad_norm")


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    lr: float
    skipped: bool
    tokens: int
    trace: pd.DataFrame


@dataclass(frozen=True)
class _Attention:
    """What a layer call needs besides its input: position ids, their rotary embeddings, and how attention stays
    inside each packed example: a block-diagonal causal ``mask``, or the examples' offsets for the varlen kernel
    (``varlen``); neither for plain causal rows, which lets SDPA take its fastest kernel."""

    pos: torch.Tensor
    pe: tuple[torch.Tensor, torch.Tensor]
    mask: torch.Tensor | None
    varlen: VarlenRows | None = None

    def layer_kwargs(self) -> dict:
        kwargs = {"attention_mask": self.mask, "position_embeddings": self.pe, "position_ids": self.pos}
        return kwargs | self.varlen.layer_kwargs() if self.varlen is not None else kwargs


@dataclass
class _Step:
    """What one step carries between its forward and backward units."""

    ids: list[torch.Tensor]
    labels: list[torch.Tensor]
    attn: list[_Attention]  # per micro-batch
    inv_tokens: float
    norm_sq: torch.Tensor
    loss_total: torch.Tensor
    head_grad: torch.Tensor | None
    embed_grad: torch.Tensor | None
    live: dict = field(default_factory=dict)  # unit -> DeviceUnit on the GPU now
    released: dict = field(default_factory=dict)  # kept-graph units whose memory was freed until backward
    ckpt: dict = field(default_factory=dict)  # unit -> its inputs per micro-batch
    kept: dict = field(default_factory=dict)  # unit -> (input leaf, output) per micro-batch (policy keep)
    grad_done: dict = field(default_factory=dict)  # unit -> event: its gradient left the GPU
    grad_out: list = field(default_factory=list)  # gradient w.r.t. the current unit's output, per micro-batch


class StreamingEngine:
    """Runs optimizer steps (``step``) on one rank; ``flush`` completes the host state, ``close`` frees the
    device state and stops the CPU worker. Attributes the trainer and tests use: ``poison_next_gradient``
    (fault injection), ``nonfinite_chunks`` (as_ready skips), ``routes``, ``units``."""

    def __init__(self, config: EngineConfig, adapter: ModelAdapter, spec: ModelSpec, host: HostState, device: Device,
                 recorder: TraceRecorder, comm: Comm | None = None, groups: HostGroups | None = None):
        """``comm``: this host's ranks (one host); ``groups``: the process groups of a run over several hosts
        (then ``comm`` is its ``local``)."""
        pol, cdt = config.policy, config.compute_dtype
        self.config, self.policy, self.optim, self.seq, self.cdt = config, pol, config.optim, config.seq, cdt
        self.adapter, self.host, self.device, self.recorder = adapter, host, device, recorder
        self.groups = groups or HostGroups.single(comm or Comm())
        self.comm = self.groups.local
        if pol.state_precision != host.precision:
            raise SlideDPError(f"policy state {pol.state} but the host state is {host.precision.name}")
        self.routes = Routes.of(pol, self.comm.world, weight_bytes=cdt.itemsize, grad_bytes=host.grad_buffer.itemsize,
                                hosts=self.groups.hosts)
        if self.comm.active and (host.flags is None or (self.routes.cpu_reduces and host.landing is None)):
            raise SlideDPError("data parallel needs a shared host state (HostState.allocate_shared)")
        if self.routes.shards_hosts and pol.gpu_state_units:
            raise SlideDPError("host_layout sharded keeps each host's share of the master weights only: it cannot "
                               "yet hold units on the GPU (gpu_state_units must be 0)")
        resident = config.resident_weights
        if resident and self.comm.active:
            raise SlideDPError("resident_weights is a one-rank reference: it never moves a gradient between ranks")
        self.units = adapter.units
        self.tied = adapter.tied
        self.rotary = adapter.rotary(device.torch_device)
        if config.varlen_kernel is not None:
            use_packed_attention(adapter.skeleton.config)
        check_gpu_state_units(pol.gpu_state_units, len(self.units))
        self._work = policy_unit_work(spec, pol, config.seq)
        # Units that stay on the GPU from forward into backward (the rule the simulator's schedule uses).
        self._resident = (True,) * len(self.units) if resident else \
            resident_in_backward(self._work, pol.prefetch_depth, pol.gpu_state_units)
        # Units backward copies in again (not the embedding, whose backward reads no weights).
        self._refetched = (False,) * len(self.units) if resident else \
            refetched_in_backward(self._work, pol.prefetch_depth, pol.gpu_state_units)
        held = 0 if resident else pol.gpu_state_units  # resident weights need no GPU optimizer state
        self.gpu_held = GpuHeldUnits(self.units, held, device, cdt, recorder, self.groups.world)
        self.table = ChunkTable(self.units, self.routes, self.comm.rank, host_units_from=held, flags=host.flags,
                                host=self.groups.host)
        if (host.share is not None) != self.routes.shards_hosts or \
                (host.share is not None and host.master.numel() != self.table.share_numel):
            raise SlideDPError("the host state does not hold this host's share of the parameters "
                               "(HostState.allocate(..., share=ChunkTable.share_pieces()))")
        as_ready = pol.update_schedule == "as_ready"
        self.updates = HostUpdater(self.table, host, config.optim, recorder, as_ready, threaded=device.is_cuda,
                                   threads=config.adam_threads, fused_adam=config.fused_adam,
                                   seed=config.rounding_seed, weight_peers=self.groups.weight_peers)
        self.params = ParamStreamer(self.table, self.routes, host, device, recorder, self.comm, cdt,
                                    before_chunk=self.updates.wait_chunk, keep_all=resident)
        self.offload = ActivationOffload(device, recorder)
        self.grads = GradientRoutes(self.table, self.routes, host, device, recorder, self.comm,
                                    on_landed=self.updates.submit_landed if as_ready else None, groups=self.groups)
        self.head = LossHead(adapter.skeleton.model.norm, pol.loss_chunk_tokens)
        self.poison_next_gradient = False  # fault injection: make the next unit's gradient NaN

    @property
    def nonfinite_chunks(self) -> int:
        """as_ready only: chunks whose update was skipped for a non-finite gradient."""
        return self.updates.nonfinite_chunks

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def publish_share(self) -> None:
        """After a resume under the ``sharded`` host layout: every host's share into every host's slot (each
        host loaded only its own). Every rank of every host calls it."""
        self.updates.publish_all()
        self.comm.barrier()

    def flush(self) -> None:
        """Apply deferred updates now and write GPU-held state back (before a checkpoint, an export, or the
        end of training): afterwards the host state is complete."""
        self.updates.flush()
        self.gpu_held.write_back(self.host, self.comm.rank)
        self.comm.barrier()

    def close(self) -> None:
        self.gpu_held.close()
        self.params.close()
        self.updates.close()

    # ---- the step ---------------------------------------------------------------------------------------------
    def step(self, tokens: torch.Tensor | Rows, total_tokens: int | None = None) -> StepStats:
        """One optimizer step on ``tokens``: [sequences, seq + 1] token windows (inputs and shifted labels), or
        :class:`Rows` (labels with ignored positions, packed examples). ``total_tokens``: the loss's denominator,
        the trained tokens of the whole global batch (default: this batch's)."""
        pol, dev, host = self.policy, self.device, self.host
        n_seq = pol.micro_batch * pol.accumulation
        rows = tokens if isinstance(tokens, Rows) else Rows.from_windows(tokens)
        if tuple(rows.input_ids.shape) != (n_seq, self.seq):
            raise SlideDPError(f"step expects {n_seq} sequences of {self.seq} tokens (+1 label), got "
                               f"{tuple(rows.input_ids.shape)}")
        self.recorder.begin_step()
        lr = lr_at(self.optim, host.step)
        self.updates.submit_deferred()
        self.gpu_held.sync(host)
        st = self._new_step(rows.to(dev.torch_device), 1.0 / max(1, total_tokens or rows.label_tokens()))
        n_units, depth = len(self.units), pol.prefetch_depth
        for u in range(n_units):
            for v in range(u, min(n_units, u + depth)):
                self._ensure(st, v)
            self._forward_unit(st, u)
        for u in range(n_units - 2, -1, -1):  # the head's backward ran with its loss
            for v in range(u, max(-1, u - depth), -1):
                if v in st.live or self._refetched[v]:  # the embedding's backward reads no weights
                    self._ensure(st, v)
            self._backward_unit(st, u)
        for du in list(st.live.values()):
            self.params.release(du)
        st.live.clear()
        loss, norm, skipped = self._finish(st, lr)
        return StepStats(loss, norm, lr, skipped, n_seq * self.seq, self.recorder.end_step())

    def _micro_batches(self, rows: Rows) -> tuple[list[torch.Tensor], list[torch.Tensor], list[_Attention]]:
        """Rows cut into micro-batches: input ids, labels and what attention needs for each."""
        mb, device = self.policy.micro_batch, self.device.torch_device
        parts = [rows.select(slice(i, i + mb)) for i in range(0, len(rows), mb)]
        attn = []
        with torch.no_grad():
            for part in parts:
                mask = varlen = None
                if part.position_ids is None:  # one causal sequence per row: shared positions, no mask
                    pos = torch.arange(rows.seq, device=device).unsqueeze(0)
                elif self.config.varlen_kernel is not None:
                    pos, varlen = part.position_ids, varlen_rows(part.segments, self.config.varlen_kernel)
                else:
                    pos, mask = part.position_ids, block_causal_mask(part.segments)
                pe = self.rotary(torch.empty(1, dtype=self.cdt, device=device), pos)
                attn.append(_Attention(pos, pe, mask, varlen))
        return [p.input_ids for p in parts], [p.labels for p in parts], attn

    def _new_step(self, rows: Rows, inv_tokens: float) -> _Step:
        device = self.device.torch_device
        zeros = lambda n: torch.zeros(n, dtype=torch.float32, device=device)  # noqa: E731
        self.grads.begin_step()
        self.gpu_held.begin_step()
        ids, labels, attn = self._micro_batches(rows)
        return _Step(ids=ids, labels=labels, attn=attn, inv_tokens=inv_tokens, norm_sq=zeros(()), loss_total=zeros(()),
                     head_grad=zeros(self.units[-1].numel),
                     embed_grad=zeros(self.units[0].numel) if self.tied else None)

    def _ensure(self, st: _Step, u: int) -> DeviceUnit:
        if u not in st.live:
            held = self.gpu_held.unit(u)
            st.live[u] = held if held is not None else self.params.fetch(u, st.released.pop(u, None))
        return st.live[u]

    # ---- eval -------------------------------------------------------------------------------------------------
    def evaluate(self, rows: Rows) -> tuple[float, int]:
        """Summed token loss and trained-token count of ``rows`` (this rank's share), summed over ranks: forward
        only, unit by unit, no gradient and no update. Pending updates are applied first, so the loss is that
        of the weights the last step produced. Every rank must call it (units may be all-gathered), with any
        number of rows, including none."""
        dev = self.device
        self.flush()
        self.gpu_held.sync(self.host)
        self.recorder.begin_step()
        ids, labels, attn = self._micro_batches(rows.to(dev.torch_device)) if len(rows) else ([], [], [])
        total = torch.zeros((), dtype=torch.float32, device=dev.torch_device)
        xs: list[torch.Tensor] = []
        embed = None
        with torch.no_grad():
            for u, unit in enumerate(self.units):
                held = self.gpu_held.unit(u)
                du = held if held is not None else self.params.fetch(u)
                dev.wait(dev.compute, du.ready)
                p = du.params(False)
                if unit.kind == "embed":
                    xs = [F.embedding(i, p["weight"]) for i in ids]
                elif unit.kind == "layer":
                    xs = [self._layer(du, x, a, p) for x, a in zip(xs, attn, strict=True)]
                else:
                    w_out = embed.params(False)["weight"] if self.tied else p["lm_head.weight"]
                    for h, lab in zip(xs, labels, strict=True):
                        total += self.head.loss_sum(h, lab, p["norm.weight"], w_out)
                if self.tied and unit.kind == "embed":
                    embed = du  # the tied head reads it last
                else:
                    self.params.release(du)
            if embed is not None:
                self.params.release(embed)
        self.recorder.end_step()
        count = sum(int((lab != -100).sum()) for lab in labels)
        out = self.groups.world.all_reduce_(torch.tensor([float(total), float(count)], dtype=torch.float64))
        return float(out[0]), int(out[1])

    # ---- forward ----------------------------------------------------------------------------------------------
    def _forward_unit(self, st: _Step, u: int) -> None:
        du, kind = st.live[u], self.units[u].kind
        self.device.wait(self.device.compute, du.ready)
        with self.recorder.span("gpu", "fwd", u, flops=self._work[u].fwd_flops):
            if kind == "embed":
                w = du.params(False)["weight"]
                st.ckpt[u + 1] = [F.embedding(i, w) for i in st.ids]
            elif kind == "layer":
                st.ckpt[u + 1] = self._layer_forward(st, u, du)
            else:
                self._head_forward(st, u, du)
        if self.policy.activation == "offload" and kind == "layer" and not self._resident[u]:
            st.ckpt[u] = self.offload.offload(u, st.ckpt[u])
        if kind == "head":
            self._send_grads(st, u, st.head_grad)
            st.head_grad = None
        if not self._resident[u]:
            self.params.release(st.live.pop(u))
            if du.leaves is not None:  # its kept graphs will want the same tensors back
                st.released[u] = du

    def _layer(self, du: DeviceUnit, x: torch.Tensor, attn: _Attention, params) -> torch.Tensor:
        """A decoder layer, whole or over sequence tiles (runtime/seq_tiles.py, Policy.seq_tile_tokens)."""
        return run_layer(self.adapter.layer_module(du.layout), params, x, attn.layer_kwargs(),
                         self.policy.seq_tile_tokens)

    def _keeps_graph(self, u: int) -> bool:
        """Whether layer ``u`` keeps its forward graph for backward (activation keep, or one of the kept layers
        under recompute) rather than rerunning its forward: slidedp.units.unit_work decides, for every model."""
        return not self._work[u].recompute

    def _layer_forward(self, st: _Step, u: int, du: DeviceUnit) -> list[torch.Tensor]:
        if not self._keeps_graph(u):
            with torch.no_grad():
                return [self._layer(du, x, a, du.params(False)) for x, a in zip(st.ckpt[u], st.attn, strict=True)]
        du.leaves = du.params(True)
        st.kept[u], outs = [], []
        for x, a in zip(st.ckpt[u], st.attn, strict=True):
            leaf = x.detach().requires_grad_()
            with torch.enable_grad():
                out = self._layer(du, leaf, a, du.leaves)
            st.kept[u].append((leaf, out))
            outs.append(out.detach())
        return outs

    def _head_forward(self, st: _Step, u: int, du: DeviceUnit) -> None:
        """Loss and the head's own gradients now: the head is first in backward, so it is fetched once."""
        p = du.params(True)
        w_out = st.live[0].params(False)["weight"].detach().requires_grad_() if self.tied else p["lm_head.weight"]
        norm_slot = self.units[u].params[0]
        grads = {"norm": st.head_grad[norm_slot.offset:norm_slot.offset + norm_slot.numel],
                 "out": st.embed_grad if self.tied else st.head_grad[norm_slot.numel:]}
        st.grad_out = self.head.run(st.ckpt[u], st.labels, p["norm.weight"], w_out, st.inv_tokens, grads,
                                    st.loss_total)

    # ---- backward ---------------------------------------------------------------------------------------------
    def _backward_unit(self, st: _Step, u: int) -> None:
        dev, unit = self.device, self.units[u]
        du = st.live.get(u)  # None: a unit whose backward reads no weights (the embedding) and was not kept
        reload_ev = None
        if self.policy.activation == "offload" and unit.kind == "layer" and not self._resident[u]:
            st.ckpt[u], reload_ev = self.offload.reload(u, st.ckpt[u])
        if du is not None:
            dev.wait(dev.compute, du.ready)
        dev.wait(dev.compute, reload_ev)
        dev.wait(dev.compute, st.grad_done.get(u + self.policy.prefetch_depth))  # bounded gradients in flight
        with self.recorder.span("gpu", "bwd", u, flops=self._work[u].bwd_flops):
            gflat = self._layer_backward(st, u, du) if unit.kind == "layer" else self._embed_backward(st, u)
        self._send_grads(st, u, gflat)
        del gflat
        if u in st.live:
            self.params.release(st.live.pop(u))
        st.released.pop(u, None)

    def _layer_backward(self, st: _Step, u: int, du: DeviceUnit) -> torch.Tensor:
        """Recompute (or replay the kept graph) per micro-batch; fp32 parameter gradients summed over them."""
        keep = self._keeps_graph(u)
        gflat = torch.zeros(self.units[u].numel, dtype=torch.float32, device=self.device.torch_device)
        params = du.leaves if keep else du.params(True)
        new_grad_out = []
        for mb in range(len(st.ids)):
            with torch.enable_grad():
                if keep:
                    leaf, out = st.kept[u][mb]
                else:
                    leaf = st.ckpt[u][mb].detach().requires_grad_()
                    out = self._layer(du, leaf, st.attn[mb], params)
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

    def _send_grads(self, st: _Step, u: int, gflat: torch.Tensor) -> None:
        """A unit's finished gradient: to the GPU-held state, or over its route to the host state."""
        if self.poison_next_gradient:
            gflat.fill_(float("nan"))
            self.poison_next_gradient = False
        if self.config.resident_weights:  # nothing leaves the device: the gradient only adds to the norm
            st.norm_sq += torch.linalg.vector_norm(gflat).square()
        elif self.gpu_held.holds(u):
            self.gpu_held.take_grad(u, gflat)
        else:
            self.grads.send(u, gflat, st.norm_sq, st.grad_done)

    # ---- finish -------------------------------------------------------------------------------------------------
    def _finish(self, st: _Step, lr: float) -> tuple[float, float, bool]:
        """Global norm and loss; then skip (non-finite) or schedule this step's updates by the policy."""
        pol, host, comm = self.policy, self.host, self.comm
        norm_sq = self.grads.global_norm_sq(st.norm_sq)
        norm = math.sqrt(float(norm_sq.item()) + self.gpu_held.norm_sq())
        loss = float(self.groups.world.all_reduce_(st.loss_total.to(torch.float64).cpu()).item())
        if not math.isfinite(norm):
            self.gpu_held.drop_grads()
            if not self.config.resident_weights:  # the slots hold this step's gradients: restore the weights
                self.updates.restore_slots()
            comm.barrier()
            return loss, norm, True
        host.step += 1  # the resident reference too: its learning rate follows the same schedule
        if self.config.resident_weights:
            return loss, norm, False
        coef = clip_coefficient(self.optim, norm)
        self.gpu_held.update(host.step, lr, self.optim, coef)
        if pol.update_schedule == "next_forward":
            self.updates.defer(lr, coef, host.step)
        elif pol.update_schedule == "after_backward":
            self.device.synchronize()
            self.updates.submit_all(lr, coef, host.step)
            self.updates.wait_all()
        else:
            self.updates.wait_all()
        return loss, norm, False
