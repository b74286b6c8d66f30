"""GPU peak and host bytes of a step, so infeasible policies are rejected before anything is timed.

Host state is one authoritative copy for all ranks: master weights, Adam m and v and one bf16 slot per
parameter that holds the gradient from its D2H until the update and the new bf16 weights from the cast until
the next step's H2D. A unit's backward re-fetch precedes its gradient, so the two uses of the slot never
overlap. Its bytes per parameter come from the policy's StatePrecision: 14 for exact fp32 state where peers
need 16 or more, ~8 with 8-bit moments, ~6 with a bf16 master too. GPU-held units keep fp32 state on the GPU
(16 B/param there) and still have their copy in the host state.
"""

from __future__ import annotations

from dataclasses import dataclass

from slidedp.hardware import GIB, gib_text
from slidedp.model_spec import BF16_BYTES
from slidedp.workload import StepWorkload

# Live bytes per logit of one loss chunk (bf16 logits, their fp32 upcast, the softmax gradient): 8 matches the
# 13 measured H200 peaks (Qwen3-4B/8B, 4K-128K tokens) within 10% at 32K-128K; see benchmarks/RESULTS.md.
LOGITS_BYTES_PER_ELEMENT = 8
# A GPU-held unit's optimizer state: fp32 master, m, v and fp32 gradient, whatever the host state's precision.
GPU_STATE_BYTES_PER_PARAM = 16


@dataclass(frozen=True)
class MemoryEstimate:
    gpu_weights: float
    gpu_grads: float
    gpu_activations: float
    gpu_loss: float
    gpu_reserve: float
    gpu_optimizer: float  # fp32 master, m, v and the fp32 gradient of the GPU-state units
    host_state: float
    host_buffers: float  # per-rank host buffers beside the state (the per-rank route's landing buffers)
    host_activations: float
    params: int

    @property
    def gpu_peak(self) -> float:
        return (self.gpu_weights + self.gpu_grads + self.gpu_activations + self.gpu_loss + self.gpu_reserve
                + self.gpu_optimizer)

    @property
    def gpu_allocated_peak(self) -> float:
        """What PyTorch's allocator itself holds at the peak (torch.cuda.max_memory_allocated): the peak
        without the reserve for the CUDA context and allocator slack."""
        return self.gpu_peak - self.gpu_reserve

    @property
    def host_total(self) -> float:
        return self.host_state + self.host_buffers + self.host_activations

    @property
    def host_bytes_per_param(self) -> float:
        return self.host_state / self.params

    def gpu_peak_gib(self) -> float:
        return self.gpu_peak / GIB

    def host_total_gib(self) -> float:
        return self.host_total / GIB


def _window_max(values: list[float], depth: int) -> float:
    if not values:
        return 0.0
    depth = min(depth, len(values))
    window = sum(values[:depth])
    best = window
    for i in range(depth, len(values)):
        window += values[i] - values[i - depth]
        best = max(best, window)
    return best


def activation_bytes(w: StepWorkload) -> float:
    """GPU bytes of the activations one rank holds at the start of backward under the policy's activation mode:
    every layer's kept activations (``keep``), the per-layer checkpoints plus one layer's working set
    (``recompute``; its Policy.kept_layers hold their graphs instead of checkpoints, and the working set stays
    counted on top of them: a kept layer's backward allocates temporaries of about that size, so the count
    errs high by at most one working set), or the checkpoints of the prefetch window plus one working set
    (``offload``). A layer's working set and kept bytes are bounded by the sequence tile when
    Policy.seq_tile_tokens is set, down to the attention backward's transients over the whole sequence, which
    no tile bounds (ModelSpec.layer_working_bytes). Shared with the peers' memory models (slidedp.peers), which
    all recompute per decoder layer."""
    m, pol = w.model, w.policy
    tile = pol.seq_tile_tokens
    ckpt = m.checkpoint_bytes_per_token() * w.tokens_per_rank
    working = m.layer_working_bytes(w.tokens_per_micro_batch, tile)
    if pol.activation == "keep":
        # The kept graphs, and on top of them the backward's transients of the layer in backward (tiled: one
        # tile's rerun or the attention's backward, whichever is larger).
        transient = m.layer_backward_transient_bytes(w.tokens_per_micro_batch, tile)
        return m.layers * m.layer_kept_bytes(w.tokens_per_rank, tile) + ckpt + transient
    if pol.activation == "recompute":
        return (m.layers + 1) * ckpt + working + pol.kept_layers * kept_layer_bytes(w)
    return (pol.prefetch_depth + 1) * ckpt + working


def kept_layer_bytes(w: StepWorkload) -> float:
    """GPU bytes each of Policy.kept_layers adds under ``recompute``: its kept graph in place of its checkpoint.
    The GPU peak grows by exactly this per kept layer, which is how the tuner sizes kept_layers in one step."""
    m = w.model
    return m.layer_kept_bytes(w.tokens_per_rank, w.policy.seq_tile_tokens) - m.checkpoint_bytes_per_token() * \
        w.tokens_per_rank


def loss_bytes(w: StepWorkload) -> float:
    """GPU bytes of the chunked loss: one chunk's logits at LOGITS_BYTES_PER_ELEMENT, plus the hidden states
    the head reads."""
    m, pol = w.model, w.policy
    ckpt = m.checkpoint_bytes_per_token() * w.tokens_per_rank
    return min(pol.loss_chunk_tokens, w.tokens_per_micro_batch) * m.vocab * LOGITS_BYTES_PER_ELEMENT + ckpt


def estimate_memory(w: StepWorkload) -> MemoryEstimate:
    m, pol, units = w.model, w.policy, w.units
    depth = pol.prefetch_depth
    on_gpu = [w.gpu_state(i) for i in range(len(units))]
    stays = [u.pinned or g for u, g in zip(units, on_gpu, strict=True)]
    streamed = [0.0 if keep else BF16_BYTES * u.params for u, keep in zip(units, stays, strict=True)]
    pinned = sum(BF16_BYTES * u.params for u, keep in zip(units, stays, strict=True) if keep)
    weights = _window_max(streamed, depth) + pinned

    accum_bytes = 4 if (pol.accumulation > 1 or pol.grad_dtype == "fp32") else pol.grad_bytes
    grad_out = [0.0 if keep else pol.grad_bytes * u.params for u, keep in zip(units, stays, strict=True)]
    grads = _window_max(grad_out, depth) + max(accum_bytes * u.params for u in units)
    # The tied matrix accumulates head + lookup gradients in fp32 (counted below when it is a GPU-state unit).
    grads += sum(4 * u.params for u, g in zip(units, on_gpu, strict=True) if u.pinned and not g)
    # GPU-state units hold fp32 master, m, v all step and their fp32 gradient from backward to the update.
    optimizer = sum(GPU_STATE_BYTES_PER_PARAM * u.params for u, g in zip(units, on_gpu, strict=True) if g)
    if w.routes.reduce_scatters:
        # The runtime's reduce-scatter output (this rank's fp32 shards of a unit) and one padded chunk input.
        largest_unit = max(u.params for u in units)
        grads += 4 * largest_unit / w.ranks + 4 * largest_unit / w.chunks

    acts = activation_bytes(w)
    loss = loss_bytes(w)

    params = m.total_params
    # Master and moments of this host's share (all of them unless sharded across hosts), the slot of every one.
    state_per_param = (w.state.optimizer_bytes_per_param * w.routes.host_state_fraction
                       + w.state.slot_bytes_per_param(pol.grad_bytes))
    # The per-rank gradient route lands each rank's copy of one unit's gradient in that rank's own buffer
    # until the owners have summed them (the runtime holds one unit per rank: a barrier per unit in backward).
    buffers = w.ranks * pol.grad_bytes * max(u.params for u in units) if w.routes.cpu_reduces else 0.0
    ckpt = m.checkpoint_bytes_per_token() * w.tokens_per_rank
    host_acts = w.ranks * m.layers * ckpt if pol.activation == "offload" else 0.0
    return MemoryEstimate(
        gpu_weights=weights, gpu_grads=grads, gpu_activations=acts, gpu_loss=loss,
        gpu_reserve=w.hw.gpu.reserve_gib * GIB, gpu_optimizer=optimizer, host_state=state_per_param * params,
        host_buffers=buffers, host_activations=host_acts, params=params,
    )


def memory_shortfalls(mem: MemoryEstimate, gpu_budget: float, host_budget: float) -> list[str]:
    """Human-readable reasons a policy does not fit; empty when it does."""
    problems = []
    if mem.gpu_peak > gpu_budget:
        problems.append(f"GPU peak {gib_text(mem.gpu_peak)} GiB exceeds the budget of {gib_text(gpu_budget)} GiB "
                        f"(weights {mem.gpu_weights / GIB:.1f}, grads {mem.gpu_grads / GIB:.1f}, "
                        f"activations {mem.gpu_activations / GIB:.1f}, loss {mem.gpu_loss / GIB:.1f}, "
                        f"optimizer state {mem.gpu_optimizer / GIB:.1f}, "
                        f"reserve {mem.gpu_reserve / GIB:.1f})")
    if mem.host_total > host_budget:
        problems.append(f"host memory {gib_text(mem.host_total)} GiB exceeds the limit of {gib_text(host_budget)} GiB")
    return problems
