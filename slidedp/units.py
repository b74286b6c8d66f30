"""A step's streamed units: what each one computes (from the model's shape) and how long it takes.

The embedding, each decoder layer and the final norm + lm_head are units, streamed as a whole. Their work
(parameters, FLOPs, checkpoint bytes) depends only on the model, the activation policy and the batching,
so the runtime annotates its traces from :func:`unit_work` without any GPU spec; the models and the
simulator time that work on a GPU with :func:`build_units`.

Times and FLOPs are per rank for the whole step (all micro-batches), because layers are streamed once per
step in layer-major order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from slidedp.compute import BF16, ComputeOp, backward_ops, gradient_ops
from slidedp.errors import SlideDPError
from slidedp.hardware import GPUSpec
from slidedp.model_spec import ModelSpec

RECOMPUTING_ACTIVATIONS: tuple[str, ...] = ("recompute", "offload")


def backward_reads_weights(kind: str) -> bool:
    """Whether a unit of this kind reads its weights in backward. The embedding's backward is an index-add of
    the output gradient into the rows that were looked up: it needs the token ids and that gradient, never the
    table, so an embedding that left the GPU after forward is not fetched again for backward."""
    return kind != "embed"


@dataclass(frozen=True)
class UnitWork:
    """What one unit computes in a step, independent of the machine.

    ``linear_flops`` and ``attention_flops`` are one micro-batch's forward FLOPs; backward costs twice
    the forward, plus the forward again where the unit reruns it (``recompute``), plus what a sequence-tiled
    layer reruns per tile (``tile_flops``: its norms and MLP, ModelSpec.tile_recompute_ops).
    """

    index: int
    name: str
    kind: str  # embed | layer | head
    params: int
    linear_flops: float
    attention_flops: float
    tokens: int  # per micro-batch
    micro_batches: int
    recompute: bool
    checkpoint_bytes: float  # per rank, offloaded to host and reloaded (offload policy only)
    pinned: bool = False  # stays on the GPU all step (a tied embedding, which the head reuses)
    tile_flops: float = 0.0  # per micro-batch: the sequence tiles' forward rerun in backward (Policy.seq_tile_tokens)
    # The operations it runs (slidedp.compute), for GPUs with shape-aware compute curves: per micro-batch
    # forward, backward and what backward reruns of the forward; per step, the gradient bookkeeping.
    fwd_ops: tuple[ComputeOp, ...] = ()
    bwd_ops: tuple[ComputeOp, ...] = ()
    recompute_ops: tuple[ComputeOp, ...] = ()  # includes the tiles' rerun (tile_flops)
    step_ops: tuple[ComputeOp, ...] = ()

    @property
    def fwd_flops(self) -> float:
        return (self.linear_flops + self.attention_flops) * self.micro_batches

    @property
    def backward_needs_weights(self) -> bool:
        return backward_reads_weights(self.kind)

    @property
    def bwd_flops(self) -> float:
        """Includes the recomputed forward where the activation policy (or the chunked loss) recomputes."""
        per_mb = (2 + (1 if self.recompute else 0)) * (self.linear_flops + self.attention_flops) + self.tile_flops
        return per_mb * self.micro_batches


@dataclass(frozen=True)
class Unit:
    """A unit's work timed on one GPU (see :func:`build_units`)."""

    index: int
    name: str
    kind: str  # embed | layer | head
    params: int
    fwd_flops: float
    fwd_s: float
    bwd_flops: float  # includes the recomputed forward where the activation policy recomputes
    bwd_s: float
    checkpoint_bytes: float  # per rank, offloaded to host and reloaded (offload policy only)
    pinned: bool = False  # stays on the GPU all step (a tied embedding, which the head reuses)

    @property
    def backward_needs_weights(self) -> bool:
        return backward_reads_weights(self.kind)


_Placed = TypeVar("_Placed", UnitWork, Unit)


def relabelled(unit: _Placed, index: int, name: str) -> _Placed:
    """A copy of ``unit`` (a UnitWork or a Unit) at another place in the model: ``dataclasses.replace(unit,
    index=index, name=name)``, built without __init__. A frozen dataclass's __init__ sets each field through
    object.__setattr__, and a workload of an 80-layer model builds 160 of these: copying the fields' dict is
    about 4x faster (0.05 against 0.2 ms for 80), which keeps a fresh analytical estimate near 1 ms. Neither class
    checks anything in __init__, so the copy is the object replace would build (tested)."""
    copy = object.__new__(type(unit))
    fields = copy.__dict__
    fields.update(unit.__dict__)
    fields["index"], fields["name"] = index, name
    return copy


def attention_span(lengths: list[int] | tuple[int, ...]) -> float:
    """The token-weighted mean length of the examples whose attention packed rows compute (padding counts as
    an example of its own: the varlen kernel runs it): sum(L^2) / sum(L). Causal attention over examples of
    these lengths costs what tokens / span sequences of span tokens cost, which is how the compute model prices
    them."""
    tokens = sum(lengths)
    if tokens <= 0 or min(lengths) <= 0:
        raise SlideDPError(f"attention span: example lengths must be positive, got {list(lengths)[:8]}")
    return sum(n * n for n in lengths) / tokens


def unit_work(m: ModelSpec, activation: str, micro_batch: int, accumulation: int, seq: int,
              loss_chunk_tokens: int = 4096, seq_tile_tokens: int = 0,
              attention_span: float | None = None, attention: str = "sdpa",
              kept_layers: int = 0, precision: str = BF16) -> tuple[UnitWork, ...]:
    """The units of ``m`` with their work for one activation policy, micro-batching and sequence tile.
    ``kept_layers``: under ``recompute``, the last k decoder layers keep their graphs (Policy.kept_layers): the
    one rule of which layers recompute, followed by the runtime (UnitWork.recompute) and the models alike.
    ``attention_span``: packed rows whose attention stays inside each example (the varlen kernel), priced by the
    examples' token-weighted mean length (:func:`attention_span`); None: every row is one causal sequence.
    ``attention``: the kernel (ModelSpec.layer_forward_ops); eager computes the masked half of the scores too.
    ``precision``: the layers' numerics (slidedp.compute.PRECISIONS; a peer's, PeerSystem.precision)."""
    mb_tokens = seq * micro_batch
    recompute = activation in RECOMPUTING_ACTIVATIONS
    if kept_layers > m.layers:
        raise SlideDPError(f"policy.kept_layers {kept_layers} exceeds the model's {m.layers} decoder layers")
    first_kept = m.layers - kept_layers
    lin = m.layer_linear_flops_per_token() * mb_tokens
    attn = m.layer_attention_flops_per_token(seq, attention_span, attention) * mb_tokens
    ckpt = (m.checkpoint_bytes_per_token() * mb_tokens * accumulation) if activation == "offload" else 0.0
    embed_fwd, embed_bwd = m.embedding_ops(mb_tokens)
    units = [UnitWork(0, "embed", "embed", m.embedding_params, 0.0, 0.0, mb_tokens, accumulation, False, 0.0,
                      pinned=m.tied_embeddings, fwd_ops=tuple(embed_fwd), bwd_ops=tuple(embed_bwd),
                      step_ops=tuple(gradient_ops(m.embedding_params, 1, 0)))]
    layer_fwd = tuple(m.layer_forward_ops(micro_batch, seq, attention_span, attention, precision))
    layer_bwd = tuple(backward_ops(list(layer_fwd)))
    tile_ops = tuple(m.tile_recompute_ops(micro_batch, seq, seq_tile_tokens))
    tile_flops = sum(op.flops for op in tile_ops)
    layer_grads = tuple(m.layer_gradient_ops(accumulation, precision))
    layers: dict[bool, UnitWork] = {}  # the layers differ only in place and in whether they rerun the forward
    for i in range(m.layers):
        reruns = recompute and i < first_kept
        if reruns not in layers:
            layers[reruns] = UnitWork(i + 1, f"layer{i}", "layer", m.layer_params, lin, attn, mb_tokens,
                                      accumulation, reruns, ckpt, tile_flops=tile_flops, fwd_ops=layer_fwd,
                                      bwd_ops=layer_bwd, recompute_ops=(layer_fwd if reruns else ()) + tile_ops,
                                      step_ops=layer_grads)
        units.append(relabelled(layers[reruns], i + 1, f"layer{i}"))
    # FLOPs as the layer-level model counts the chunked loss (backward = 2x + a recomputed forward); the op
    # list follows the runtime, which makes, uses and differentiates each logits chunk once.
    head_fwd, head_bwd = m.head_ops(mb_tokens, loss_chunk_tokens)
    units.append(UnitWork(m.layers + 1, "head", "head", m.head_params, m.head_flops_per_token() * mb_tokens, 0.0,
                          mb_tokens, accumulation, True, 0.0, fwd_ops=tuple(head_fwd), bwd_ops=tuple(head_bwd),
                          step_ops=tuple(gradient_ops(m.head_params, 1, 0))))
    return tuple(units)


def time_unit(work: UnitWork, gpu: GPUSpec) -> Unit:
    """Forward and backward seconds of one unit's work on ``gpu``.

    With shape-aware curves (``gpu.compute``) each operation is costed from its shape; a decoder layer's
    pass is their sum, not faster than its CPU dispatch, plus a fixed cost (ComputeCurves.layer_pass_seconds),
    and the embedding and the head are their operations alone. Otherwise the layer-level model: linears at their
    token-dependent rate, attention at its rate, a fixed per-pass overhead, backward as fitted multiples
    of the forward parts."""
    if gpu.compute is not None:
        return _time_ops(work, gpu)
    overhead = gpu.layer_overhead_us * 1e-6
    lin_s = gpu.linear_time(work.linear_flops, work.tokens)
    att_s = gpu.attention_time(work.attention_flops)
    fwd_s = lin_s + att_s + overhead
    bwd_s = gpu.backward_linear_ratio * lin_s + gpu.backward_attention_ratio * att_s + overhead
    if work.recompute:
        bwd_s += fwd_s
    if work.tile_flops:  # the tiles' norms and MLP, rerun at the linears' rate
        bwd_s += gpu.linear_time(work.tile_flops, work.tokens)
    mb = work.micro_batches
    return Unit(work.index, work.name, work.kind, work.params, work.fwd_flops, fwd_s * mb, work.bwd_flops, bwd_s * mb,
                work.checkpoint_bytes, work.pinned)


def _time_ops(work: UnitWork, gpu: GPUSpec) -> Unit:
    curves = gpu.compute
    if work.kind == "layer":
        fwd_s = curves.layer_pass_seconds(work.fwd_ops, backward=False)
        bwd_s = curves.layer_pass_seconds(work.bwd_ops, backward=True)
        if work.recompute_ops:
            bwd_s += curves.layer_pass_seconds(work.recompute_ops, backward=False)
    else:  # the embedding lookup and the loss head: their kernels alone
        fwd_s = curves.total_seconds(work.fwd_ops)
        bwd_s = curves.total_seconds(work.bwd_ops) + curves.total_seconds(work.recompute_ops)
    mb = work.micro_batches
    return Unit(work.index, work.name, work.kind, work.params, work.fwd_flops, fwd_s * mb, work.bwd_flops,
                bwd_s * mb + curves.total_seconds(work.step_ops), work.checkpoint_bytes, work.pinned)


def build_units(m: ModelSpec, gpu: GPUSpec, activation: str, micro_batch: int, accumulation: int,
                seq: int, loss_chunk_tokens: int = 4096, seq_tile_tokens: int = 0,
                attention_span: float | None = None, attention: str = "sdpa") -> tuple[Unit, ...]:
    """Streamed units with per-rank step times and FLOPs for one micro-batching and activation policy.

    Separate from StepWorkload so a tuner can reuse units across policies that share these inputs.
    """
    return time_units(unit_work(m, activation, micro_batch, accumulation, seq, loss_chunk_tokens, seq_tile_tokens,
                                attention_span, attention), gpu)


def time_units(works: tuple[UnitWork, ...], gpu: GPUSpec) -> tuple[Unit, ...]:
    """:func:`time_unit` of each of ``works``. The decoder layers of one model do the same work except whether
    they recompute (unit_work), so each kind of layer is timed once and the others are copies of it under their
    own index and name."""
    timed: dict[bool, Unit] = {}
    units = []
    for w in works:
        if w.kind != "layer":
            units.append(time_unit(w, gpu))
            continue
        if w.recompute not in timed:
            timed[w.recompute] = time_unit(w, gpu)
        units.append(relabelled(timed[w.recompute], w.index, w.name))
    return tuple(units)


def check_gpu_state_units(count: int, num_units: int) -> None:
    """``Policy.gpu_state_units`` cannot hold more units than the model has."""
    if count > num_units:
        raise SlideDPError(f"policy.gpu_state_units {count} exceeds the model's {num_units} units "
                           f"(embedding, {num_units - 2} layers, head)")


def resident_in_backward(units, prefetch_depth: int, gpu_state_units: int = 0) -> tuple[bool, ...]:
    """Per unit, whether it is still on the GPU when backward starts (the last prefetch window, pinned, or
    one of the leading units whose state lives on the GPU), so its backward needs no re-fetch: the
    simulator's schedule and the runtime both follow this."""
    first = len(units) - prefetch_depth
    return tuple(u >= first or u < gpu_state_units or unit.pinned for u, unit in enumerate(units))


def refetched_in_backward(units, prefetch_depth: int, gpu_state_units: int = 0) -> tuple[bool, ...]:
    """Per unit, whether backward copies its weights to the GPU again: it left the GPU after forward (not
    resident_in_backward) and its backward reads them (``backward_needs_weights``; not the embedding). The
    simulator's schedule, the analytical model and the runtime all follow this."""
    resident = resident_in_backward(units, prefetch_depth, gpu_state_units)
    return tuple(not r and unit.backward_needs_weights for r, unit in zip(resident, units, strict=True))
