"""What the machine can do: PCIe links, host memory, CPU optimizer rates, GPU compute and GPU links.

Rates are stored in human units (GB/s, TFLOP/s, G params/s) because people edit these files; the
``*_Bps``-style helpers convert to SI for the models.
"""

from __future__ import annotations

import bisect
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from slidedp.compute import GPU_STATE_UPDATE_HBM_BYTES, MEASURED_KIND, ComputeCurves, Elementwise
from slidedp.config_io import from_mapping, quote, read_mapping, to_mapping, write_mapping
from slidedp.errors import SlideDPError

GB = 1e9
GIB = 1024**3


def gib_text(n_bytes: float) -> str:
    """Bytes in GiB for a message: one decimal from 1 GiB up, two below, two significant digits under 0.01 GiB,
    so that a small limit (a test's, a typo's) does not read as 0.0."""
    gib = n_bytes / GIB
    if abs(gib) >= 1 or gib == 0:
        return f"{gib:.1f}"
    return f"{gib:.2f}" if abs(gib) >= 0.01 else f"{gib:.2g}"

MIN_RATE = 1e-6  # GB/s, TFLOP/s, G params/s, GiB: anything smaller is a typo that would stall the simulator


def _positive(where: str, **values: float) -> None:
    for name, value in values.items():
        if not (value >= MIN_RATE and math.isfinite(value)):
            raise SlideDPError(f"{where}.{name} must be positive and finite (at least {MIN_RATE:g}), got {value!r}")


def _check_curve(where: str, curve: dict[int, float]) -> None:
    if not curve:
        raise SlideDPError(f"{where} needs at least one threads: rate point")
    for threads, rate in curve.items():
        if threads <= 0 or not (rate >= MIN_RATE and math.isfinite(rate)):
            raise SlideDPError(f"{where}: threads and rates must be positive, got {threads}: {rate}")


def interpolate_curve(curve: dict[int, float], threads: int) -> float:
    """Rate at ``threads`` by linear interpolation of a measured thread-scaling curve.

    Beyond the last point the curve is flat: more threads than measured never buys more speed.
    Below the first point it scales linearly from zero.
    """
    xs = sorted(curve)
    if threads >= xs[-1]:
        return curve[xs[-1]]
    if threads <= xs[0]:
        return curve[xs[0]] * threads / xs[0]
    i = bisect.bisect_left(xs, threads)
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = curve[x0], curve[x1]
    return y0 + (y1 - y0) * (threads - x0) / (x1 - x0)


def split_cut_name(name: str) -> tuple[str, bool]:
    """A profile name as (the profile's own name, whether :meth:`HardwareProfile.with_gpus` cut it to fewer
    GPUs): the one reader of the ``<name>@<gpus>`` such a copy is named, for a profile or a run's summary."""
    base, _, gpus = name.partition("@")
    return base, bool(gpus)


def slowdown_curve_at(curve: dict[int, float], gbps: float) -> float:
    """A slowdown factor at ``gbps`` of CPU-pass DRAM traffic from a curve measured at a few traffics (GB/s ->
    factor >= 1): 1 at no traffic, linear from there to the first point and between points, flat beyond the
    last; 1 where nothing was measured. It is :func:`interpolate_curve` on the factors' excess over 1 (that
    function's "linear from zero below the first point" is this one's "from 1")."""
    if not curve or gbps <= 0:
        return 1.0
    return 1.0 + interpolate_curve({x: factor - 1.0 for x, factor in curve.items()}, gbps)


def _check_slowdown_curve(where: str, curve: dict[int, float]) -> None:
    for gbps, factor in curve.items():
        if not (isinstance(gbps, int) and gbps > 0 and isinstance(factor, (int, float)) and math.isfinite(factor)
                and 1.0 <= factor <= 100.0):
            raise SlideDPError(f"{where}: each entry is <CPU passes' GB/s>: <factor between 1 and 100>, "
                               f"got {quote(gbps)}: {quote(factor)}")


def linear_seconds(flops, tokens, matmul_tflops: float, half_efficiency_tokens: float):
    """Time of a layer's linears: the matmul rate saturates with tokens per kernel, reaching half of
    ``matmul_tflops`` at ``half_efficiency_tokens``. A scalar token count of 0 or less (unknown) means the full
    rate. Works elementwise on numpy arrays, which is how the calibration fit calls it."""
    unknown = isinstance(tokens, numbers.Real) and not tokens > 0
    efficiency = 1.0 if unknown else tokens / (tokens + half_efficiency_tokens)
    return flops / (matmul_tflops * 1e12 * efficiency)


def attention_seconds(flops, attention_tflops: float):
    """Time of a layer's attention at the achieved (sequence-length independent) attention rate."""
    return flops / (attention_tflops * 1e12)


def layer_forward_seconds(linear_flops, attention_flops, tokens, matmul_tflops: float, half_efficiency_tokens: float,
                          attention_tflops: float, overhead_s: float):
    """One decoder layer's forward time: linears + attention + a fixed per-layer overhead.

    The one home of the GPU compute model: ``GPUSpec`` evaluates it with a profile's rates, and
    ``slidedp.calibration.fits.fit_compute`` fits those rates to measured layer times with it, so the rates a
    calibration writes mean exactly what the simulator reads them as. Scalars or numpy arrays."""
    return (linear_seconds(linear_flops, tokens, matmul_tflops, half_efficiency_tokens)
            + attention_seconds(attention_flops, attention_tflops) + overhead_s)


@dataclass(frozen=True)
class GPUSpec:
    """One GPU and its PCIe attachment."""

    name: str
    memory_gib: float
    h2d_gbps: float
    d2h_gbps: float
    duplex_gbps: float  # H2D + D2H together can reach less than the sum
    pcie_latency_us: float
    matmul_tflops: float  # achieved bf16 rate on a decoder layer's linears at large token counts
    attention_tflops: float  # achieved causal flash-attention rate (fwd and bwd)
    half_efficiency_tokens: float  # tokens per kernel at which the linears reach half their rate
    layer_overhead_us: float  # fixed launch/elementwise cost per layer per pass
    reserve_gib: float = 2.0  # CUDA context, allocator slack, NCCL buffers
    # Backward time over forward time, per kind of work: the textbook 2x holds for large GEMMs, while
    # flash-attention's backward recomputes the softmax and runs nearer 2.5x (fitted by slidedp calibrate).
    backward_linear_ratio: float = 2.0
    backward_attention_ratio: float = 2.0
    # AdamW on GPU-held state (policy.gpu_state_units), clip scale and bf16 refresh included: HBM-bound, so about
    # HBM bandwidth / slidedp.compute.GPU_STATE_UPDATE_HBM_BYTES per parameter (timed by slidedp calibrate).
    adam_gparams_per_s: float = 50.0
    # Shape-aware compute curves (slidedp.compute): when present, units are costed operation by operation
    # from their shapes and the layer-level fields above (matmul/attention rates, ratios, overhead) are
    # not used for compute time.
    compute: ComputeCurves | None = None

    def __post_init__(self) -> None:
        _positive("gpu", memory_gib=self.memory_gib, h2d_gbps=self.h2d_gbps, d2h_gbps=self.d2h_gbps,
                  duplex_gbps=self.duplex_gbps, matmul_tflops=self.matmul_tflops,
                  attention_tflops=self.attention_tflops)
        if not all(0 <= v < math.inf for v in (self.pcie_latency_us, self.layer_overhead_us,
                                               self.half_efficiency_tokens, self.reserve_gib)):
            raise SlideDPError("gpu: latencies, overheads and half_efficiency_tokens must be >= 0")
        if self.reserve_gib < 0 or self.reserve_gib >= self.memory_gib:
            raise SlideDPError("gpu.reserve_gib must be >= 0 and below memory_gib")
        _positive("gpu", backward_linear_ratio=self.backward_linear_ratio,
                  backward_attention_ratio=self.backward_attention_ratio,
                  adam_gparams_per_s=self.adam_gparams_per_s)

    def update_rate_seconds(self, nbytes: float) -> float:
        """``nbytes`` of HBM traffic inside a step at the bandwidth of the GPU update rate calibrate times for
        SlideDP's own pass (``adam_gparams_per_s`` x GPU_STATE_UPDATE_HBM_BYTES per parameter), times the curves'
        step_factor where there are curves: what a profile knows of a whole-model memory pass it did not time."""
        factor = self.compute.step_factor if self.compute is not None else 1.0
        return factor * nbytes / (self.adam_gparams_per_s * 1e9 * GPU_STATE_UPDATE_HBM_BYTES)

    def optimizer_pass_seconds(self, op: Elementwise) -> float:
        """An optimizer step over GPU-held fp32 state inside a training step, each pass at its own measurement:
        SlideDP's update of its GPU-held units (slidedp.compute.gpu_state_update_op) at the rate calibrate times for
        exactly that pass; a GPU-resident peer's clip + fused AdamW (gpu_optimizer_op) at the curves' ``optimizer``
        bandwidth where calibration timed that pass over layer-shaped tensors, else at the update rate's bandwidth
        (:meth:`update_rate_seconds`). The one rule for both; the elementwise modules' generic bandwidth, which had
        priced the peers' step, ran 16-32% fast on an H100 (benchmarks/RESULTS.md, twenty-second session)."""
        kind = MEASURED_KIND.get(op.name, "")
        if self.compute is not None and kind in self.compute.memory_gbps_by_kind:
            return self.compute.seconds(op)
        return self.update_rate_seconds(op.nbytes)

    def linear_time(self, flops: float, tokens: float) -> float:
        return linear_seconds(flops, tokens, self.matmul_tflops, self.half_efficiency_tokens)

    def attention_time(self, flops: float) -> float:
        return attention_seconds(flops, self.attention_tflops)

    def layer_forward_time(self, linear_flops: float, attention_flops: float, tokens: float) -> float:
        """One decoder layer's forward pass (see ``layer_forward_seconds``), per-layer overhead included."""
        return layer_forward_seconds(linear_flops, attention_flops, tokens, self.matmul_tflops,
                                     self.half_efficiency_tokens, self.attention_tflops, self.layer_overhead_us * 1e-6)


# Keys of HostSpec.dma_interference: which copy directions run beside a CPU pass.
DMA_DIRECTION_SETS = ("h2d", "d2h", "h2d+d2h")


@dataclass(frozen=True)
class HostSpec:
    """The host all GPUs share: cores, DRAM bandwidth, CPU optimizer and cast rates."""

    cores: int
    memory_gib: float
    mem_bw_gbps: float  # total DRAM traffic (read + write) the host sustains
    adam_gparams_per_s: dict[int, float]  # fused CPU AdamW step rate vs threads
    cast_gelems_per_s: dict[int, float]  # fp32 -> bf16 cast rate vs threads
    stream_gbps: dict[int, float]  # DRAM traffic one streaming CPU pass (e.g. gradient sum) reaches
    # The optimizer kernel writes the bf16 copy for the next H2D in the same pass (SlideDP's one-pass
    # kernel): no separate cast pass, and the Adam rate above already includes that write.
    fused_cast: bool = False
    # The CPU AdamW rates of the peers' optimizers (slidedp.peers), per implementation (e.g. ``torch_adamw_fused``,
    # ``deepspeed_cpu_adam``) as a thread curve like ``adam_gparams_per_s``. Optional: a peer whose implementation
    # is missing refuses to simulate rather than borrowing another kernel's rate.
    peer_adam_gparams_per_s: dict[str, dict[int, float]] = field(default_factory=dict)
    # How much slower a CPU pass runs while host<->GPU copies run in these directions ("h2d", "d2h", "h2d+d2h"),
    # a factor >= 1 measured by calibration.contention_bench (DMA writes and reads slow the cores' memory
    # accesses even where DRAM has bandwidth left). Missing directions: no slowdown.
    dma_interference: dict[str, float] = field(default_factory=dict)
    # The same factor with both copy directions running, measured beside passes of several thread counts and keyed
    # by the pass's own DRAM traffic alone (GB/s). It changes with the pass's traffic, and not the same way on every
    # host: 1.26x at 5 threads and 1.37x at 16 on one lent H100 host (c33), 1.46x at 2 and 1.34x at 16 on another
    # (c36). Every direction set's factor is scaled by it in its excess over 1 (see interference). Empty: the
    # factors above at every thread count.
    dma_interference_curve: dict[int, float] = field(default_factory=dict)
    # How much harder a CPU pass presses on host DRAM than a copy of the same solo rate when they share it
    # (sim.fluid): 1 = proportional sharing (hosts not measured); calibration.contention_bench fits it.
    cpu_dram_weight: float = 1.0
    # How much slower a host<->GPU copy runs beside CPU passes that, alone, would move this much host DRAM
    # traffic (GB/s, the key) than with the CPU idle: a factor >= 1 measured by calibration.contention_bench at
    # several thread counts of the AdamW pass, interpolated linearly in that traffic (1 at none, flat beyond the
    # largest). Why the passes' traffic and not DRAM capacity: on a lent H100 host each copy kept ~33 GB/s of its
    # 46.8 beside a pass of 10, 11 or 15 threads while DRAM carried 195-199 of its 218 GB/s, and 39.8 beside 5
    # threads; sharing capacity alone predicted 42-47 (benchmarks/RESULTS.md, "Twentieth session's device calls").
    # Empty (hosts not measured): copies slow only where DRAM is full.
    copy_slowdown: dict[int, float] = field(default_factory=dict)
    # The one-pass update rate of each compact host-state mode (slidedp.state_precision names such as
    # ``fp32+int8``) as a thread curve like ``adam_gparams_per_s`` (which is the ``fp32`` mode's), measured by
    # calibration or rescaled from runs of that mode (calibration.from_run.refit_state_update_rates). A mode
    # missing here is priced by the workload from its DRAM bytes (see update_rate).
    state_update_gparams_per_s: dict[str, dict[int, float]] = field(default_factory=dict)
    # How many times longer SlideDP's CPU update takes inside a training step than the simulator prices it from
    # the rates above (timed alone) and the copy contention (dma_interference): what a step adds beside it, the
    # Python thread issuing GPU work and the copy threads on the same cores and a whole-model working set, none
    # of which the pass alone sees. Fitted from the exact (fp32) runs' traces (calibration.from_run.
    # fit_step_update_factor: measured over simulated busy time of the update); 1 where no run was measured.
    step_update_factor: float = 1.0
    # The fixed cost of one call of the CPU update inside a step, in microseconds, on top of its parameters over
    # the rate. Each call ends when its last thread does, and in a step the update's threads share the cores with
    # the thread issuing GPU work and the copy threads, so a call waits for a descheduled thread about once: a
    # cost per call, not per parameter, which the rates (timed alone, size-independent from 12.5M parameters up)
    # do not see. It is what makes 4 or 8 chunks a layer slower than 1 on a CPU-bound step (2026-12-06, a lent
    # H100 host: Qwen3-4B batch 1, update busy 0.46 / 0.55 / 0.58 / 0.63 s at 1 / 2 / 4 / 8 chunks). Where the
    # update has slack (a GPU-bound step, whose trainer thread mostly waits) it costs less: on that host batch 8
    # with 602 calls was busy 0.51 s, batch 1 with 152 calls 0.53 s; the step is then not the update's anyway.
    # Per host-state mode (a StatePrecision name, like state_update_gparams_per_s), because the fits disagree by
    # mode: 562 us a call for bf16+int8 on that H100 host, 68 us for the DRAM-bound exact update from 37 H200 runs.
    # Fitted from a mode's runs at two or more call sizes (calibration.from_run.fit_update_call_us); a mode
    # missing here costs nothing a call.
    update_call_us: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cores <= 0:
            raise SlideDPError(f"host.cores must be positive, got {self.cores}")
        _positive("host", memory_gib=self.memory_gib, mem_bw_gbps=self.mem_bw_gbps)
        _check_curve("host.adam_gparams_per_s", self.adam_gparams_per_s)
        _check_curve("host.cast_gelems_per_s", self.cast_gelems_per_s)
        _check_curve("host.stream_gbps", self.stream_gbps)
        for impl, curve in self.peer_adam_gparams_per_s.items():
            _check_curve(f"host.peer_adam_gparams_per_s.{impl}", curve)
        for mode, curve in self.state_update_gparams_per_s.items():
            _check_curve(f"host.state_update_gparams_per_s.{mode}", curve)
        for dirs, factor in self.dma_interference.items():
            if dirs not in DMA_DIRECTION_SETS:
                raise SlideDPError(f"host.dma_interference: unknown key {quote(dirs)}; "
                                   f"use {', '.join(DMA_DIRECTION_SETS)}")
            if not (isinstance(factor, (int, float)) and math.isfinite(factor) and 1.0 <= factor <= 100.0):
                raise SlideDPError(f"host.dma_interference.{dirs} must be a factor between 1 and 100, "
                                   f"got {quote(factor)}")

        _check_slowdown_curve("host.copy_slowdown", self.copy_slowdown)
        _check_slowdown_curve("host.dma_interference_curve", self.dma_interference_curve)
        if not (isinstance(self.cpu_dram_weight, (int, float)) and 1.0 <= self.cpu_dram_weight <= 100.0):
            raise SlideDPError(f"host.cpu_dram_weight must be between 1 and 100, got {quote(self.cpu_dram_weight)}")
        if not (isinstance(self.step_update_factor, (int, float)) and 0.25 <= self.step_update_factor <= 10.0):
            raise SlideDPError(f"host.step_update_factor must be between 0.25 and 10, "
                               f"got {quote(self.step_update_factor)}")
        for mode, us in self.update_call_us.items():
            if not (isinstance(us, (int, float)) and 0.0 <= us <= 100_000.0):
                raise SlideDPError(f"host.update_call_us.{mode} must be between 0 and 100000 (microseconds), "
                                   f"got {quote(us)}")

    def interference(self, directions: str, cpu_bytes_per_s: float | None = None) -> float:
        """The slowdown of a CPU pass while copies run in ``directions`` ("" when none): the measured factor,
        its excess over 1 scaled by ``dma_interference_curve`` at the pass's solo traffic ``cpu_bytes_per_s``
        over the curve's value at its largest point (None: unscaled). A curve whose largest point is 1 (no
        interference at all cores) scales nothing: the factors are then those of the all-core run."""
        factor = self.dma_interference.get(directions, 1.0) if directions else 1.0
        curve = self.dma_interference_curve
        if factor == 1.0 or not curve or cpu_bytes_per_s is None:
            return factor
        top = curve[max(curve)]
        scale = (slowdown_curve_at(curve, cpu_bytes_per_s / 1e9) - 1.0) / (top - 1.0) if top > 1.0 else 1.0
        return 1.0 + (factor - 1.0) * scale

    def copy_slowdown_at(self, cpu_bytes_per_s: float) -> float:
        """The slowdown of a copy beside CPU passes whose solo rates add up to ``cpu_bytes_per_s`` of DRAM
        traffic (1 with none running or none measured)."""
        return slowdown_curve_at(self.copy_slowdown, cpu_bytes_per_s / 1e9)

    def adam_rate(self, threads: int) -> float:
        """Parameters per second one optimizer worker with ``threads`` threads updates."""
        return interpolate_curve(self.adam_gparams_per_s, threads) * 1e9

    def measured_state_update_rate(self, mode: str, threads: int) -> float | None:
        """Parameters per second of the one-pass update of host-state mode ``mode`` (a StatePrecision name) with
        ``threads`` threads, as calibrated: ``adam_gparams_per_s`` for ``fp32``, else
        ``state_update_gparams_per_s[mode]``; None where this host has not measured the mode."""
        curve = self.adam_gparams_per_s if mode == "fp32" else self.state_update_gparams_per_s.get(mode)
        return None if curve is None else interpolate_curve(curve, threads) * 1e9

    def update_call_seconds(self, mode: str) -> float:
        """The fixed cost of one CPU update call of host-state mode ``mode`` inside a step (host.update_call_us)."""
        return self.update_call_us.get(mode, 0.0) * 1e-6

    def cast_rate(self, threads: int) -> float:
        return interpolate_curve(self.cast_gelems_per_s, threads) * 1e9

    def peer_adam_rate(self, implementation: str, threads: int) -> float:
        """Parameters per second a peer's CPU AdamW ``implementation`` updates with ``threads`` threads."""
        curve = self.peer_adam_gparams_per_s.get(implementation)
        if curve is None:
            measured = ", ".join(sorted(self.peer_adam_gparams_per_s)) or "none"
            raise SlideDPError(
                f"the hardware profile has no CPU AdamW rate for {implementation!r} (measured: {measured}); "
                f"add host.peer_adam_gparams_per_s.{implementation} as threads: G params/s, measured on this host")
        return interpolate_curve(curve, threads) * 1e9

    def stream_rate(self, threads: int) -> float:
        return interpolate_curve(self.stream_gbps, threads) * GB


@dataclass(frozen=True)
class LinkSpec:
    """GPU-to-GPU path for collectives. ``host`` means no peer access: NCCL bounces through host DRAM."""

    kind: Literal["nvlink", "host"]
    bw_gbps: float  # per-GPU collective bus bandwidth
    latency_us: float = 10.0

    def __post_init__(self) -> None:
        _positive("link", bw_gbps=self.bw_gbps)


@dataclass(frozen=True)
class SwitchSpec:
    """GPUs behind one PCIe switch share its uplink to the CPU root complex."""

    gpus: tuple[int, ...]
    uplink_gbps: float  # per direction

    def __post_init__(self) -> None:
        _positive("switch", uplink_gbps=self.uplink_gbps)


@dataclass(frozen=True)
class NetworkSpec:
    """One host's network to the other hosts of a cluster: ``nics`` NICs of ``nic_gbps`` GB/s each way (a
    400 Gb/s NIC is 50 GB/s) and a per-message latency. Cross-host collectives (slidedp.routes) share the
    host's NICs; a host's traffic is modelled as one pool of ``nics x nic_gbps`` (NCCL spreads rings over
    the NICs), which assumes a non-blocking fabric between hosts."""

    nic_gbps: float  # per NIC, per direction
    nics: int = 1
    latency_us: float = 5.0

    def __post_init__(self) -> None:
        _positive("network", nic_gbps=self.nic_gbps)
        if not isinstance(self.nics, int) or self.nics < 1:
            raise SlideDPError(f"network.nics must be a positive integer, got {self.nics!r}")
        if not (0 <= self.latency_us < math.inf):
            raise SlideDPError("network.latency_us must be >= 0")

    @property
    def host_Bps(self) -> float:  # noqa: N802 - SI unit in the name
        """Bytes/s one host sends (and receives) over all its NICs."""
        return self.nic_gbps * self.nics * GB


@dataclass(frozen=True)
class HardwareProfile:
    """One host (``num_gpus`` GPUs sharing its DRAM and CPU); ``network``: its links to other hosts, needed
    only to model a run over several hosts."""

    name: str
    num_gpus: int
    gpu: GPUSpec
    host: HostSpec
    link: LinkSpec
    switches: tuple[SwitchSpec, ...] = field(default_factory=tuple)
    notes: str = ""
    network: NetworkSpec | None = None

    def __post_init__(self) -> None:
        if self.num_gpus <= 0:
            raise SlideDPError(f"hardware {self.name!r}: num_gpus must be positive")
        seen: set[int] = set()
        for sw in self.switches:
            for g in sw.gpus:
                if not 0 <= g < self.num_gpus:
                    raise SlideDPError(f"hardware {self.name!r}: switch names GPU {g}, "
                                       f"which is not in 0..{self.num_gpus - 1}")
                if g in seen:
                    raise SlideDPError(f"hardware {self.name!r}: GPU {g} sits behind two switches")
                seen.add(g)

    def switch_of(self, gpu: int) -> int | None:
        for i, sw in enumerate(self.switches):
            if gpu in sw.gpus:
                return i
        return None

    @property
    def base_name(self) -> str:
        """The profile's own name, without the ``@<gpus>`` that :meth:`with_gpus` gives a copy: what messages
        name, since the user gave that name (and --gpus)."""
        return split_cut_name(self.name)[0]

    @property
    def cut_to_fewer_gpus(self) -> bool:
        """Whether this is a copy of a profile made by :meth:`with_gpus`."""
        return split_cut_name(self.name)[1]

    def with_gpus(self, num_gpus: int) -> HardwareProfile:
        """The same machine with fewer (or more) GPUs populated, switch groups trimmed to match."""
        switches = tuple(
            SwitchSpec(tuple(g for g in sw.gpus if g < num_gpus), sw.uplink_gbps)
            for sw in self.switches
            if any(g < num_gpus for g in sw.gpus)
        )
        return HardwareProfile(f"{self.name}@{num_gpus}", num_gpus, self.gpu, self.host, self.link,
                               switches, self.notes, self.network)

    def with_gpu_of(self, other: HardwareProfile) -> HardwareProfile:
        """This host (its CPU, DRAM, update rates and links) with ``other``'s GPU: the machine a run had when
        the lent host type came with a different card than the profile was measured with (an H100 on the
        H200's host type). The GPU memory, PCIe rates and compute curves all come from ``other``."""
        return HardwareProfile(f"{self.name}+{other.name}-gpu", self.num_gpus, other.gpu, self.host, self.link,
                               self.switches, self.notes, self.network)

    def to_dict(self) -> dict:
        return to_mapping(self)

    def save(self, path: str | Path) -> None:
        write_mapping(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict, where: str = "hardware") -> HardwareProfile:
        return from_mapping(cls, data, where)


def hardware_presets() -> dict[str, Path]:
    presets_dir = Path(__file__).parent / "presets"
    return {p.stem: p for p in sorted(presets_dir.glob("*.yaml"))}


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A preset name (e.g. ``h100-sxm-x4``) or a YAML/JSON profile path."""
    presets = hardware_presets()
    key = name_or_path.lower()
    if key in presets:
        path = presets[key]
    else:
        path = Path(name_or_path)
        if path.exists() and not path.is_file():
            raise SlideDPError(f"hardware {name_or_path!r} is not a profile file (a directory or other special file)")
        if not path.is_file():
            raise SlideDPError(f"unknown hardware {name_or_path!r}: not a preset ({', '.join(presets)}) "
                               "nor an existing profile file")
    return HardwareProfile.from_dict(read_mapping(path, "hardware profile"), where=path.stem)
