"""Shape-aware GPU compute: a unit's forward and backward as the operations it runs, each costed from its shape.

A per-model fit of "layer seconds per FLOP" transfers poorly to architectures it was not fitted on (other
hidden/FFN ratios, vocabularies, biases, sequence lengths). What transfers is the cost of each operation:
a GEMM by (M, N, K), flash attention by (batch, sequence, heads, KV heads, head_dim), the memory-bound
kernels (norms, rotary, activation, residual adds, gradient accumulation, the loss's fp32 logits) by the
bytes they move and the kernels they launch. ``slidedp calibrate`` fits :class:`ComputeCurves` to
micro-benchmarks over a grid of shapes (calibration.shape_bench), never to a target model, so a user's
new architecture needs no new calibration.

The byte and kernel counts below follow the eager Hugging Face implementations the runtime calls
(transformers' RMSNorm upcasts to fp32 and runs several kernels; rotary embedding is rotate-half, two
multiplies and an add), forward and backward, as counted from their aten calls (benchmarks.layer_bytes, whose
tests hold a whole layer's count to these within 3%); they are the one place those counts are written. The
micro-benchmarks time the modules' forward, so a forward count that is off by a constant is absorbed by the
fitted bandwidth; the backward is priced at the same bandwidth per module kind.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from slidedp.errors import SlideDPError


@dataclass(frozen=True)
class Gemm:
    """``count`` bf16 matrix products C[m, n] = A[m, k] @ B[k, n] with fp32 accumulation."""

    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class Attention:
    """Causal flash attention (SDPA) over ``batch`` sequences of ``seq`` tokens with grouped KV heads. Packed rows
    through the varlen kernel are priced as tokens / span sequences of their token-weighted mean example length
    (``attention_span`` in slidedp.units), so ``batch`` may be fractional: the FLOPs are those of the examples."""

    batch: float
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    backward: bool = False

    @property
    def flops(self) -> float:
        """QK^T and PV over the causal half (forward); the backward recomputes P and runs five products
        instead of two: 2.5x the forward."""
        fwd = 2.0 * 2.0 * self.batch * self.heads * self.head_dim * self.seq * self.seq / 2.0
        return 2.5 * fwd if self.backward else fwd


# Backward kernels of an elementwise chain read the saved input and the incoming gradient and write the outgoing
# one: this many times the forward's bytes and kernels, for an op whose backward is not counted (EagerModule).
ELEMENTWISE_BACKWARD_FACTOR = 2


@dataclass(frozen=True)
class Elementwise:
    """Memory-bound kernels: ``nbytes`` moved through HBM by ``kernels`` launches in forward; in backward
    ``backward_nbytes`` by ``backward_kernels`` (None: ELEMENTWISE_BACKWARD_FACTOR times the forward's). An op may
    move nothing in forward and only in backward (the gradient sums at a layer's fan-outs, a fused bias's gradient)."""

    name: str
    nbytes: float
    kernels: float  # launches; fractional for one rank's share of passes split over ranks
    backward_nbytes: float | None = None
    backward_kernels: float | None = None

    @property
    def flops(self) -> float:
        return 0.0

    def backward(self) -> Elementwise:
        """The memory-bound work of this op's backward, as an op of the same name (priced at its kind's bandwidth)."""
        nbytes = ELEMENTWISE_BACKWARD_FACTOR * self.nbytes if self.backward_nbytes is None else self.backward_nbytes
        kernels = (ELEMENTWISE_BACKWARD_FACTOR * self.kernels if self.backward_kernels is None
                   else self.backward_kernels)
        return Elementwise(self.name, float(nbytes), kernels, 0.0, 0)


ComputeOp = Gemm | Attention | Elementwise


@dataclass(frozen=True)
class EagerModule:
    """What one eager HF module moves per element and how many kernels it launches, forward and backward, counted
    from its aten calls (benchmarks.layer_bytes: each call's inputs and outputs; a test holds the counts)."""

    fwd_bytes: float
    fwd_kernels: int
    bwd_bytes: float
    bwd_kernels: int

    def op(self, name: str, elements: float, calls: int = 1) -> Elementwise:
        """``calls`` runs of the module over ``elements`` elements in all."""
        return Elementwise(name, float(elements * self.fwd_bytes), calls * self.fwd_kernels,
                           float(elements * self.bwd_bytes), calls * self.bwd_kernels)


# The eager HF memory-bound modules in bf16, per element (of the normed hidden state; of q and k for rotary; of one
# of SwiGLU's two inputs; of the projection's output for a bias), as counted on transformers 5.x:
# RMSNorm: bf16 in, fp32 upcast, pow, mean, rsqrt-mul, downcast, weight mul; its backward 88 B in 14 kernels to its
# input and 8 B in 2 for its weight's gradient (the product with the normed input, summed over tokens).
RMSNORM = EagerModule(36, 7, 96, 16)
# Rotary: rotate_half (slice + cat), x*cos, rot*sin, add (counted 21.3 B in 5 calls a tensor; 6 kept, with which the
# shipped presets' rotary bandwidths were fitted); its backward 29.3 B in 7 (slice_backward of both halves, the sum
# of the gradient's two paths).
ROTARY = EagerModule(22, 6, 29, 7)
SWIGLU = EagerModule(10, 2, 18, 3)  # silu(gate) * up; backward: silu_backward and two products
# x + y in bf16; its backward passes the gradient through unchanged (0 B): the sum where the layer's input also
# feeds the norm is GRADIENT_SUM's.
RESIDUAL = EagerModule(6, 1, 0, 0)
# A projection's bias (Qwen2's q/k/v): added in the GEMM's epilogue (addmm; cuBLASLt on a GPU), so nothing of its own
# in forward; its gradient is the output gradient summed over tokens (read 2 B per element, 1 kernel).
BIAS = EagerModule(0, 0, 2, 1)
# Autograd sums a tensor's gradients where it feeds several consumers (read two, write one: 6 B per bf16 element):
# a decoder layer's input (the norm and the residual), the normed input (q, k and v: two sums), the attention block's
# output (the second norm and residual) and the MLP's normed input (gate and up): five sums of the hidden state.
GRADIENT_SUM = EagerModule(0, 0, 6, 1)
GRADIENT_SUMS_PER_LAYER = 5
LOGITS_BYTES, LOGITS_KERNELS = 30, 6  # fp32 upcast of the logits, log-softmax, gather, and their backward
EMBED_BYTES, EMBED_KERNELS = 4, 1  # gather one bf16 row per token (read + write)
# Eager attention (HF's ``eager_attention_forward``, which SlideFormer hard-codes) materialises every score of
# batch x heads x seq x seq: the scores' scale (read 2, write 2), the causal mask's add (2 + 2), softmax in fp32
# (2 + 4) and its cast back to bf16 (4 + 2) = 20 B per score in 4 kernels; its backward (the cast's, softmax's
# and the scale's; the mask add passes the gradient through) moves about 24 B per score in 5 kernels. The matmul
# output and its input are the GEMMs' own traffic.
EAGER_SCORES = EagerModule(20, 4, 24, 5)
# Memory-bound ops priced at the achieved bandwidth of the module the micro-benchmarks time for them
# (ComputeCurves.memory_gbps_by_kind); ops no benchmark covers use the generic memory_gbps.
MEASURED_KIND: dict[str, str] = {"rmsnorm": "rmsnorm", "qk_norm": "rmsnorm", "rotary": "rotary",
                                 "swiglu": "swiglu", "residual": "residual", "qkv_bias": "residual",
                                 "logits": "logits", "gpu_optimizer": "optimizer", "grad_sum": "residual"}
# Kinds the generic memory_gbps leaves out of its fit: multi-tensor passes over a whole parameter list, unlike the
# one-tensor elementwise modules the generic bandwidth stands for (the gradient passes and sums, casts).
MULTI_TENSOR_KINDS = frozenset({"optimizer"})
# A GPU-resident optimizer step after backward, as torch runs it over fp32 state: clip_grad_norm_ reads each
# gradient for the norm and reads and writes it to scale (12 B per parameter), fused AdamW reads weight, gradient
# and both moments and writes weight and moments (28 B); multi-tensor launches (the norm, the scale, the update).
# Timed by calibration.shape_bench.optimizer_samples (kind "optimizer"): on an H100 2.6 TB/s alone (call65), where
# the elementwise modules' generic fit says 2.7; inside GPU-resident steps it took 2.1-2.4 TB/s' worth, about 4 ms of
# it a fixed part the bandwidth does not price (benchmarks/RESULTS.md, twenty-third session).
GPU_CLIP_HBM_BYTES, GPU_FUSED_ADAMW_HBM_BYTES = 12, 28
GPU_OPTIMIZER_HBM_BYTES = GPU_CLIP_HBM_BYTES + GPU_FUSED_ADAMW_HBM_BYTES
GPU_OPTIMIZER_KERNELS = 3


# SlideDP's own update of GPU-held units (runtime/gpu_state.py): the gradient scaled by the clip coefficient (read and
# write, 8 B), fused AdamW (28 B) and the bf16 weights refreshed from the master (read 4, write 2). The global norm is
# the gradient passes' (GRAD_FINISH_BYTES). calibrate times this pass (GPUSpec.adam_gparams_per_s).
GPU_STATE_UPDATE_HBM_BYTES = 8 + GPU_FUSED_ADAMW_HBM_BYTES + 6


def gpu_optimizer_op(params: float) -> Elementwise:
    """The clip and fused AdamW over ``params`` fp32 parameters, as one memory-bound op of kind ``optimizer``."""
    return Elementwise("gpu_optimizer", float(GPU_OPTIMIZER_HBM_BYTES * params), GPU_OPTIMIZER_KERNELS)


def gpu_state_update_op(params: float) -> Elementwise:
    """SlideDP's update of ``params`` GPU-held parameters (GPU_STATE_UPDATE_HBM_BYTES): priced at the rate calibrate
    times for this pass (GPUSpec.optimizer_pass_seconds), not at the peers' ``optimizer`` kind."""
    return Elementwise("gpu_state_update", float(GPU_STATE_UPDATE_HBM_BYTES * params), GPU_OPTIMIZER_KERNELS)


# Backward per parameter: zero the fp32 gradient (4 B), add each micro-batch's bf16 gradient into it
# (read 4 + 2, write 4), square-sum for the norm (4) and cast to bf16 for the D2H (read 4, write 2).
GRAD_ZERO_BYTES, GRAD_ACCUMULATE_BYTES, GRAD_FINISH_BYTES = 4, 10, 10


@dataclass(frozen=True)
class ComputeCurves:
    """Efficiency curves of one GPU, fitted to micro-benchmarks over shapes (slidedp calibrate).

    GEMM time = flops / (gemm_tflops x efficiency) + kernel_us, with efficiency 1 / (1 + m_half/M +
    n_half/N + k_half/K): each small dimension costs occupancy or reuse on its own. Attention runs at its
    forward or backward rate times seq / (seq + attention_half_seq), plus a fixed cost per call and
    direction (``attention_fwd_us``, ``attention_bwd_us``). Memory-bound kernels move their bytes at
    ``memory_gbps`` plus kernel_us each.

    Why attention has fixed costs of its own: SDPA's backward is several kernels (the dO.O preprocessing,
    the fp32 dQ accumulator's conversion, the grouped-KV reductions), a fixed ~0.3 ms on the H200 that a GEMM's
    kernel_us does not describe. Without that term the only way a fit could explain slow short sequences was a
    large attention_half_seq, i.e. a rate still rising far beyond the longest sample: the 2026-12-03 fit put the
    asymptote at 793 TF/s forward where every sample from 16K to 32K tokens ran at 611-613, and under-priced
    attention at 256K tokens by about a quarter (benchmarks/RESULTS.md, "Attention at long sequences").

    A decoder layer's pass cannot finish before the CPU has issued its kernels (eager Python through
    the HF module: ``layer_dispatch_us`` forward, ``backward_dispatch_us`` backward), and pays a fixed
    cost on top (``layer_overhead_us``, ``backward_overhead_us``): pass = max(sum of ops, dispatch) +
    overhead. The embedding and the loss head are priced by their operations alone.
    """

    gemm_tflops: float
    gemm_half_m: float
    gemm_half_n: float
    gemm_half_k: float
    attention_fwd_tflops: float
    attention_bwd_tflops: float
    attention_half_seq: float
    memory_gbps: float
    kernel_us: float
    layer_overhead_us: float
    backward_overhead_us: float = 0.0
    layer_dispatch_us: float = 0.0
    backward_dispatch_us: float = 0.0
    # Achieved bandwidth of each measured memory-bound module against its byte count (MEASURED_KIND): the
    # eager modules move more than their nominal bytes (rotary's rotate-half copies, RMSNorm's fp32
    # temporaries), and by how much differs per module.
    memory_gbps_by_kind: dict[str, float] = field(default_factory=dict)
    # Fixed cost per memory-bound kernel (launch and dispatch of a small eager op), apart from kernel_us,
    # which prices GEMM and attention kernels; None: kernel_us for both.
    memory_kernel_us: float | None = None
    # Fixed cost of one attention call, forward and backward (None: kernel_us, as profiles fitted before
    # these fields existed priced it).
    attention_fwd_us: float | None = None
    attention_bwd_us: float | None = None
    # How many times longer the GPU's operations take inside a training step than the micro-benchmarks timed them
    # (sustained clocks under continuous load, the copies and allocator beside them): on the H200 a decoder layer
    # in the runtime ran 2-7% longer than the same layer timed alone. Fitted from runs' compute-bound layer passes
    # (calibration.from_run.fit_step_compute_factor); 1 for curves fitted from micro-benchmarks alone. It scales
    # every operation, not the CPU's dispatch floor of a pass.
    step_factor: float = 1.0

    def __post_init__(self) -> None:
        for name in ("gemm_tflops", "attention_fwd_tflops", "attention_bwd_tflops", "memory_gbps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise SlideDPError(f"gpu.compute.{name} must be a finite positive number, got {value!r}")
        for name in ("gemm_half_m", "gemm_half_n", "gemm_half_k", "attention_half_seq", "kernel_us",
                     "layer_overhead_us", "backward_overhead_us", "layer_dispatch_us", "backward_dispatch_us"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise SlideDPError(f"gpu.compute.{name} must be a finite number >= 0, got {value!r}")
        for name in ("memory_kernel_us", "attention_fwd_us", "attention_bwd_us"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise SlideDPError(f"gpu.compute.{name} must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.step_factor, (int, float)) and 0.5 <= self.step_factor <= 2.0):
            raise SlideDPError(f"gpu.compute.step_factor must be between 0.5 and 2, got {self.step_factor!r}")
        for kind, value in self.memory_gbps_by_kind.items():
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise SlideDPError(f"gpu.compute.memory_gbps_by_kind.{kind} must be a finite positive number, "
                                   f"got {value!r}")

    def with_module_gbps(self, kind: str, gbps: float) -> ComputeCurves:
        """These curves with one memory-bound module (a MEASURED_KIND value) priced at ``gbps``."""
        return replace(self, memory_gbps_by_kind={**self.memory_gbps_by_kind, kind: float(gbps)})

    def gemm_seconds(self, op: Gemm) -> float:
        eff = 1.0 / (1.0 + self.gemm_half_m / op.m + self.gemm_half_n / op.n + self.gemm_half_k / op.k)
        return op.count * (2.0 * op.m * op.n * op.k / (self.gemm_tflops * 1e12 * eff) + self.kernel_us * 1e-6)

    def attention_seconds(self, op: Attention) -> float:
        rate = self.attention_bwd_tflops if op.backward else self.attention_fwd_tflops
        fixed_us = self.attention_bwd_us if op.backward else self.attention_fwd_us
        eff = op.seq / (op.seq + self.attention_half_seq)
        return op.flops / (rate * 1e12 * eff) + (self.kernel_us if fixed_us is None else fixed_us) * 1e-6

    def elementwise_seconds(self, op: Elementwise) -> float:
        gbps = self.memory_gbps_by_kind.get(MEASURED_KIND.get(op.name, ""), self.memory_gbps)
        kernel_us = self.kernel_us if self.memory_kernel_us is None else self.memory_kernel_us
        return op.nbytes / (gbps * 1e9) + op.kernels * kernel_us * 1e-6

    def seconds(self, op: ComputeOp) -> float:
        """One operation inside a training step: its micro-benchmarked cost times ``step_factor``."""
        if isinstance(op, Gemm):
            alone = self.gemm_seconds(op)
        elif isinstance(op, Attention):
            alone = self.attention_seconds(op)
        else:
            alone = self.elementwise_seconds(op)
        return alone * self.step_factor

    def total_seconds(self, ops: Iterable[ComputeOp]) -> float:
        return sum(self.seconds(op) for op in ops)

    def layer_pass_seconds(self, ops: Iterable[ComputeOp], backward: bool) -> float:
        """One decoder layer's forward or backward pass: its operations, not faster than the CPU issues
        them, plus the pass's fixed cost."""
        if backward:
            floor, extra = self.backward_dispatch_us, self.backward_overhead_us
        else:
            floor, extra = self.layer_dispatch_us, self.layer_overhead_us
        return max(self.total_seconds(ops), floor * 1e-6) + extra * 1e-6


ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")

# Numerics of a layer's forward: ``bf16`` weights and activations (SlideDP, and peers that compute in bf16: DeepSpeed,
# FSDP2's MixedPrecisionPolicy), or ``amp-fp32``: fp32 weights under torch.autocast (plain GPU-resident training).
# Under autocast the embedding's fp32 output keeps the residual stream fp32 (a norm's fp32 weight times its fp32 input
# stays fp32), so every projection casts its input (q, k, v, gate, up: 5 casts, 6 B per element each), the residual
# adds read and write fp32 and the two RMSNorms skip their casts. With q/k norms, their fp32 weights make q and k fp32,
# rotary runs in fp32 and SDPA casts q and k back; without them only rotary's products and add turn fp32 (cos and sin
# follow the stream's dtype) before SDPA's cast. Counted from an HF layer's aten calls (benchmarks.layer_bytes, the
# difference between the two numerics at three q/k widths, an exact linear fit): forward +24 B per element of the
# hidden state and +28 / +16 B per element of q and k with / without q/k norms; backward +74 B per hidden element
# (the five gradient sums in fp32, the five input casts' gradients cast back, the norms' fp32 products) and +50 / +26
# per q/k element; 3 more kernels a layer forward and about 8 backward (7 with q/k norms, 9 without). The linear
# weights are cast to bf16 in forward and again in the recomputed forward (6 B per parameter each), and each weight
# gradient is cast back to fp32 in backward (6 B), which replaces SlideDP's per-unit gradient pass (gradient_ops) for
# these layers: a step with zero_grad(set_to_none) has no buffer to zero or accumulate into. The head's cast (one
# forward, under 1 ms for Qwen3-4B on an H100) is not priced. Measured (benchmarks/RESULTS.md, call56): on an H100 the
# memory-bound kernels of a GPU-resident Qwen3-4B step grew by 0.221 s per sequence of 4096 tokens where the bf16
# operations' count then said 0.164.
BF16, AMP_FP32 = "bf16", "amp-fp32"
PRECISIONS = (BF16, AMP_FP32)
AMP_STREAM_BYTES, AMP_STREAM_KERNELS = 24, 3  # per element of the hidden state; kernels a layer adds
AMP_QK_BYTES, AMP_QK_BYTES_WITHOUT_NORM = 28, 16  # per element of q and k, with and without q/k norms
AMP_STREAM_BACKWARD_BYTES, AMP_STREAM_BACKWARD_KERNELS = 74, 8
AMP_QK_BACKWARD_BYTES, AMP_QK_BACKWARD_BYTES_WITHOUT_NORM = 50, 26
AMP_WEIGHT_CAST_BYTES = 6  # fp32 -> bf16 weight (read 4, write 2), and bf16 -> fp32 gradient


def check_precision(name: str) -> str:
    """``name`` if it is a layer numerics the compute model prices, else one line naming them."""
    if name not in PRECISIONS:
        raise SlideDPError(f"precision {name!r}: choose one of {', '.join(PRECISIONS)}")
    return name


def amp_fp32_ops(tokens: int, hidden: int, qk: int, qk_norm: bool, linear_params: int,
                 linear_tensors: int) -> list[ComputeOp]:
    """What a decoder layer's forward under autocast over fp32 weights moves beyond its bf16 operations (AMP_FP32):
    the fp32 stream's casts and wider elementwise traffic, and the linear weights' casts (none in backward: the
    gradients' casts are amp_gradient_ops)."""
    qk_bytes = AMP_QK_BYTES if qk_norm else AMP_QK_BYTES_WITHOUT_NORM
    qk_back = AMP_QK_BACKWARD_BYTES if qk_norm else AMP_QK_BACKWARD_BYTES_WITHOUT_NORM
    return [Elementwise("amp_stream", float(tokens * (AMP_STREAM_BYTES * hidden + qk_bytes * qk)), AMP_STREAM_KERNELS,
                        float(tokens * (AMP_STREAM_BACKWARD_BYTES * hidden + qk_back * qk)),
                        AMP_STREAM_BACKWARD_KERNELS),
            Elementwise("amp_weight_cast", float(linear_params * AMP_WEIGHT_CAST_BYTES), linear_tensors, 0.0, 0)]


def amp_gradient_ops(linear_params: int, linear_tensors: int) -> list[ComputeOp]:
    """A layer's backward bookkeeping under autocast over fp32 weights: each bf16 weight gradient cast to fp32 into
    its parameter's .grad (in place of gradient_ops' buffer passes)."""
    return [Elementwise("amp_grad_cast", float(linear_params * AMP_WEIGHT_CAST_BYTES), linear_tensors)]


def check_attention(name: str) -> str:
    """``name`` if it is an attention kernel the compute model prices, else one line naming them."""
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise SlideDPError(f"attention {name!r}: choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return name


def eager_attention_ops(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int) -> list[ComputeOp]:
    """Forward of eager (non-fused) causal attention: the grouped K and V expanded to every head, the full
    QK^T product (eager computes the masked half too), the score chain (EAGER_SCORES) and PV."""
    pairs = batch * heads
    expand = 2 * batch * seq * heads * head_dim * 2 * 2 if kv_heads != heads else 0  # K and V: read + write bf16
    scores = batch * heads * seq * seq
    ops: list[ComputeOp] = [Gemm(seq, seq, head_dim, count=pairs),
                            EAGER_SCORES.op("eager_scores", scores),
                            Gemm(seq, head_dim, seq, count=pairs)]
    if expand:  # its backward sums each group's gradients into the K and V heads: about the forward's traffic
        ops.insert(0, Elementwise("repeat_kv", expand, 2, expand, 2))
    return ops


def backward_ops(forward: list[ComputeOp]) -> list[ComputeOp]:
    """The backward of a forward op list: a GEMM's input gradient (M x K from M x N by N x K) and weight
    gradient (N x K from N x M by M x K), attention's backward kernel, memory-bound ops as
    :meth:`Elementwise.backward` says (those whose backward moves nothing, a residual add's, left out)."""
    out: list[ComputeOp] = []
    for op in forward:
        if isinstance(op, Gemm):
            out.append(Gemm(op.m, op.k, op.n, op.count))
            out.append(Gemm(op.n, op.k, op.m, op.count))
        elif isinstance(op, Attention):
            out.append(Attention(op.batch, op.seq, op.heads, op.kv_heads, op.head_dim, backward=True))
        else:
            back = op.backward()
            if back.nbytes or back.kernels:
                out.append(back)
    return out


def loss_head_ops(hidden: int, vocab: int, tokens: int, chunk_tokens: int) -> tuple[list[ComputeOp], list[ComputeOp]]:
    """Forward and backward of the runtime's loss head (runtime/loss_head.py) over ``tokens`` tokens in chunks of
    ``chunk_tokens``: final norm, lm_head and cross-entropy; each chunk's logits are made, used and differentiated
    at once (never recomputed), and each chunk adds its fp32 weight gradient (read 2 + 4, write 4 ... 18 B/param).
    The logits chain (fp32 upcast, log-softmax, gather, and their backward) is the ``logits`` op, priced at its
    own achieved bandwidth where calibration timed the head (calibration.shape_bench.head_samples)."""
    full, rest = divmod(tokens, chunk_tokens)
    gemms = [Gemm(chunk_tokens, vocab, hidden, count=full)] if full else []
    if rest:
        gemms.append(Gemm(rest, vocab, hidden))
    chunks = full + (1 if rest else 0)
    norm = RMSNORM.op("rmsnorm", tokens * hidden, chunks)
    logits = Elementwise("logits", tokens * vocab * LOGITS_BYTES, chunks * LOGITS_KERNELS)
    forward: list[ComputeOp] = [norm, *gemms, logits]
    accumulate = Elementwise("head_grad_accumulate", chunks * vocab * hidden * 18.0, 2 * chunks)
    return forward, [*backward_ops([norm, *gemms]), accumulate]


def gradient_ops(params: int, tensors: int, accumulations: int) -> list[ComputeOp]:
    """Per-unit backward bookkeeping of the runtime: the fp32 gradient buffer zeroed, ``accumulations``
    additions of each of the unit's ``tensors`` parameter gradients into it, then its norm and the bf16
    cast for the D2H."""
    nbytes = params * (GRAD_ZERO_BYTES + GRAD_ACCUMULATE_BYTES * accumulations + GRAD_FINISH_BYTES)
    return [Elementwise("grad_accumulate", float(nbytes), 3 + tensors * accumulations)]
