"""One training step broken into streamed units and their costs, shared by the model and the simulator.

Both the analytical model and the discrete-event simulator consume a :class:`StepWorkload`, so they agree
on every byte and FLOP by construction; the conservation tests rely on that.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from slidedp.errors import SlideDPError
from slidedp.hardware import GB, GPUSpec, HardwareProfile
from slidedp.model_spec import BF16_BYTES, ModelSpec
from slidedp.policy import Policy

# DRAM bytes per parameter of the CPU passes (fp32 master, m and v are 4 bytes each).
ADAM_HOST_BYTES_BASE = 24  # read p, m, v + write p, m, v; the gradient read is added per dtype
CAST_HOST_BYTES = 6  # read fp32 master, write bf16 copy for the next step's H2D
# The one-pass kernel: read p, m, v + bf16 grad, write p, m, v + bf16 weights.
FUSED_ADAM_HOST_BYTES = ADAM_HOST_BYTES_BASE + 2 + 2

# Trace op names, grouped by the resource category exposure is attributed to.
OP_CATEGORY: dict[str, str] = {
    "h2d_param": "h2d", "h2d_ckpt": "h2d",
    "d2h_grad": "d2h", "d2h_ckpt": "d2h",
    "allgather": "collective", "reduce_scatter": "collective", "allreduce": "collective",
    "cpu_reduce": "cpu", "adam": "cpu", "cast": "cpu",
    "fwd": "compute", "bwd": "compute", "gpu_adam": "compute",
}
EXPOSURE_CATEGORIES: tuple[str, ...] = ("h2d", "d2h", "collective", "cpu", "bubble")


@dataclass(frozen=True)
class Unit:
    """A block streamed as a whole: the embedding, one decoder layer, or final norm + lm_head.

    Times and FLOPs are per rank for the whole step (all micro-batches), because layers are streamed
    once per step in layer-major order.
    """

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


def resource_capacities(hw: HardwareProfile) -> dict[str, float]:
    """Bytes/s of every shared resource a flow can cross: its name is what bottleneck reports show."""
    caps: dict[str, float] = {"hostmem": hw.host.mem_bw_gbps * GB}
    for g in range(hw.num_gpus):
        caps[f"h2d[{g}]"] = hw.gpu.h2d_gbps * GB
        caps[f"d2h[{g}]"] = hw.gpu.d2h_gbps * GB
        caps[f"pcie[{g}]"] = hw.gpu.duplex_gbps * GB
        if hw.link.kind == "nvlink":
            caps[f"link[{g}]"] = hw.link.bw_gbps * GB
    for s, sw in enumerate(hw.switches):
        caps[f"uplink_h2d[{s}]"] = sw.uplink_gbps * GB
        caps[f"uplink_d2h[{s}]"] = sw.uplink_gbps * GB
    return caps


def dma_usage(hw: HardwareProfile, gpu: int, direction: str) -> dict[str, float]:
    """Resources one byte of a host<->GPU copy crosses."""
    usage = {f"{direction}[{gpu}]": 1.0, f"pcie[{gpu}]": 1.0, "hostmem": 1.0}
    sw = hw.switch_of(gpu)
    if sw is not None:
        usage[f"uplink_{direction}[{sw}]"] = 1.0
    return usage


def collective_usage(hw: HardwareProfile, gpu: int) -> dict[str, float]:
    """Resources one byte a rank sends in a ring collective crosses.

    Over NVLink only the GPU's link. Without peer access NCCL stages through host memory: every byte
    goes down one PCIe link and up another and is written and read in DRAM.
    """
    if hw.link.kind == "nvlink":
        return {f"link[{gpu}]": 1.0}
    usage = {f"h2d[{gpu}]": 1.0, f"d2h[{gpu}]": 1.0, f"pcie[{gpu}]": 2.0, "hostmem": 2.0}
    sw = hw.switch_of(gpu)
    if sw is not None:
        usage[f"uplink_h2d[{sw}]"] = 1.0
        usage[f"uplink_d2h[{sw}]"] = 1.0
    return usage


def build_units(m: ModelSpec, gpu: GPUSpec, activation: str, micro_batch: int, accumulation: int,
                seq: int) -> tuple[Unit, ...]:
    """Streamed units with per-rank step times and FLOPs for one micro-batching and activation policy.

    Separate from StepWorkload so a tuner can reuse units across policies that share these inputs.
    """
    accum, mb_tokens = accumulation, seq * micro_batch
    tokens_per_rank = mb_tokens * accumulation
    overhead = gpu.layer_overhead_us * 1e-6
    recompute = activation in ("recompute", "offload")

    lin = m.layer_linear_flops_per_token() * mb_tokens
    attn = m.layer_attention_flops_per_token(seq) * mb_tokens
    layer_fwd_s = gpu.linear_time(lin, mb_tokens) + gpu.attention_time(attn) + overhead
    layer_fwd_flops = (lin + attn) * accum
    bwd_pass_s = (gpu.backward_linear_ratio * gpu.linear_time(lin, mb_tokens)
                  + gpu.backward_attention_ratio * gpu.attention_time(attn) + overhead)
    layer_bwd_s = (bwd_pass_s + (layer_fwd_s if recompute else 0.0)) * accum
    layer_bwd_flops = (2 + (1 if recompute else 0)) * (lin + attn) * accum
    ckpt = (m.checkpoint_bytes_per_token() * tokens_per_rank) if activation == "offload" else 0.0

    head_lin = m.head_flops_per_token() * mb_tokens
    head_fwd_s = gpu.linear_time(head_lin, mb_tokens) + overhead
    head_bwd_s = (gpu.backward_linear_ratio * gpu.linear_time(head_lin, mb_tokens) + overhead + head_fwd_s) * accum

    units = [Unit(0, "embed", "embed", m.embedding_params, 0.0, overhead * accum, 0.0, overhead * accum, 0.0)]
    for i in range(m.layers):
        units.append(Unit(i + 1, f"layer{i}", "layer", m.layer_params, layer_fwd_flops, layer_fwd_s * accum,
                          layer_bwd_flops, layer_bwd_s, ckpt))
    # The chunked loss recomputes each logits chunk in backward, so the head always pays 3x fwd + 1 fwd.
    units.append(Unit(m.layers + 1, "head", "head", m.head_params, head_lin * accum, head_fwd_s * accum,
                      3 * head_lin * accum, head_bwd_s, 0.0))
    if m.tied_embeddings:
        # The head multiplies by the embedding matrix, so that matrix stays on the GPU all step and
        # its gradient (lookup + head) leaves once, after the embedding's backward.
        units[0] = Unit(0, "embed", "embed", m.embedding_params, 0.0, overhead * accum, 0.0,
                        overhead * accum, 0.0, pinned=True)
    return tuple(units)



def resident_in_backward(units: tuple[Unit, ...], prefetch_depth: int,
                         gpu_state_units: int = 0) -> tuple[bool, ...]:
    """Per unit, whether it is still on the GPU when backward starts (the last prefetch window, pinned, or
    one of the leading units whose state lives on the GPU), so its backward needs no re-fetch: the
    simulator's schedule and the runtime both follow this."""
    first = len(units) - prefetch_depth
    return tuple(u >= first or u < gpu_state_units or unit.pinned for u, unit in enumerate(units))


class StepWorkload:
    """Model x hardware x policy x (seq, global batch): every quantity one step moves or computes."""

    def __init__(self, model: ModelSpec, hw: HardwareProfile, policy: Policy, seq: int, global_batch: int,
                 units: tuple[Unit, ...] | None = None):
        if not isinstance(seq, int) or seq < 1:
            raise SlideDPError(f"sequence length must be a positive integer, got {seq!r}")
        if not isinstance(global_batch, int) or global_batch < 1:
            raise SlideDPError(f"batch must be a positive integer, got {global_batch!r}")
        n = hw.num_gpus
        if global_batch != n * policy.sequences_per_rank():
            raise SlideDPError(
                f"batch {global_batch} != GPUs {n} x micro_batch {policy.micro_batch} x accumulation "
                f"{policy.accumulation} = {n * policy.sequences_per_rank()}")
        if policy.gpu_state_units > model.layers + 2:
            raise SlideDPError(f"policy.gpu_state_units {policy.gpu_state_units} exceeds the model's "
                               f"{model.layers + 2} units (embedding, {model.layers} layers, head)")
        threads = self._adam_threads(hw, policy)
        if threads * n > hw.host.cores:
            raise SlideDPError(f"policy.adam_threads {threads} x {n} ranks exceeds the host's {hw.host.cores} cores")
        self.model, self.hw, self.policy = model, hw, policy
        self.seq, self.global_batch, self.ranks = seq, global_batch, n
        self.chunks = policy.chunks_per_layer
        self.adam_threads = threads
        self.tokens_per_rank = seq * policy.sequences_per_rank()
        self.tokens_per_micro_batch = seq * policy.micro_batch
        if units is not None:  # precomputed by build_units for the same model, GPU, activation and batching
            self.__dict__["units"] = units

    @staticmethod
    def _adam_threads(hw: HardwareProfile, policy: Policy) -> int:
        if policy.adam_threads is not None:
            return policy.adam_threads
        return max(1, hw.host.cores // hw.num_gpus)

    # ---- units ----------------------------------------------------------------------------------------------
    @cached_property
    def units(self) -> tuple[Unit, ...]:
        pol = self.policy
        return build_units(self.model, self.hw.gpu, pol.activation, pol.micro_batch, pol.accumulation, self.seq)

    @property
    def num_units(self) -> int:
        return len(self.units)

    @cached_property
    def _resident(self) -> tuple[bool, ...]:
        return resident_in_backward(self.units, self.policy.prefetch_depth, self.policy.gpu_state_units)

    def gpu_state(self, u: int) -> bool:
        """Unit ``u`` keeps its optimizer state on the GPU: nothing of it crosses PCIe or touches the CPU."""
        return u < self.policy.gpu_state_units

    def host_updated_params(self) -> int:
        """Parameters whose update runs on the CPU (every unit not held on the GPU)."""
        return sum(unit.params for u, unit in enumerate(self.units) if not self.gpu_state(u))

    def gpu_adam_s(self, u: int) -> float:
        """Seconds of the GPU-side AdamW (clip, update, bf16 copy) of a GPU-state unit."""
        return self.units[u].params / (self.hw.gpu.adam_gparams_per_s * 1e9) if self.gpu_state(u) else 0.0

    def allreduce_bytes(self, u: int) -> float:
        """Per-rank ring all-reduce bytes of a GPU-state unit's fp32 gradient (every rank keeps a replica)."""
        if not self.gpu_state(u) or self.ranks == 1:
            return 0.0
        return 2 * (self.ranks - 1) / self.ranks * 4 * self.units[u].params

    def resident_in_backward(self, u: int) -> bool:
        """The last ``prefetch_depth`` units of the forward are still on the GPU when backward starts."""
        return self._resident[u]

    def offloads_checkpoint(self, u: int) -> bool:
        return self.units[u].checkpoint_bytes > 0 and not self.resident_in_backward(u)

    # ---- traffic per rank, as bytes per parameter of a unit ----------------------------------------------
    @cached_property
    def h2d_param_factor(self) -> float:
        return BF16_BYTES / self.ranks if self.policy.param_route == "sharded" else float(BF16_BYTES)

    @cached_property
    def allgather_factor(self) -> float:
        if self.policy.param_route != "sharded" or self.ranks == 1:
            return 0.0
        return (self.ranks - 1) / self.ranks * BF16_BYTES

    @cached_property
    def d2h_grad_factor(self) -> float:
        g = float(self.policy.grad_bytes)
        return g / self.ranks if self.policy.grad_route == "reduce_scatter" else g

    @cached_property
    def reduce_scatter_factor(self) -> float:
        if self.policy.grad_route != "reduce_scatter" or self.ranks == 1:
            return 0.0
        return (self.ranks - 1) / self.ranks * self.policy.grad_bytes

    # ---- per-chunk traffic (per rank) -------------------------------------------------------------------
    def h2d_param_bytes(self, u: int) -> float:
        return self.h2d_param_factor * self.units[u].params / self.chunks

    def allgather_bytes(self, u: int) -> float:
        return self.allgather_factor * self.units[u].params / self.chunks

    def d2h_grad_bytes(self, u: int) -> float:
        return self.d2h_grad_factor * self.units[u].params / self.chunks

    def reduce_scatter_bytes(self, u: int) -> float:
        return self.reduce_scatter_factor * self.units[u].params / self.chunks

    # ---- CPU update jobs --------------------------------------------------------------------------------
    def update_owners(self, u: int, c: int) -> tuple[tuple[int, float], ...]:
        """(rank, params) pairs whose optimizer worker updates chunk ``c`` of unit ``u``.

        Reduce-scatter gives every rank a 1/N shard of each chunk; per-rank gradients are summed by one
        owner per chunk, chosen round-robin so the CPU work is spread evenly.
        """
        params = self.units[u].params / self.chunks
        if self.policy.grad_route == "reduce_scatter":
            return tuple((r, params / self.ranks) for r in range(self.ranks))
        return (((u * self.chunks + c) % self.ranks, params),)

    def needs_cpu_reduce(self) -> bool:
        return self.policy.grad_route == "per_rank" and self.ranks > 1

    def cpu_reduce_host_bytes(self, params: float) -> float:
        """Read N gradient copies and write their sum."""
        return (self.ranks + 1) * self.policy.grad_bytes * params

    @cached_property
    def adam_bytes_per_param(self) -> float:
        fused_write = BF16_BYTES if self.hw.host.fused_cast else 0  # FUSED_ADAM_HOST_BYTES with bf16 grads
        return ADAM_HOST_BYTES_BASE + self.policy.grad_bytes + fused_write

    def adam_host_bytes(self, params: float) -> float:
        return self.adam_bytes_per_param * params

    def cast_host_bytes(self, params: float) -> float:
        """Zero when the optimizer kernel writes the bf16 copy itself (``HostSpec.fused_cast``)."""
        return 0.0 if self.hw.host.fused_cast else CAST_HOST_BYTES * params

    # CPU passes are flows over DRAM capped by the worker's compute rate, expressed in DRAM bytes/s.
    def cpu_reduce_cap(self) -> float:
        return self.hw.host.stream_rate(self.adam_threads)

    def adam_cap(self) -> float:
        return self.hw.host.adam_rate(self.adam_threads) * self.adam_bytes_per_param

    def cast_cap(self) -> float:
        return self.hw.host.cast_rate(self.adam_threads) * CAST_HOST_BYTES

    def collective_cap(self) -> float:
        return self.hw.link.bw_gbps * GB

    # ---- latencies ---------------------------------------------------------------------------------------
    @property
    def pcie_latency(self) -> float:
        return self.hw.gpu.pcie_latency_us * 1e-6

    @property
    def link_latency(self) -> float:
        return self.hw.link.latency_us * 1e-6

    # ---- totals ------------------------------------------------------------------------------------------
    @property
    def tokens_per_step(self) -> int:
        return self.seq * self.global_batch

    def model_flops_per_step(self) -> float:
        """Useful FLOPs (fwd + bwd, no recompute) for the whole step: the TFLOPS numerator."""
        return self.model.train_flops_per_token(self.seq) * self.tokens_per_step
