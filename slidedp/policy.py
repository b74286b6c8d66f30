"""How one training step is executed: routes, chunking, prefetch, activations, batching, CPU threads.

A Policy says nothing about the machine or the model; the workload combines the three. The tuner
writes one as YAML and the runtime reads the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from slidedp.config_io import from_mapping, read_mapping, to_mapping, write_mapping
from slidedp.errors import SlideDPError
from slidedp.state_precision import StatePrecision

ParamRoute = Literal["replicated", "sharded"]
GradRoute = Literal["per_rank", "reduce_scatter"]
ActivationPolicy = Literal["keep", "recompute", "offload"]
UpdateSchedule = Literal["next_forward", "as_ready", "after_backward"]
HostLayout = Literal["replicated", "sharded"]

PARAM_ROUTES: tuple[str, ...] = ("replicated", "sharded")
GRAD_ROUTES: tuple[str, ...] = ("per_rank", "reduce_scatter")
ACTIVATION_POLICIES: tuple[str, ...] = ("keep", "recompute", "offload")
UPDATE_SCHEDULES: tuple[str, ...] = ("next_forward", "as_ready", "after_backward")
HOST_LAYOUTS: tuple[str, ...] = ("replicated", "sharded")

# A chunk is one H2D copy and one CPU update call. At 64 a layer, a Qwen3-0.6B layer's chunk is ~0.2M
# parameters (0.4 MB in bf16), where the fixed costs per copy and per call (pcie_latency_us, update_call_us)
# already outweigh the overlap that finer chunks buy; the tuner tries 1-16. Above the bound only the
# simulator's run time grows (1,000 a layer took 47 s and 2.3 GB to simulate one Qwen3-14B step).
MAX_CHUNKS_PER_LAYER = 64


@dataclass(frozen=True)
class Policy:
    """Execution policy for one optimizer step.

    param_route: ``replicated`` = every rank copies each chunk over its own PCIe link;
        ``sharded`` = each rank copies 1/N of the chunk and the ranks all-gather over GPU links,
        so host DRAM is read once per chunk instead of N times.
    grad_route: ``per_rank`` = every rank copies its full gradient chunk to host and the CPU sums
        the N copies; ``reduce_scatter`` = the GPUs reduce-scatter and each rank copies its 1/N shard.
    update_schedule: when the CPU AdamW of a chunk runs. ``next_forward`` (default) updates in
        forward order during the next step's forward, after the global gradient norm is known, so
        clipping is exact and the update overlaps compute; ``as_ready`` updates each chunk as its
        gradient lands (exact only without global clipping); ``after_backward`` waits for the
        whole backward first (ZeRO-Offload's order).
    prefetch_depth: units (layers) a rank holds on the GPU at once, the computing one included.
    micro_batch x accumulation sequences per rank per step; layers are streamed once per step for
        all micro-batches (layer-major order), so accumulation does not multiply PCIe traffic.
    adam_threads: CPU threads of each rank's optimizer worker (None: cores split evenly by rank).
    gpu_state_units: the first k units in forward order (embedding, then decoder layers) keep their
        bf16 weights, fp32 master weights and Adam moments on the GPU and are updated there once the
        global norm is known: no H2D, D2H or CPU AdamW for them. Spare GPU memory thus buys back CPU
        and PCIe time; the host state still holds every parameter (written back at checkpoints), and
        every rank keeps its own replica, all-reducing those units' gradients.
    state: precision of the host optimizer state (slidedp.state_precision): ``fp32`` (exact AdamW, default)
        or a compact ``<master>+<moments>`` mode such as ``fp32+int8`` or ``bf16+int8``. GPU-held units keep
        fp32 state whatever this says.
    seq_tile_tokens: the token-wise parts of a decoder layer (MLP, norms) run over tiles of this many tokens
        of a sequence, recomputed per tile in backward, so a layer's working set is bounded by the tile and
        not by the sequence (0: untiled).
    host_layout: across several hosts, ``replicated`` = every host keeps the whole state and runs the whole
        CPU update (gradients all-reduced across hosts); ``sharded`` = each host keeps master and moments of
        1/H of the parameters (gradients reduce-scattered across hosts, new bf16 weights all-gathered).
        Irrelevant on one host.
    kept_layers: with ``activation: recompute``, the last k decoder layers keep their forward graphs instead
        of recomputing them in backward (k x a layer's activations of GPU memory for k forward passes less
        compute). Where keeping every layer does not fit but memory is left after the checkpoints, this
        spends it on compute, which is what bounds a host-state step at medium batches.
    """

    param_route: ParamRoute = "sharded"
    grad_route: GradRoute = "reduce_scatter"
    chunks_per_layer: int = 4
    prefetch_depth: int = 2
    activation: ActivationPolicy = "recompute"
    micro_batch: int = 1
    accumulation: int = 1
    adam_threads: int | None = None
    grad_dtype: Literal["bf16", "fp32"] = "bf16"
    update_schedule: UpdateSchedule = "next_forward"
    loss_chunk_tokens: int = 4096
    gpu_state_units: int = 0
    state: str = "fp32"
    seq_tile_tokens: int = 0
    host_layout: HostLayout = "replicated"
    kept_layers: int = 0

    def __post_init__(self) -> None:
        for name in ("chunks_per_layer", "prefetch_depth", "micro_batch", "accumulation", "loss_chunk_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SlideDPError(f"policy.{name} must be a positive integer, got {value!r}")
        if self.chunks_per_layer > MAX_CHUNKS_PER_LAYER:
            raise SlideDPError(f"policy.chunks_per_layer must be at most {MAX_CHUNKS_PER_LAYER}, "
                               f"got {self.chunks_per_layer}")
        if not isinstance(self.gpu_state_units, int) or isinstance(self.gpu_state_units, bool) \
                or self.gpu_state_units < 0:
            raise SlideDPError(f"policy.gpu_state_units must be a non-negative integer, got {self.gpu_state_units!r}")
        if not isinstance(self.seq_tile_tokens, int) or isinstance(self.seq_tile_tokens, bool) \
                or self.seq_tile_tokens < 0:
            raise SlideDPError(f"policy.seq_tile_tokens must be a non-negative integer, got {self.seq_tile_tokens!r}")
        if self.adam_threads is not None and self.adam_threads < 1:
            raise SlideDPError(f"policy.adam_threads must be a positive integer, got {self.adam_threads!r}")
        for name, allowed in (("param_route", PARAM_ROUTES), ("grad_route", GRAD_ROUTES),
                              ("activation", ACTIVATION_POLICIES), ("update_schedule", UPDATE_SCHEDULES),
                              ("host_layout", HOST_LAYOUTS),
                              ("grad_dtype", ("bf16", "fp32"))):
            if getattr(self, name) not in allowed:
                raise SlideDPError(f"policy.{name} must be one of {', '.join(allowed)}, "
                                   f"got {getattr(self, name)!r}")
        if not isinstance(self.kept_layers, int) or isinstance(self.kept_layers, bool) or self.kept_layers < 0:
            raise SlideDPError(f"policy.kept_layers must be a non-negative integer, got {self.kept_layers!r}")
        if self.kept_layers and self.activation != "recompute":
            raise SlideDPError(f"policy.kept_layers {self.kept_layers} needs activation recompute (with "
                               f"{self.activation!r} every layer's activations are already "
                               f"{'kept' if self.activation == 'keep' else 'offloaded'})")
        object.__setattr__(self, "state", self.state_precision.name)  # one spelling: "fp32+fp32" -> "fp32"

    @property
    def state_precision(self) -> StatePrecision:
        return StatePrecision.parse(self.state)

    @property
    def grad_bytes(self) -> int:
        return 2 if self.grad_dtype == "bf16" else 4

    def sequences_per_rank(self) -> int:
        return self.micro_batch * self.accumulation

    def with_(self, **changes) -> Policy:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return to_mapping(self)

    def save(self, path: str | Path) -> None:
        write_mapping(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict, where: str = "policy") -> Policy:
        return from_mapping(cls, data, where)

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        return cls.from_dict(read_mapping(path, "policy"), where=Path(path).name)


def load_policy_for(path: str | Path, per_rank: int | None) -> Policy:
    """A policy file for a problem of ``per_rank`` sequences per rank and step. What the file leaves out of
    micro_batch x accumulation is filled so that the batch is met, as the default policy fills it (a file with
    only ``gpu_state_units: 4`` is that change to the default, not a batch of one); a file that gives both is
    taken as written and checked against the batch by the workload. None: take the file as written."""
    data = read_mapping(path, "policy")
    policy = Policy.from_dict(data, where=Path(path).name)
    if per_rank is None or ("micro_batch" in data and "accumulation" in data):
        return policy
    if "accumulation" in data:
        micro, rest = divmod(per_rank, policy.accumulation)
        return policy if rest or micro < 1 else replace(policy, micro_batch=micro)
    micro = policy.micro_batch if "micro_batch" in data else 1
    accumulation, rest = divmod(per_rank, micro)
    return policy if rest or accumulation < 1 else replace(policy, accumulation=accumulation)


def default_policy(global_batch: int, num_gpus: int, max_micro_batch: int = 1) -> Policy:
    """A reasonable starting policy for a global batch: sharded routes, recompute, small micro-batches."""
    if global_batch < num_gpus or global_batch % num_gpus:
        raise SlideDPError(f"global batch {global_batch} must be a positive multiple of the GPU count {num_gpus}")
    per_rank = global_batch // num_gpus
    micro = max(d for d in range(1, min(per_rank, max_micro_batch) + 1) if per_rank % d == 0)
    return Policy(micro_batch=micro, accumulation=per_rank // micro)
