"""One peer system's step on a concrete model, machine and batch: per-unit bytes and the step's closed-form totals.

Both come from the same :class:`~slidedp.peers.systems.PeerSystem` factors: the plan builder asks for one unit's
bytes, the conservation tests compare the simulated trace with :meth:`PeerStep.closed_form_totals`, which
multiplies the factors by whole-model parameter counts without walking the units.

The compute is SlideDP's own operations: :func:`system_workload` builds the :class:`~slidedp.workload.StepWorkload`
a peer runs (activation recompute per decoder layer, one micro-batch per rank step, the same chunked loss, the
system's attention kernel and numerics), whose ``units`` carry the compute times and FLOPs, recompute included.
"""

from __future__ import annotations

from functools import cached_property

from slidedp.compute import BF16, Elementwise, gpu_optimizer_op
from slidedp.errors import SlideDPError
from slidedp.hardware import GPUSpec, HardwareProfile
from slidedp.model_spec import ModelSpec
from slidedp.peers.systems import PeerSystem
from slidedp.policy import Policy
from slidedp.resources import ADAM_HOST_BYTES_BASE, CAST_HOST_BYTES, collective_usage
from slidedp.workload import StepWorkload

# The units the peers keep gathered from forward to backward: FSDP2's root group (embedding, final norm, head)
# is not resharded after forward, and the head runs first in backward, right after the forward ended.
ROOT_KINDS: tuple[str, ...] = ("embed", "head")
# Layers whose gathered weights (and gradients in flight) a rank holds at once: the computing one and the next.
PEER_WINDOW = 2
# The trace op of a serial gradient offload's GPU passes and host reads (PeerSystem.serial_grad_copy).
GRAD_SYNC_OP = "grad_sync"


def unit_tensors(model: ModelSpec, kind: str) -> int:
    """Parameter tensors of one unit: a decoder layer's, the embedding's one, the final norm and, untied, lm_head."""
    if kind == "layer":
        return model.layer_tensors
    if kind == "head":
        return 1 if model.tied_embeddings else 2
    return 1


def gpu_memory_pass_seconds(gpu: GPUSpec, nbytes: float, kernels: float, op: str = GRAD_SYNC_OP) -> float:
    """Memory-bound GPU passes moving ``nbytes`` through HBM in ``kernels`` launches inside a step (``kernels`` may
    be fractional: a rank's share of passes split over ranks), priced as the compute model prices its operations
    (their step_factor included); a profile without compute curves has only its GPU update rate to give a bandwidth
    (GPUSpec.update_rate_seconds)."""
    if gpu.compute is not None:
        return gpu.compute.seconds(Elementwise(op, nbytes, kernels))
    return gpu.update_rate_seconds(nbytes)


def peer_policy(per_rank_batch: int) -> Policy:
    """How every measured peer runs a step: gradient checkpointing per decoder layer, the whole per-rank batch in
    one micro-batch, no accumulation (the routes and chunking fields are SlideDP's and unused here)."""
    return Policy(activation="recompute", micro_batch=per_rank_batch, accumulation=1, chunks_per_layer=1,
                  prefetch_depth=PEER_WINDOW)


def peer_workload(model: ModelSpec, hw: HardwareProfile, seq: int, batch: int,
                  attention: str = "sdpa", precision: str = BF16) -> StepWorkload:
    """The workload a peer runs on ``hw``'s GPUs at global ``batch`` (which the GPU count must divide), with its
    attention kernel and numerics (PeerSystem.attention, PeerSystem.precision; system_workload passes both)."""
    if batch % hw.num_gpus:
        raise SlideDPError(f"batch {batch} is not divisible by the {hw.num_gpus} GPU(s)")
    return StepWorkload(model, hw, peer_policy(batch // hw.num_gpus), seq, batch, attention=attention,
                        precision=precision)


def system_workload(system: PeerSystem, model: ModelSpec, hw: HardwareProfile, seq: int, batch: int) -> StepWorkload:
    """The workload ``system`` runs: peer_workload with the system's attention kernel and numerics."""
    return peer_workload(model, hw, seq, batch, system.attention, system.precision)


class PeerStep:
    """``system`` running workload ``w``: bytes per unit per rank and the step's totals."""

    def __init__(self, system: PeerSystem, w: StepWorkload):
        if system.single_gpu and w.ranks > 1:
            raise SlideDPError(f"{system.name} is modelled on one GPU only, not {w.ranks}")
        if w.attention != system.attention:
            raise ValueError(f"{system.name} runs {system.attention} attention; the workload prices {w.attention} "
                             f"(system_workload)")
        if w.precision != system.precision:
            raise ValueError(f"{system.name} computes in {system.precision}; the workload prices {w.precision} "
                             f"(system_workload)")
        self.system, self.w = system, w
        self.n = w.ranks

    @property
    def fetch_window(self) -> int:
        """Layers a rank holds fetched at once: the computing one and the next (PEER_WINDOW), or only the computing
        one where the system's copy cannot overlap a pass (PeerSystem.fetch_overlaps_passes): a layer's fetch waits
        for the pass this many layers before it, in the plan and in the memory model alike."""
        return PEER_WINDOW if self.system.fetch_overlaps_passes else 1

    # ---- which units move --------------------------------------------------------------------------------
    def fetches(self, u: int, backward: bool) -> bool:
        """Unit ``u`` is fetched (copied from the host and/or gathered) before this pass."""
        s, kind = self.system, self.w.units[u].kind
        if not s.streams_weights or (s.root_on_gpu and kind in ROOT_KINDS):
            return False
        return not backward or (s.refetch_in_backward and kind not in ROOT_KINDS)

    # ---- per unit, per rank ------------------------------------------------------------------------------
    def h2d_fetch_bytes(self, u: int, backward: bool = False) -> float:
        """Bytes one rank copies from the host for unit ``u`` before a pass (every copy of the pass together)."""
        copies = self.system.backward_fetches if backward else 1
        return copies * self.system.fetch_h2d_bytes * self.w.units[u].params / self.n

    def fetch_host_per_byte(self) -> float:
        """DRAM bytes per byte a fetch copies: the DMA's read, plus the fp32 -> bf16 cast that produces it where
        the system casts on fetch (CAST_HOST_BYTES per element of ``fetch_h2d_bytes``)."""
        s = self.system
        return 1.0 + (CAST_HOST_BYTES / s.fetch_h2d_bytes if s.cast_on_fetch else 0.0)

    def fetch_cap(self) -> float:
        """Bytes/s a fetch can copy: the CPU cast that feeds it where the system casts on fetch, else unbounded."""
        if not self.system.cast_on_fetch:
            return float("inf")
        return self.w.hw.host.cast_rate(self.w.adam_threads) * self.system.fetch_h2d_bytes

    def forward_s(self, u: int) -> float:
        """Seconds of unit ``u``'s forward: its compute, or a decoder layer's host floor where the system has one
        and it is longer (PeerSystem.layer_host_floor)."""
        unit, floor = self.w.units[u], self.system.layer_host_floor
        if floor is None or unit.kind != "layer":
            return unit.fwd_s
        return max(unit.fwd_s, floor.forward(unit.params))

    def backward_s(self, u: int) -> tuple[float, float]:
        """Seconds and FLOPs of unit ``u``'s backward, with the extra forwards a decoder layer reruns, or a decoder
        layer's host floor where the system has one and it is longer."""
        unit, floor = self.w.units[u], self.system.layer_host_floor
        extra = self.system.backward_extra_forwards if unit.kind == "layer" else 0
        seconds = unit.bwd_s + extra * unit.fwd_s
        if floor is not None and unit.kind == "layer":
            seconds = max(seconds, floor.backward(unit.params))
        return seconds, unit.bwd_flops + extra * unit.fwd_flops

    def checkpoint_bytes(self, u: int) -> float:
        """Bytes of unit ``u``'s checkpoint a rank copies to the host after forward (and back before backward)."""
        if not (self.system.checkpoints_on_host and self.w.units[u].kind == "layer"):
            return 0.0
        return self.w.model.checkpoint_bytes_per_token() * self.w.tokens_per_rank

    def allgather_bytes(self, u: int) -> float:
        return self._gather_factor(self.system.gathered_bytes) * self.w.units[u].params

    def grad_collective_bytes(self, u: int) -> float:
        return self._grad_collective_factor * self.w.units[u].params

    def d2h_grad_bytes(self, u: int) -> float:
        return self.system.grad_d2h_bytes * self.w.units[u].params / self.n

    def grad_staging_bytes(self, u: int) -> float:
        """Bytes of unit ``u``'s gradient partition one rank copies to the host and back before its
        ``d2h_grad_bytes`` copy (PeerSystem.grad_staging_bytes)."""
        return self.system.grad_staging_bytes * self.w.units[u].params / self.n

    def unit_adam_bytes(self, u: int) -> float:
        """DRAM bytes of unit ``u``'s update where the system updates per unit (one GPU: its whole unit)."""
        return self.adam_bytes_per_param * self.w.units[u].params

    # ---- per rank, after backward ----------------------------------------------------------------------------
    @property
    def params_per_rank(self) -> float:
        """Parameters whose optimizer state one rank updates: its 1/N partition, or all of them when replicated."""
        s = self.system
        replicated = not s.updates_on_cpu and not s.gpu_state_sharded
        return self.w.model.total_params / (1 if replicated else self.n)

    @property
    def adam_bytes_per_param(self) -> float:
        """DRAM bytes of one parameter's CPU AdamW: read p, m, v and the gradient, write p, m, v (p in
        ``master_bytes``; ADAM_HOST_BYTES_BASE counts an fp32 p)."""
        s = self.system
        return ADAM_HOST_BYTES_BASE - 2 * (4 - s.master_bytes) + s.grad_d2h_bytes

    @property
    def root_params(self) -> int:
        """Parameters of the embedding, final norm and head (the units outside the decoder layers)."""
        m = self.w.model
        return m.total_params - m.layers * m.layer_params

    @property
    def cast_params(self) -> float:
        """Parameters the pass after the update covers: those the GPU streams from a host copy."""
        return self.params_per_rank - (self.root_params if self.system.root_on_gpu else 0)

    @property
    def writeback_params(self) -> float:
        """Parameters copied back to the GPUs after the update: the GPU-resident root units, or all of them."""
        return self.root_params if self.system.writeback_root_only else self.params_per_rank

    def clip_host_bytes(self) -> float:
        return self.system.clip_host_bytes * self.params_per_rank

    def adam_host_bytes(self) -> float:
        return self.adam_bytes_per_param * self.params_per_rank if self.system.updates_on_cpu else 0.0

    def cast_host_bytes(self) -> float:
        return self.system.cast_bytes * self.cast_params if self.system.cast_after_step else 0.0

    def writeback_h2d_bytes(self) -> float:
        return self.system.writeback_h2d_bytes * self.writeback_params

    def writeback_allgather_bytes(self) -> float:
        return self._gather_factor(self.system.writeback_h2d_bytes) * self.w.model.total_params

    # ---- rates (bytes/s of DRAM for the CPU passes, as SlideDP's own CPU ops) --------------------------------
    def clip_cap(self) -> float:
        """DRAM bytes/s of the clip passes: the system's measured clip rate, else the host's streaming rate."""
        host, clip = self.w.hw.host, self.system.cpu_clip
        if clip is None:
            return host.stream_rate(self.w.adam_threads)
        return host.peer_adam_rate(clip, self.w.adam_threads) * self.system.clip_host_bytes

    def adam_cap(self) -> float:
        """The peer's measured CPU AdamW rate; refuses (SlideDPError) where the profile lacks it."""
        return self.w.hw.host.peer_adam_rate(self.system.cpu_adam, self.w.adam_threads) * self.adam_bytes_per_param

    def cast_cap(self) -> float:
        return self.w.hw.host.cast_rate(self.w.adam_threads) * self.system.cast_bytes

    def gpu_adam_s(self) -> float:
        """Seconds of the GPU-resident optimizer step after backward: the global-norm clip and fused AdamW over
        the rank's fp32 state (slidedp.compute.gpu_optimizer_op), priced as SlideDP's own GPU-held update is
        (GPUSpec.optimizer_pass_seconds)."""
        if self.system.updates_on_cpu:
            return 0.0
        return self.w.hw.gpu.optimizer_pass_seconds(gpu_optimizer_op(self.params_per_rank))

    # ---- the gradient offload in series with backward (PeerSystem.serial_grad_copy) ---------------------------
    def grad_sync_s(self, u: int) -> float:
        """Seconds one rank's backward stands still for unit ``u``'s gradient passes and host reads (0 where the
        system's copies overlap the compute); the D2H copy itself is the plan's d2h_grad op."""
        unit = self.w.units[u]
        return self._grad_sync_seconds(unit.params, unit_tensors(self.w.model, unit.kind))

    def _grad_sync_seconds(self, params: float, tensors: float) -> float:
        """Linear in parameters and tensors, so the closed form applies it once to the whole model's counts."""
        sync = self.system.serial_grad_copy
        if sync is None:
            return 0.0
        nbytes = (sync.bucket_bytes + sync.partition_bytes / self.n) * params
        kernels = (sync.bucket_kernels + sync.partition_kernels / self.n) * tensors
        return (gpu_memory_pass_seconds(self.w.hw.gpu, nbytes, kernels)
                + sync.host_reads * tensors / self.n * self.w.pcie_latency)

    def grad_sync_total_s(self) -> float:
        """Closed form of one rank's grad_sync seconds over the step, from whole-model counts."""
        m = self.w.model
        tensors = m.layers * unit_tensors(m, "layer") + unit_tensors(m, "embed") + unit_tensors(m, "head")
        return self._grad_sync_seconds(m.total_params, tensors)

    def check_rates(self) -> None:
        """Refuse before anything is simulated when the peer's CPU optimizer rate is not in the profile."""
        if self.system.updates_on_cpu:
            self.adam_cap()
            self.clip_cap()

    # ---- factors ---------------------------------------------------------------------------------------------
    def _gather_factor(self, nbytes: int) -> float:
        return (self.n - 1) / self.n * nbytes

    @cached_property
    def _grad_collective_factor(self) -> float:
        s = self.system
        ring = (self.n - 1) / self.n * s.grad_collective_bytes
        return s.grad_ring_passes * ring

    # ---- closed form -----------------------------------------------------------------------------------------
    def closed_form_totals(self) -> dict[str, dict[str, float]]:
        """Per trace op: bytes, host bytes and FLOPs summed over ranks for the whole step, from the factors and
        whole-model parameter counts (the conservation tests hold the simulated trace to these); for the serial
        gradient offload's passes also their seconds."""
        s, w, n, m = self.system, self.w, self.n, self.w.model
        total = m.total_params
        refetched = m.layers * m.layer_params * s.backward_fetches if s.refetch_in_backward else 0
        fetched = total - (self.root_params if s.root_on_gpu else 0) + refetched
        layer_fwd_flops = sum(u.fwd_flops for u in w.units if u.kind == "layer")
        out: dict[str, dict[str, float]] = {
            "fwd": {"bytes": 0.0, "host_bytes": 0.0, "flops": n * sum(u.fwd_flops for u in w.units)},
            "bwd": {"bytes": 0.0, "host_bytes": 0.0, "flops": n * (sum(u.bwd_flops for u in w.units)
                                                                   + s.backward_extra_forwards * layer_fwd_flops)},
        }
        fetch = s.fetch_h2d_bytes * fetched
        writeback = s.writeback_h2d_bytes * n * self.writeback_params
        if fetch + writeback:
            host = fetch * self.fetch_host_per_byte() + writeback
            out["h2d_param"] = {"bytes": fetch + writeback, "host_bytes": host, "flops": 0.0}
        if s.checkpoints_on_host:
            ckpt = n * m.layers * m.checkpoint_bytes_per_token() * w.tokens_per_rank
            out["d2h_ckpt"] = {"bytes": ckpt, "host_bytes": ckpt, "flops": 0.0}
            out["h2d_ckpt"] = {"bytes": ckpt, "host_bytes": ckpt, "flops": 0.0}
        gather = n * (self._gather_factor(s.gathered_bytes) * fetched
                      + self._gather_factor(s.writeback_h2d_bytes) * total)
        if gather:
            out["allgather"] = _link_totals(w, gather)
        collective = n * self._grad_collective_factor * total
        if collective:
            out[s.grad_op] = _link_totals(w, collective)
        if s.grad_d2h_bytes:
            d2h = (s.grad_d2h_bytes + s.grad_staging_bytes) * total
            out["d2h_grad"] = {"bytes": d2h, "host_bytes": d2h, "flops": 0.0}
        if s.grad_staging_bytes:
            staged = s.grad_staging_bytes * total
            out["h2d_grad"] = {"bytes": staged, "host_bytes": staged, "flops": 0.0}
        if s.serial_grad_copy is not None:  # fixed-duration GPU passes: seconds, no flow bytes
            out[GRAD_SYNC_OP] = {"bytes": 0.0, "host_bytes": 0.0, "flops": 0.0, "seconds": n * self.grad_sync_total_s()}
        cpu = {"clip": s.clip_host_bytes * total,
               "adam": self.adam_bytes_per_param * total if s.updates_on_cpu else 0.0,
               "cast": s.cast_bytes * n * self.cast_params if s.cast_after_step else 0.0}
        for op, nbytes in cpu.items():
            if nbytes:
                out[op] = {"bytes": nbytes, "host_bytes": nbytes, "flops": 0.0}
        if not s.updates_on_cpu:
            out["gpu_adam"] = {"bytes": 0.0, "host_bytes": 0.0, "flops": 0.0}
        return out


def _link_totals(w: StepWorkload, nbytes: float) -> dict[str, float]:
    """A collective's bytes; without peer access (``link.kind == host``) each byte also crosses host DRAM twice."""
    return {"bytes": nbytes, "host_bytes": nbytes * collective_usage(w.hw, 0).get("hostmem", 0.0), "flops": 0.0}
