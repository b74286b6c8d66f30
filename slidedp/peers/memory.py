"""GPU peak and host bytes of a peer system's step, from the same per-parameter factors its plan moves.

Unlike SlideDP's model (slidedp.model.memory), which sums every buffer, a peer's peak is the larger of two moments,
because its gradients and activations are never all alive at once: the end of forward (state, every layer's
checkpoint, one layer's working set, the loss chunk, the gathered layers and, with autocast, the bf16 copies of
every fp32 weight it caches until forward ends) and the end of backward (state plus every gradient a GPU-resident
system keeps, or the gradient buffers in flight to the host, plus the fp32 gradient of a tied embedding accumulated
from the lookup and the head). What the card must hold adds the caching allocator's fragmentation
(``PeerSystem.allocator_fragmentation``, measured for GPU-resident DDP) and the profile's reserve. Activations and
the loss chunk are counted as for SlideDP (``activation_bytes``, ``loss_bytes``), since every peer recomputes per
layer with the same chunked loss, except where a system's spec says otherwise: checkpoints kept on the host
(SlideFormer: the prefetch window's on the GPU), checkpoints every ``checkpoint_interval`` layers with that many
recomputed inputs cached (MegaTrain), a loss that keeps every chunk's bf16 log-probabilities until backward
(MegaTrain), preallocated layer buffers sized for the largest streamed unit (``gpu_buffer_bytes``), root units
resident on the GPU in bf16 (MegaTrain) and host bytes that grow with the batch (pinned checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass

from slidedp.hardware import GIB, gib_text
from slidedp.model.memory import LOGITS_BYTES_PER_ELEMENT, activation_bytes, loss_bytes
from slidedp.peers.step import PEER_WINDOW, ROOT_KINDS, PeerStep


@dataclass(frozen=True)
class PeerMemory:
    """Bytes per GPU (state all step, extra at the end of forward and of backward, the allocator's fragmentation,
    reserve) and host bytes."""

    gpu_state: float
    gpu_forward: float
    gpu_backward: float
    gpu_reserve: float
    host_state: float
    params: int
    host_overhead: float = 0.0  # what the system holds on the host beyond its state (measured, see PeerSystem)
    host_buffers: float = 0.0  # host bytes that depend on the batch or the largest unit (pinned checkpoints, staging)
    fragmentation: float = 0.0  # the allocator's bytes beyond the allocated peak per transient byte (PeerSystem)

    @property
    def gpu_transient(self) -> float:
        """Bytes allocated and freed again within each step: the larger of the two moments beyond the state."""
        return max(self.gpu_forward, self.gpu_backward)

    @property
    def gpu_fragmentation(self) -> float:
        """What the caching allocator needs beyond the allocated peak to run the step (PeerSystem's factor)."""
        return self.fragmentation * self.gpu_transient

    @property
    def gpu_peak(self) -> float:
        """What the card must hold: the allocator's reserved peak and the profile's reserve."""
        return self.gpu_reserved_peak + self.gpu_reserve

    @property
    def gpu_reserved_peak(self) -> float:
        """What torch.cuda.max_memory_reserved reports: the allocated peak and the allocator's fragmentation."""
        return self.gpu_allocated_peak + self.gpu_fragmentation

    @property
    def gpu_allocated_peak(self) -> float:
        """What torch.cuda.max_memory_allocated reports: the state and the larger transient moment."""
        return self.gpu_state + self.gpu_transient

    @property
    def host_total(self) -> float:
        return self.host_state + self.host_overhead + self.host_buffers

    @property
    def host_bytes_per_param(self) -> float:
        return self.host_state / self.params

    def gpu_peak_gib(self) -> float:
        return self.gpu_peak / GIB

    def host_total_gib(self) -> float:
        return self.host_total / GIB

    def shortfalls(self, gpu_budget: float, host_budget: float) -> list[str]:
        """Why the step does not fit, one phrase per memory; empty when it does."""
        problems = []
        if self.gpu_peak > gpu_budget:
            problems.append(f"GPU peak {gib_text(self.gpu_peak)} GiB exceeds the budget of {gib_text(gpu_budget)} GiB "
                            f"(state {self.gpu_state / GIB:.1f}, end of forward +{self.gpu_forward / GIB:.1f}, "
                            f"end of backward +{self.gpu_backward / GIB:.1f}, allocator fragmentation "
                            f"+{self.gpu_fragmentation / GIB:.1f}, reserve {self.gpu_reserve / GIB:.1f})")
        if self.host_total > host_budget:
            problems.append(f"host memory {gib_text(self.host_total)} GiB exceeds the limit of "
                            f"{gib_text(host_budget)} GiB")
        return problems


# GPU bytes per attention score that eager attention holds in one layer's recomputed forward + backward: the
# bf16 scores and probabilities and the fp32 softmax output kept for the backward, and the scores' fp32 and bf16
# gradients (HF's eager_attention_forward). SlideFormer's measured peaks on an H100 (2026-12-06, Qwen3-4B, seq
# 4096) grew 8.4 GiB per sequence, 16.8 B per score.
EAGER_SCORE_WORKING_BYTES = 16


def _activations(step: PeerStep) -> float:
    """GPU bytes of activations at the start of backward: the shared per-layer-recompute count, or the system's."""
    s, w = step.system, step.w
    # bf16 checkpoints for every system, also autocast's (PeerSystem.precision AMP_FP32), whose layer inputs are
    # fp32: counted so, the 13 GPU-resident rows with an exact allocated peak erred by 3.3 GiB on average against 1.4
    # with bf16 (benchmarks/RESULTS.md, "Allocator fragmentation", 2026-12-07). Not understood; kept as measured.
    ckpt = w.model.checkpoint_bytes_per_token() * w.tokens_per_rank
    working = w.model.full_activation_bytes_per_token() * w.tokens_per_micro_batch
    # Eager attention: every score of one layer, batch x heads x seq x seq, whichever way activations are kept.
    scores = EAGER_SCORE_WORKING_BYTES * w.policy.micro_batch * w.model.heads * w.seq * w.seq \
        if s.attention == "eager" else 0.0
    if s.checkpoints_on_host:  # the layers whose inputs are on their way out or back in, and one working set
        return (PEER_WINDOW + 1) * ckpt + working + scores
    if s.checkpoint_interval > 1:  # one checkpoint per block, the recomputed inputs of one block, a working set
        blocks = -(-w.model.layers // s.checkpoint_interval)
        return (blocks + 1 + s.checkpoint_interval) * ckpt + working + scores
    return activation_bytes(w) + scores


def _loss(step: PeerStep) -> float:
    """GPU bytes of the loss: the shared chunked-loss count, or every token's bf16 log-probabilities."""
    w = step.w
    s = step.system
    if s.loss_keeps_logits:  # every token's bf16 log-probabilities, one chunk's logits in flight, the hidden states
        chunk = min(s.loss_chunk_tokens, w.tokens_per_micro_batch)
        return (w.tokens_per_micro_batch * 2 + chunk * LOGITS_BYTES_PER_ELEMENT) * w.model.vocab \
            + w.model.checkpoint_bytes_per_token() * w.tokens_per_rank
    return loss_bytes(w)


def estimate_peer_memory(step: PeerStep) -> PeerMemory:
    s, w = step.system, step.w
    m, units = w.model, w.units
    total = m.total_params
    shard = step.n if s.gpu_state_sharded else 1
    state = (s.gpu_weight_bytes + s.gpu_moment_bytes) * total / shard
    if s.root_on_gpu:  # bf16 embedding, final norm and head, all step
        state += 2 * step.root_params
    streamed = [u for u in units if not (s.root_on_gpu and u.kind in ROOT_KINDS)]
    largest = max(u.params for u in streamed)
    window = step.fetch_window * largest
    # Gathered layers: each rank's fp32/bf16 shard copied in plus the unsharded bf16 weights it computes with;
    # or the system's own preallocated buffers, each sized for the largest streamed unit.
    if s.gpu_buffer_bytes:
        gathered = s.gpu_buffer_bytes * largest
    elif s.streams_weights:
        gathered = window * (s.fetch_h2d_bytes / step.n + s.gathered_bytes)
    else:
        gathered = 0.0
    cache = 2 * total if s.autocast_cache else 0.0
    forward = _activations(step) + _loss(step) + gathered + cache
    tied = 4 * m.embedding_params if m.tied_embeddings else 0.0
    if s.gpu_buffer_bytes:  # the system's buffers hold its gradients in flight as well (gpu_buffer_bytes)
        buffers = 0.0
    elif s.offloads_gradients:
        # bf16 gradients of the layers in flight, their reduced fp32 copy before the D2H, a bf16 bucket where used.
        buffers = window * (2 + s.grad_collective_bytes) + 2 * s.grad_bucket_params
    else:
        buffers = s.gpu_grad_bytes * total / shard + window * 2
    backward = buffers + tied + (gathered if s.refetch_in_backward else 0.0)
    host_buffers = 0.0
    if s.checkpoints_on_host:  # every decoder layer's input, pinned
        host_buffers += m.layers * m.checkpoint_bytes_per_token() * w.tokens_per_rank
    if s.cast_on_fetch:  # the bf16 staging buffer and the gradient buffers, each sized for the largest unit
        host_buffers += 2 * (1 + max(s.grad_buffers, 1)) * largest
    return PeerMemory(gpu_state=state, gpu_forward=forward, gpu_backward=backward,
                      gpu_reserve=w.hw.gpu.reserve_gib * GIB, host_state=s.host_state_bytes * total, params=total,
                      host_overhead=s.host_overhead_bytes * total, host_buffers=host_buffers,
                      fragmentation=s.allocator_fragmentation)
