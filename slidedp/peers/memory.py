"""GPU peak and host bytes of a peer system's step, from the same per-parameter factors its plan moves.

Unlike SlideDP's model (slidedp.model.memory), which sums every buffer, a peer's peak is the larger of two
moments, because its gradients and activations are never all alive at once: the end of forward (state, every
layer's checkpoint, one layer's working set, the loss chunk, the gathered layers and, with autocast, the bf16
copies of every fp32 weight it caches until forward ends) and the end of backward (state plus every gradient a
GPU-resident system keeps, or the gradient buffers in flight to the host, plus the fp32 gradient of a tied
embedding accumulated from the lookup and the head). Activations and the loss chunk are counted as for SlideDP
(``activation_bytes``, ``loss_bytes``), since every peer recomputes per layer with the same chunked loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from slidedp.hardware import GIB
from slidedp.model.memory import activation_bytes, loss_bytes
from slidedp.peers.step import PEER_WINDOW, PeerStep


@dataclass(frozen=True)
class PeerMemory:
    """Bytes per GPU (state all step, extra at the end of forward and of backward, reserve) and host bytes."""

    gpu_state: float
    gpu_forward: float
    gpu_backward: float
    gpu_reserve: float
    host_state: float
    params: int
    host_overhead: float = 0.0  # what the system holds on the host beyond its state (measured, see PeerSystem)

    @property
    def gpu_peak(self) -> float:
        return self.gpu_state + max(self.gpu_forward, self.gpu_backward) + self.gpu_reserve

    @property
    def gpu_allocated_peak(self) -> float:
        """What torch.cuda.max_memory_allocated reports: the peak without the context and allocator reserve."""
        return self.gpu_peak - self.gpu_reserve

    @property
    def host_total(self) -> float:
        return self.host_state + self.host_overhead

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
            problems.append(f"GPU peak {self.gpu_peak / GIB:.1f} GiB exceeds the budget of {gpu_budget / GIB:.1f} GiB "
                            f"(state {self.gpu_state / GIB:.1f}, end of forward +{self.gpu_forward / GIB:.1f}, "
                            f"end of backward +{self.gpu_backward / GIB:.1f}, reserve {self.gpu_reserve / GIB:.1f})")
        if self.host_total > host_budget:
            problems.append(f"host memory {self.host_total / GIB:.1f} GiB exceeds the limit of "
                            f"{host_budget / GIB:.1f} GiB")
        return problems


def estimate_peer_memory(step: PeerStep) -> PeerMemory:
    s, w = step.system, step.w
    m, units = w.model, w.units
    total = m.total_params
    shard = step.n if s.gpu_state_sharded else 1
    state = (s.gpu_weight_bytes + s.gpu_moment_bytes) * total / shard
    largest = max(u.params for u in units)
    window = PEER_WINDOW * largest
    # Gathered layers: each rank's fp32/bf16 shard copied in plus the unsharded bf16 weights it computes with.
    gathered = window * (s.fetch_h2d_bytes / step.n + s.gathered_bytes) if (s.shards_weights or s.fetch_h2d_bytes) \
        else 0.0
    cache = 2 * total if s.autocast_cache else 0.0
    forward = activation_bytes(w) + loss_bytes(w) + gathered + cache
    tied = 4 * m.embedding_params if m.tied_embeddings else 0.0
    if s.offloads_gradients:
        # bf16 gradients of the layers in flight, their reduced fp32 copy before the D2H, a bf16 bucket where used.
        buffers = window * (2 + s.grad_collective_bytes) + 2 * s.grad_bucket_params
    else:
        buffers = s.gpu_grad_bytes * total / shard + window * 2
    backward = buffers + tied + (gathered if s.refetch_in_backward else 0.0)
    return PeerMemory(gpu_state=state, gpu_forward=forward, gpu_backward=backward,
                      gpu_reserve=w.hw.gpu.reserve_gib * GIB, host_state=s.host_state_bytes * total, params=total,
                      host_overhead=s.host_overhead_bytes * total)
