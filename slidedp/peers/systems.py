"""The systems SlideDP is compared with, each written once as a spec of what it moves, where it keeps its state
and where its optimizer runs.

A :class:`PeerSystem` holds per-parameter factors only (element sizes, which copies are sharded, which CPU passes
run); :class:`slidedp.peers.step.PeerStep` turns them into per-unit bytes for the plan builder and into closed-form
totals, and :mod:`slidedp.peers.memory` into GPU and host bytes, so the three cannot disagree. ``SYSTEMS`` is the
one registry of names: nothing else compares system names.

What each spec encodes (``benchmarks/peer_systems.py`` is what was measured):

- ``zero2-offload``: DeepSpeed ZeRO-2 with ``offload_optimizer: cpu``. bf16 weights stay on every GPU; backward
  reduces bf16 gradients in buckets and copies each rank's partition to the host in fp32, in series with the
  backward compute (``DEEPSPEED_OFFLOAD_GRAD_SYNC``); after backward the CPU scales the gradients for clipping and
  DeepSpeedCPUAdam steps the fp32 partition; the new weights are cast to bf16 on the CPU, copied back to the GPU
  and all-gathered.
- ``zero3-offload``: ZeRO-3 with parameters and optimizer offloaded: bf16 parameters live in pinned host memory,
  each rank fetches its 1/N of every layer before its forward and again before its backward (the recompute's
  forward hooks fetch it; backward finds it still gathered) and the ranks all-gather. Each gradient partition is
  reduce-scattered in bf16 buckets, copied D2H into a pinned bf16 buffer and straight back to the GPU, cast to
  fp32 there and copied D2H again (``grad_staging_bytes``); nothing waits for a copy until backward ends. After
  backward the CPU unscales the fp32 gradients (the clip), DeepSpeedCPUAdam steps, and the new fp32 master is cast
  into the pinned bf16 copy the next fetch reads (no copy to the GPU). Read in DeepSpeed 0.19.8's
  runtime/zero/stage3.py (partition_grads, _optimizer_step, _reassign_or_swap_out_partitioned_parameters) and
  partition_parameters.py (the world-size-1 fetch is a non-blocking host copy per parameter). Its Python hooks and
  copy-stream syncs make each decoder layer's pass last at least a host floor (``layer_host_floor``, measured).
- ``fsdp2-offload``: FSDP2 ``fully_shard`` per layer with ``CPUOffloadPolicy``: fp32 shards on the host, copied to
  the GPU (fp32) and all-gathered in bf16 before each layer's forward and backward (the root's embedding and head
  stay gathered from forward to backward), fp32 gradients reduce-scattered and copied to the host; after backward
  ``clip_grad_norm_`` reads and scales the CPU gradients and torch's CPU AdamW steps. Its copies do not overlap
  the passes (measured: each pass waits for its whole fp32 copy, which starts after the previous pass).
- ``fsdp2-resident``: FSDP2 without offload: fp32 shards, their gradients and AdamW moments on the GPUs, bf16
  all-gather per layer in forward and backward, fp32 reduce-scatter, torch's fused AdamW on each shard.
- ``ddp-resident``: every GPU holds fp32 weights, gradients and moments (bf16 autocast), all-reduces fp32 gradients
  and runs fused AdamW on the whole model; on one GPU this is plain training, the measured "resident" system.
- ``slideformer``: SlideFormer (github RegiaYoung/SlideFormer, ``multi_gpu/`` at one GPU; benchmarks/peer_sources.md
  says what was read). fp32 master and fp32 moments on the host; before each layer's forward and again before its
  backward the host casts the fp32 master to a pinned bf16 staging buffer in 32M-element chunks interleaved with
  the bf16 copy to the GPU; each decoder layer's input (its checkpoint) is copied to pinned host memory after its
  forward and back before its backward; each layer's bf16 gradient is copied to one of two pinned host buffers
  (``--double-buffer``) and the CPU Adam of that layer runs as soon as its chunks land, while the GPU computes the
  next layers' backward; a layer's gradient copy waits until the update two layers later has freed its buffer.
  No global clipping (each layer updates before the whole gradient exists) and no gradient accumulation.
- ``megatrain``: MegaTrain (github DLYuanGod/MegaTrain, package ``infinity``, one GPU). bf16 parameters on the host
  with no fp32 master (fp32 moments, DeepSpeedCPUAdam on bf16 weights), a pinned bf16 copy of every decoder layer
  that the GPU copies from; embedding, final norm and head stay on the GPU. Forward streams each layer once
  (double-buffered); backward, per block of ``checkpoint_interval`` layers, streams each layer twice (a recompute
  pass from the block's checkpoint, then a forward with autograd and its backward), so each decoder layer runs
  three forwards and one backward; bf16 gradients go to pinned slabs and are copied into bf16 ``.grad`` on the
  host. After backward: torch ``clip_grad_norm_`` over the CPU gradients, DeepSpeedCPUAdam, a copy of the updated
  weights into the pinned layer copies and of the embedding / norm / head to the GPU. The loss keeps every
  128-token chunk's log-probabilities until its backward (no per-chunk recompute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slidedp.compute import AMP_FP32, BF16, check_precision
from slidedp.errors import SlideDPError
from slidedp.resources import CAST_HOST_BYTES

# Keys of HostSpec.peer_adam_gparams_per_s: the CPU optimizer-phase implementations the peers run (G params/s).
TORCH_ADAMW_FUSED = "torch_adamw_fused"
DEEPSPEED_CPU_ADAM = "deepspeed_cpu_adam"
# torch.nn.utils.clip_grad_norm_ over CPU gradients (norm, then scale): FSDP2-offload's clip. On the H200 it took
# 2.0 s for Qwen3-4B's 4.0 G parameters (benchmarks/RESULTS.md), 3x what 12 B/param at the host's streaming rate
# gives, so it is a measured rate of its own rather than DRAM bytes at SlideDP's streaming rate.
TORCH_CLIP_GRAD_NORM = "torch_clip_grad_norm"
# SlideFormer's own CPU Adam extension (optimizer/layer_adam: C++ adapted from DeepSpeed's, JIT-built with
# -march=native, run per layer from one update thread): a kernel of its own, so a rate of its own. Not yet timed
# on any host: a profile without it makes the slideformer system refuse rather than borrow DeepSpeed's rate.
SLIDEFORMER_CPU_ADAM = "slideformer_cpu_adam"
# MegaTrain's optimizer phase over bf16 tensors (bf16 weights and gradients, fp32 moments): DeepSpeedCPUAdam and
# torch's clip_grad_norm_ on other dtypes than the measured ZeRO-2 / FSDP2 ones (fp32), so rates of their own
# (calibration.peer_bench times them on request); without them the megatrain system refuses.
DEEPSPEED_CPU_ADAM_BF16 = "deepspeed_cpu_adam_bf16"
TORCH_CLIP_GRAD_NORM_BF16 = "torch_clip_grad_norm_bf16"

# reduce_bucket_size of the measured DeepSpeed runs (benchmarks/peer_systems.py).
ZERO_BUCKET_PARAMS = 200_000_000

# Host memory of the measured peers (benchmarks/RESULTS.md, fifth H200 session: Qwen3-4B, seq 4096, batch 1-8; RSS
# steady = peak, less the 1.6 GiB a GPU-resident training process holds): DeepSpeed 0.19.8 ZeRO-2-Offload 115.9 GiB,
# FSDP2 + CPUOffloadPolicy 73.7 GiB. DeepSpeed trained that model with its head untied (the benchmark's bug, fixed
# 2026-12-07: 4.41 G parameters, not 4.02), FSDP2 tied: ZeRO-2 holds 27.8 B/param where its optimizer state is 16
# (pageable copies kept beside its pinned buffers, not itemised), FSDP2 19.2. The specs add the excess over the
# state, so that "fits the host" is right for them.
ZERO2_OFFLOAD_HOST_OVERHEAD = 11.8
FSDP2_OFFLOAD_HOST_OVERHEAD = 3.2
# DeepSpeed 0.19.8 ZeRO-3-Offload, the same way (c42 on a lent H100 host: Qwen3-4B untied, RSS 115.0 GiB at batch
# 1-8 where its buffers are 20 B/param): 7.6 B/param beyond. Against five more models as trained (c43, c45; measured
# before the correction, not blind): the Qwen2.5-3B, Qwen3-1.7B and Llama-3.2-3B shapes and Mistral-w12 +11 to
# +17% high, Qwen3-0.6B +2% (DeepSpeed's buffers are not all per-parameter).
ZERO3_OFFLOAD_HOST_OVERHEAD = 7.6

# The caching allocator's free blocks inside segments it cannot release, per byte allocated and freed within a
# step: under pressure (it frees its cache and retries before failing) a step needs this much beyond its allocated
# peak. Measured on an H100 by `benchmarks.gpu_fit_probe` (c46, 2026-12-07: the smallest
# set_per_process_memory_fraction cap under which GPU-resident steps run, Qwen3-4B batch 1-4, the Llama-3.2-3B
# shape batch 4-8, the Qwen3-1.7B shape batch 8-16): 0.21-0.45 of the transient bytes, least squares 0.33 (each
# row within 2.2 GiB). Without it the model had GPU-resident Qwen3-4B batch 8 fit an H100 where it ran out of memory
# (c42). Only GPU-resident DDP's allocations were measured; the other systems keep 0 until theirs are (their
# preallocated buffers would not fragment).
ALLOCATOR_FRAGMENTATION = 0.33


@dataclass(frozen=True)
class SerialGradCopy:
    """A gradient offload that runs in series with the backward compute, and the GPU work and host reads it adds.

    Where a system's host thread waits for each gradient's copy to the host before it issues more backward
    kernels, the copies cannot hide behind compute: the next unit's backward starts only after this unit's
    gradient has been reduced, passed through these GPU passes and copied out. Counts are per gradient element
    (HBM bytes) and per parameter tensor (kernels, host reads): ``bucket_*`` run over the whole reduced bucket on
    every rank, ``partition_*`` over the rank's own 1/N partition only. The passes are priced as memory-bound
    kernels (``gpu.compute``), each host read as one PCIe round trip (``gpu.pcie_latency_us``).
    """

    bucket_bytes: int
    bucket_kernels: int
    partition_bytes: int
    partition_kernels: int
    host_reads: int


# What DeepSpeed ZeRO-1/2 with ``offload_optimizer`` does to each gradient during backward, read in
# deepspeed/runtime/zero/stage_1_and_2.py (deepspeedai/DeepSpeed at edaa72212, version.txt 0.19.6; git blame dates
# the lines cited to 2020-2024, so 0.19.8 as measured is taken to match; not read at 0.19.8 itself):
# - the bucket fills on the compute stream: each gradient copied into the contiguous bf16 bucket (read 2, write 2;
#   reduce_independent_p_g_buckets_and_remove_grads, l. 1230-1233);
# - average_tensor (l. 1350-1363, overlap_comm) makes the reduction stream wait for the compute stream, divides the
#   bucket in place (l. 1436, read 2 + write 2), and allreduce_bucket (l. 1841) flattens the slices into a new
#   tensor (read 2, write 2), all-reduces it and copies each slice back (l. 1310, read 2, write 2);
# - reduce_ipg_grads (l. 1718-1755) then, on the reduction stream, per parameter of the rank's partition,
#   copy_grads_in_partition (l. 1650-1666): set_norm_for_param_grad_in_gpu (l. 1575-1588: .double().norm(2),
#   read 2 + write 8, read 8; 2 kernels); update_offload_overflow_tracker (l. 1498-1500 with _has_inf_or_nan,
#   l. 2486-2491: .float(), isnan, isinf, logical_or, .float(), .max(): 28 B, 6 kernels), whose ``if`` on a CUDA
#   tensor is a host read: the hook's thread (the one issuing backward kernels) blocks until the reduction stream,
#   which waited for the compute stream, gets there; async_inplace_copy_grad_to_fp32_buffer_from_gpu
#   (l. 1590-1605: .to(fp32), read 2 + write 4; then the D2H copy into the pinned fp32 gradient partition, l. 843).
# So every parameter's copy but a bucket's last is done before backward issues another kernel: the copies are in
# series with compute (the double-buffered bucket does not hide them), and the end of backward synchronises the
# device (independent_gradient_partition_epilogue, l. 931). Per bucket a few kernels (cat, div, all-reduce) are
# not counted; nor is the overlap of a bucket's last copy with the next compute (at most one tensor's copy per
# bucket: 1.8 ms for Qwen3-4B's largest layer tensor at 55 GB/s, about 20 buckets; the embedding's comes last
# and is waited for anyway), so the model errs slow by at most that.
DEEPSPEED_OFFLOAD_GRAD_SYNC = SerialGradCopy(bucket_bytes=16, bucket_kernels=2, partition_bytes=52,
                                             partition_kernels=9, host_reads=1)

SLIDEDP = "slidedp"  # SlideDP itself: the workload's own plan (slidedp.schedule), not a PeerSystem


@dataclass(frozen=True)
class LayerHostFloor:
    """The least host time a decoder layer's forward and backward take where a system's Python hooks and copy
    syncs, not the GPU, set the pace: a fixed cost per layer plus a cost per parameter (the layer's weight fetch,
    and in backward its gradient copies, waited for by the host). A pass lasts the longer of this and its compute.
    """

    forward_s: float
    forward_s_per_param: float
    backward_s: float
    backward_s_per_param: float

    def forward(self, params: float) -> float:
        return self.forward_s + self.forward_s_per_param * params

    def backward(self, params: float) -> float:
        return self.backward_s + self.backward_s_per_param * params


# DeepSpeed 0.19.8 ZeRO-3-Offload on one GPU (four Python hooks per module call, a patched F.linear, a gradient hook
# per parameter, a copy-stream sync at each fetch it waits for). Fitted (least squares) on the steady forward and
# backward phases of four models at batch 2 on lent H100 hosts, Xeon model 207 (benchmarks/RESULTS.md, seventeenth
# session, c42-c44: Qwen3-0.6B, the Qwen3-1.7B and Llama-3.2-3B shapes, Qwen3-4B; within 3.5% forward, 7.6%
# backward). Held out since (c45, eighteenth session: the Qwen2.5-3B shape and Mistral-w12, layers twice the fit's
# largest): not refuted, Mistral's batch-1 phases within 5%. A floor per module call, fitted on Qwen3-4B alone,
# was refuted (c43).
DEEPSPEED_ZERO3_LAYER_FLOOR = LayerHostFloor(forward_s=6.28e-3, forward_s_per_param=0.0517e-9,
                                             backward_s=11.3e-3, backward_s_per_param=0.1437e-9)


@dataclass(frozen=True)
class PeerSystem:
    """What one peer system does per parameter. Every ``*_bytes`` field is an element size in bytes; 0 = never.

    Parameters: ``fetch_h2d_bytes`` is what each rank copies from the host per fetch of a layer (its 1/N shard);
    ``gathered_bytes`` the dtype of the unsharded weights a layer computes with, all-gathered from the ranks'
    shards ((N-1)/N of them cross the GPU links) when the system shards weights (``shards_weights``).
    Gradients: reduced over the ranks by ``grad_collective`` in ``grad_collective_bytes`` elements, then each
    rank copies its 1/N (``grad_d2h_bytes``) to the host. Optimizer: on the CPU after backward (clip passes of
    ``clip_host_bytes`` DRAM bytes, at ``cpu_clip``'s measured rate where the system clips with that
    implementation and at the host's streaming rate otherwise, then ``cpu_adam`` at that implementation's measured
    rate, then optionally a cast to bf16 and a copy of the new weights back to the GPUs) or on the GPU (fused AdamW
    on each rank's state).
    Memory: bytes each GPU holds all step (``gpu_weight_bytes``, ``gpu_moment_bytes``) and at the end of backward
    (``gpu_grad_bytes``), divided over the ranks where ``gpu_state_sharded``; ``autocast_cache`` counts the bf16
    copies autocast keeps of fp32 weights until forward ends; ``grad_bucket_params`` is DeepSpeed's gradient
    bucket (``reduce_bucket_size`` as benchmarks/peer_systems.py sets it); ``host_state_bytes`` is one host copy
    per parameter for all ranks (each rank holds its 1/N).
    """

    name: str
    summary: str
    fetch_h2d_bytes: int
    gathered_bytes: int
    refetch_in_backward: bool
    grad_collective: Literal["reduce_scatter", "all_reduce"]
    grad_collective_bytes: int
    grad_d2h_bytes: int
    optimizer: Literal["cpu", "gpu"]
    cpu_adam: str | None
    clip_host_bytes: int
    cast_after_step: bool
    writeback_h2d_bytes: int
    gpu_weight_bytes: int
    gpu_moment_bytes: int
    gpu_grad_bytes: int
    gpu_state_sharded: bool
    autocast_cache: bool
    host_state_bytes: int
    grad_bucket_params: int = 0  # gradients are reduced through a contiguous bf16 bucket of this many elements
    cpu_clip: str | None = None  # a measured clip implementation (key of peer_adam_gparams_per_s), else DRAM-bound
    # Host bytes per parameter the system holds beyond its state, from the process's RSS where it was measured
    # (ZERO2_OFFLOAD_HOST_OVERHEAD and FSDP2_OFFLOAD_HOST_OVERHEAD); 0 where it was not.
    host_overhead_bytes: float = 0.0
    # The gradient offload runs in series with backward (see SerialGradCopy); None: it overlaps the compute.
    serial_grad_copy: SerialGradCopy | None = None
    # Bytes per gradient element each rank copies D2H and straight back H2D before its ``grad_d2h_bytes`` copy
    # (ZeRO-3 stages every reduced bf16 partition in a pinned host buffer first); 0: no such round trip.
    grad_staging_bytes: int = 0
    # The least host time of a decoder layer's passes (LayerHostFloor); None: the GPU sets their pace.
    layer_host_floor: LayerHostFloor | None = None
    # Whether a layer's weight fetch overlaps the neighbouring layer's pass (fetched PEER_WINDOW layers ahead, in
    # forward and in backward's re-fetch). False: each layer's copy starts only after the previous layer's pass has
    # ended, so each pass waits for its whole copy. Measured for FSDP2 + CPUOffloadPolicy (twentieth session): its
    # forward ran 0.24-0.29 s longer than GPU-resident's in the same call at batch 1, 2, 4 and 8 on an H200 (0.27-0.30
    # at 1 and 4 on an H100), about its fp32 copy's time alone (0.29 s); its backward 0.30-0.33 s longer at batch 1,
    # falling to 0.12 s at 8: at larger batches part of the re-fetch hides, which this does not model.
    fetch_overlaps_passes: bool = True
    # The layers' numerics the compute model prices (slidedp.compute.PRECISIONS): AMP_FP32 for fp32 weights under
    # autocast (plain GPU-resident training: its residual stream is fp32), BF16 for systems that compute in bf16.
    precision: str = BF16
    # The caching allocator's bytes beyond the allocated peak per byte allocated and freed within a step (measured:
    # ALLOCATOR_FRAGMENTATION); 0 where not measured.
    allocator_fragmentation: float = 0.0
    # The layer-streaming peers (SlideFormer, MegaTrain), each stated from its code (benchmarks/peer_sources.md):
    single_gpu: bool = False  # modelled on one GPU only (their multi-GPU modes reduce on the CPU, not modelled)
    backward_fetches: int = 1  # copies of each decoder layer in backward, where refetch_in_backward
    backward_extra_forwards: int = 0  # forwards per decoder layer in backward beyond the workload's one recompute
    root_on_gpu: bool = False  # embedding, final norm and head stay on the GPU in bf16, never fetched
    cast_on_fetch: bool = False  # each fetch casts the fp32 master to bf16 on the CPU, interleaved with its copy
    update_per_unit: bool = False  # CPU AdamW of a unit as soon as its gradient lands, overlapping backward
    grad_buffers: int = 0  # host gradient buffers a per-unit update cycles through (0: one per unit)
    checkpoints_on_host: bool = False  # each decoder layer's input goes D2H after forward, H2D before backward
    master_bytes: int = 4  # element size of the host weights AdamW updates (2: bf16, no fp32 master)
    cast_bytes: int = CAST_HOST_BYTES  # DRAM bytes per parameter of the pass after the update (cast_after_step)
    writeback_root_only: bool = False  # the copy back after the update moves only the GPU-resident root units
    checkpoint_interval: int = 1  # decoder layers per activation checkpoint (their recompute cache is on the GPU)
    loss_keeps_logits: bool = False  # every chunk's bf16 log-probabilities live until the loss's backward
    loss_chunk_tokens: int = 0  # tokens per chunk of such a loss
    # Bytes per parameter of the largest streamed unit in the system's preallocated GPU buffers, weights and
    # gradients in flight together (SlideFormer: 3 cache units of bf16 weights + bf16 gradients; MegaTrain: 2 flat
    # bf16 buffers, 2 bf16 layer templates and the bf16 gradients of the layers whose copy is in flight).
    gpu_buffer_bytes: int = 0
    # The attention kernel the system's model runs (slidedp.compute.ATTENTION_IMPLEMENTATIONS): SlideFormer
    # hard-codes HF's eager attention (main_dp.py), which materialises every score (compute and GPU memory).
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        check_precision(self.precision)

    @property
    def streams_weights(self) -> bool:
        """Weights are fetched to the GPU per unit (from the host and/or by all-gather from the ranks)."""
        return self.shards_weights or self.fetch_h2d_bytes > 0

    @property
    def shards_weights(self) -> bool:
        """Layers are gathered from per-rank shards before they compute (and freed after)."""
        return self.gathered_bytes > 0

    @property
    def offloads_gradients(self) -> bool:
        return self.grad_d2h_bytes > 0

    @property
    def updates_on_cpu(self) -> bool:
        """AdamW runs on the host after backward (otherwise fused AdamW on each GPU)."""
        return self.optimizer == "cpu"

    @property
    def grad_op(self) -> str:
        """The trace op of the gradient collective."""
        return "allreduce" if self.grad_collective == "all_reduce" else "reduce_scatter"

    @property
    def grad_ring_passes(self) -> int:
        """Ring passes of the gradient collective: an all-reduce is a reduce-scatter plus an all-gather."""
        return 2 if self.grad_collective == "all_reduce" else 1


SYSTEMS: dict[str, PeerSystem] = {s.name: s for s in (
    PeerSystem(
        name="zero2-offload", summary="DeepSpeed ZeRO-2, optimizer offloaded to the CPU (DeepSpeedCPUAdam)",
        fetch_h2d_bytes=0, gathered_bytes=0, refetch_in_backward=False,
        grad_collective="reduce_scatter", grad_collective_bytes=2, grad_d2h_bytes=4,
        optimizer="cpu", cpu_adam=DEEPSPEED_CPU_ADAM, clip_host_bytes=8, cast_after_step=True, writeback_h2d_bytes=2,
        gpu_weight_bytes=2, gpu_moment_bytes=0, gpu_grad_bytes=0, gpu_state_sharded=False, autocast_cache=False,
        host_state_bytes=16, grad_bucket_params=ZERO_BUCKET_PARAMS, host_overhead_bytes=ZERO2_OFFLOAD_HOST_OVERHEAD,
        serial_grad_copy=DEEPSPEED_OFFLOAD_GRAD_SYNC),
    PeerSystem(
        name="zero3-offload", summary="DeepSpeed ZeRO-3, parameters and optimizer offloaded to the CPU",
        fetch_h2d_bytes=2, gathered_bytes=2, refetch_in_backward=True,
        grad_collective="reduce_scatter", grad_collective_bytes=2, grad_d2h_bytes=4,
        optimizer="cpu", cpu_adam=DEEPSPEED_CPU_ADAM, clip_host_bytes=8, cast_after_step=True, writeback_h2d_bytes=0,
        gpu_weight_bytes=0, gpu_moment_bytes=0, gpu_grad_bytes=0, gpu_state_sharded=True, autocast_cache=False,
        # pinned bf16 parameters 2 + pinned bf16 gradient staging 2 + pinned fp32 gradients 4 + fp32 master 4 +
        # moments 8 (stage3.py's buffers)
        host_state_bytes=20, grad_bucket_params=ZERO_BUCKET_PARAMS, grad_staging_bytes=2,
        host_overhead_bytes=ZERO3_OFFLOAD_HOST_OVERHEAD, layer_host_floor=DEEPSPEED_ZERO3_LAYER_FLOOR),
    PeerSystem(
        name="fsdp2-offload", summary="PyTorch FSDP2 with CPUOffloadPolicy (torch CPU AdamW, fused)",
        fetch_h2d_bytes=4, gathered_bytes=2, refetch_in_backward=True,
        grad_collective="reduce_scatter", grad_collective_bytes=4, grad_d2h_bytes=4,
        optimizer="cpu", cpu_adam=TORCH_ADAMW_FUSED, clip_host_bytes=12, cast_after_step=False, writeback_h2d_bytes=0,
        gpu_weight_bytes=0, gpu_moment_bytes=0, gpu_grad_bytes=0, gpu_state_sharded=True, autocast_cache=False,
        host_state_bytes=16, cpu_clip=TORCH_CLIP_GRAD_NORM, host_overhead_bytes=FSDP2_OFFLOAD_HOST_OVERHEAD,
        fetch_overlaps_passes=False),
    PeerSystem(
        name="fsdp2-resident", summary="PyTorch FSDP2 without offload: optimizer sharded over the GPUs",
        fetch_h2d_bytes=0, gathered_bytes=2, refetch_in_backward=True,
        grad_collective="reduce_scatter", grad_collective_bytes=4, grad_d2h_bytes=0,
        optimizer="gpu", cpu_adam=None, clip_host_bytes=0, cast_after_step=False, writeback_h2d_bytes=0,
        gpu_weight_bytes=4, gpu_moment_bytes=8, gpu_grad_bytes=4, gpu_state_sharded=True, autocast_cache=False,
        host_state_bytes=0),
    PeerSystem(
        name="ddp-resident", summary="GPU-resident data parallel (fp32 weights, bf16 autocast, fused AdamW)",
        fetch_h2d_bytes=0, gathered_bytes=0, refetch_in_backward=False,
        grad_collective="all_reduce", grad_collective_bytes=4, grad_d2h_bytes=0,
        optimizer="gpu", cpu_adam=None, clip_host_bytes=0, cast_after_step=False, writeback_h2d_bytes=0,
        gpu_weight_bytes=4, gpu_moment_bytes=8, gpu_grad_bytes=4, gpu_state_sharded=False, autocast_cache=True,
        host_state_bytes=0, allocator_fragmentation=ALLOCATOR_FRAGMENTATION, precision=AMP_FP32),
    PeerSystem(
        name="slideformer", summary="SlideFormer: layer streaming, per-layer CPU Adam overlapping backward",
        fetch_h2d_bytes=2, gathered_bytes=0, refetch_in_backward=True,
        grad_collective="reduce_scatter", grad_collective_bytes=0, grad_d2h_bytes=2,
        optimizer="cpu", cpu_adam=SLIDEFORMER_CPU_ADAM, clip_host_bytes=0, cast_after_step=False,
        writeback_h2d_bytes=0, gpu_weight_bytes=0, gpu_moment_bytes=0, gpu_grad_bytes=0, gpu_state_sharded=False,
        autocast_cache=False, host_state_bytes=12, single_gpu=True, cast_on_fetch=True, update_per_unit=True,
        grad_buffers=2, checkpoints_on_host=True, gpu_buffer_bytes=3 * (2 + 2), attention="eager"),
    PeerSystem(
        name="megatrain", summary="MegaTrain: bf16 weights on the host, DeepSpeedCPUAdam after backward",
        fetch_h2d_bytes=2, gathered_bytes=0, refetch_in_backward=True,
        grad_collective="reduce_scatter", grad_collective_bytes=0, grad_d2h_bytes=2,
        optimizer="cpu", cpu_adam=DEEPSPEED_CPU_ADAM_BF16, clip_host_bytes=6, cast_after_step=True,
        writeback_h2d_bytes=2, gpu_weight_bytes=0, gpu_moment_bytes=0, gpu_grad_bytes=0, gpu_state_sharded=False,
        autocast_cache=False, host_state_bytes=14, cpu_clip=TORCH_CLIP_GRAD_NORM_BF16, single_gpu=True,
        backward_fetches=2, backward_extra_forwards=1, root_on_gpu=True, master_bytes=2, cast_bytes=4,
        writeback_root_only=True, checkpoint_interval=4, loss_keeps_logits=True, loss_chunk_tokens=128,
        gpu_buffer_bytes=2 * (2 + 2 + 2)),
)}

SYSTEM_NAMES: tuple[str, ...] = (SLIDEDP, *SYSTEMS)


def check_system(name: str) -> str:
    """``name`` if it is SlideDP or a registered peer, else one line naming the choices."""
    if name not in SYSTEM_NAMES:
        raise SlideDPError(f"unknown system {name!r}: choose one of {', '.join(SYSTEM_NAMES)}")
    return name


def peer_system(name: str) -> PeerSystem | None:
    """The peer's spec, or None for SlideDP itself (which runs its own policy-driven plan)."""
    return SYSTEMS.get(check_system(name))
