"""One training step of a model on a machine under a policy: every quantity it moves or computes.

Both the analytical model and the discrete-event simulator consume a :class:`StepWorkload`, so they agree
on every byte and FLOP by construction; the conservation tests rely on that. The rules it combines each
live in their own module: units and their work (slidedp.units), routes, chunk ownership and bytes per
parameter (slidedp.routes), resources and CPU-pass bytes (slidedp.resources).
"""

from __future__ import annotations

from functools import cached_property

from slidedp.compute import BF16, check_attention, check_precision, gpu_state_update_op
from slidedp.errors import SlideDPError
from slidedp.hardware import GB, GPUSpec, HardwareProfile
from slidedp.model_spec import BF16_BYTES, ModelSpec
from slidedp.policy import Policy
from slidedp.resources import CAST_HOST_BYTES, cast_host_bytes_per_param, update_host_bytes_per_param
from slidedp.routes import Routes
from slidedp.state_precision import EXACT, StatePrecision
from slidedp.units import (
    Unit,
    UnitWork,
    check_gpu_state_units,
    refetched_in_backward,
    resident_in_backward,
    time_units,
    unit_work,
)


def default_adam_threads(hw: HardwareProfile, policy: Policy) -> int:
    """Threads of each rank's CPU optimizer worker: the policy's, or the host's cores split evenly by rank."""
    if policy.adam_threads is not None:
        return policy.adam_threads
    return max(1, hw.host.cores // hw.num_gpus)


def threads_for_this_machine(planned: int, cores: int, ranks_per_host: int) -> int:
    """The optimizer threads a rank runs with on the machine it is on: the plan's, but never more than this
    machine's cores split by its ranks. A profile (or a tuned policy) written for a larger host would otherwise
    oversubscribe the cores, and the CPU update would run slower than with fewer threads (the workers of several
    ranks contend for the same cores)."""
    return max(1, min(planned, cores // max(1, ranks_per_host)))


def unit_inputs(policy: Policy) -> tuple:
    """The policy fields a step's units depend on (those policy_unit_work reads): a cache key for units."""
    return (policy.activation, policy.micro_batch, policy.accumulation, policy.loss_chunk_tokens,
            policy.seq_tile_tokens, policy.kept_layers)


def policy_unit_work(model: ModelSpec, policy: Policy, seq: int, attention_span: float | None = None,
                     attention: str = "sdpa", precision: str = BF16) -> tuple[UnitWork, ...]:
    """unit_work for the fields of ``policy`` it depends on (unit_inputs): the one place that maps a policy to
    its units' work, for the runtime (which layers recompute, the trace's FLOPs) and, timed by policy_units, for
    the workload, the tuner's cache and the calibration's refits."""
    return unit_work(model, policy.activation, policy.micro_batch, policy.accumulation, seq,
                     policy.loss_chunk_tokens, policy.seq_tile_tokens, attention_span, attention, policy.kept_layers,
                     precision)


def policy_units(model: ModelSpec, gpu: GPUSpec, policy: Policy, seq: int, attention_span: float | None = None,
                 attention: str = "sdpa", precision: str = BF16) -> tuple[Unit, ...]:
    """The units of ``policy_unit_work`` timed on ``gpu``."""
    return time_units(policy_unit_work(model, policy, seq, attention_span, attention, precision), gpu)


class StepWorkload:
    """Model x hardware x policy x (seq, global batch): every quantity one step moves or computes.

    ``hw`` is one host; ``hosts`` identical hosts run the step together (``global_batch`` counts all of their
    ranks' sequences). Per-rank and per-host quantities are those of any one host: the hosts are symmetric,
    so the simulator runs one host's ranks with the cross-host collectives as flows on its NICs.
    """

    def __init__(self, model: ModelSpec, hw: HardwareProfile, policy: Policy, seq: int, global_batch: int,
                 units: tuple[Unit, ...] | None = None, hosts: int = 1, attention_span: float | None = None,
                 attention: str = "sdpa", precision: str = BF16):
        if not isinstance(seq, int) or seq < 1:
            raise SlideDPError(f"sequence length must be a positive integer, got {seq!r}")
        if not isinstance(global_batch, int) or global_batch < 1:
            raise SlideDPError(f"batch must be a positive integer, got {global_batch!r}")
        n = hw.num_gpus
        if not isinstance(hosts, int) or hosts < 1:
            raise SlideDPError(f"hosts must be a positive integer, got {hosts!r}")
        if hosts > 1 and hw.network is None:
            raise SlideDPError(f"hardware {hw.base_name!r} has no network section: a run over {hosts} hosts needs the "
                               f"hosts' NICs (e.g. the h100-sxm-x8-ib preset)")
        if global_batch != hosts * n * policy.sequences_per_rank():
            where = f"hosts {hosts} x " if hosts > 1 else ""
            raise SlideDPError(
                f"batch {global_batch} != {where}GPUs {n} x micro_batch {policy.micro_batch} x accumulation "
                f"{policy.accumulation} = {hosts * n * policy.sequences_per_rank()}")
        check_gpu_state_units(policy.gpu_state_units, model.layers + 2)
        if attention_span is not None and not 0 < attention_span <= seq:
            raise SlideDPError(f"attention span must be in (0, seq {seq}], got {attention_span!r}")
        check_attention(attention)
        check_precision(precision)
        threads = default_adam_threads(hw, policy)
        if threads * n > hw.host.cores:
            raise SlideDPError(f"policy.adam_threads {threads} x {n} ranks exceeds the host's {hw.host.cores} cores")
        self.model, self.hw, self.policy = model, hw, policy
        self.seq, self.global_batch, self.ranks, self.hosts = seq, global_batch, n, hosts
        self.attention_span = attention_span  # packed rows through the varlen kernel (slidedp.units.attention_span)
        self.attention = attention  # sdpa (flash), or eager: a peer's kernel (ModelSpec.layer_forward_ops)
        self.precision = precision  # bf16, or amp-fp32: a peer's numerics (slidedp.compute.PRECISIONS)
        self.routes = Routes.of(policy, n, weight_bytes=BF16_BYTES, hosts=hosts)
        self.chunks = policy.chunks_per_layer
        self.adam_threads = threads
        self.tokens_per_rank = seq * policy.sequences_per_rank()
        self.tokens_per_micro_batch = seq * policy.micro_batch
        if units is not None:  # precomputed (policy_units) for the same model, GPU, activation, batching and tile
            self.__dict__["units"] = units

    def with_policy(self, policy: Policy) -> StepWorkload:
        """The same step under ``policy``: every other input kept (hosts and attention span included), and the
        units reused where the policy's unit inputs (activation, batching, loss chunk, tile) are unchanged."""
        same = unit_inputs(policy) == unit_inputs(self.policy)
        return StepWorkload(self.model, self.hw, policy, self.seq, self.global_batch,
                            units=self.units if same else None, hosts=self.hosts, attention_span=self.attention_span,
                            attention=self.attention, precision=self.precision)

    # ---- units ----------------------------------------------------------------------------------------------
    @cached_property
    def units(self) -> tuple[Unit, ...]:
        return policy_units(self.model, self.hw.gpu, self.policy, self.seq, self.attention_span, self.attention,
                            self.precision)

    @property
    def num_units(self) -> int:
        return len(self.units)

    @cached_property
    def _resident(self) -> tuple[bool, ...]:
        return resident_in_backward(self.units, self.policy.prefetch_depth, self.policy.gpu_state_units)

    def gpu_state(self, u: int) -> bool:
        """Unit ``u`` keeps its optimizer state on the GPU: nothing of it crosses PCIe or touches the CPU."""
        return u < self.policy.gpu_state_units

    def gpu_adam_s(self, u: int) -> float:
        """Seconds of the GPU-side AdamW (clip scale, update, bf16 refresh) of a GPU-state unit
        (GPUSpec.optimizer_pass_seconds: without a measured optimizer bandwidth, calibrate's rate of this pass)."""
        if not self.gpu_state(u):
            return 0.0
        return self.hw.gpu.optimizer_pass_seconds(gpu_state_update_op(self.units[u].params))

    def allreduce_bytes(self, u: int) -> float:
        """Per-rank ring all-reduce bytes of a GPU-state unit's fp32 gradient (every rank keeps a replica)."""
        return self.routes.allreduce_bytes(self.units[u].params) if self.gpu_state(u) else 0.0

    def resident_in_backward(self, u: int) -> bool:
        """The last ``prefetch_depth`` units of the forward are still on the GPU when backward starts."""
        return self._resident[u]

    @cached_property
    def _refetched(self) -> tuple[bool, ...]:
        return refetched_in_backward(self.units, self.policy.prefetch_depth, self.policy.gpu_state_units)

    def refetched_in_backward(self, u: int) -> bool:
        """Backward copies unit ``u``'s weights in again: it left the GPU and its backward reads them (not the
        embedding's, see slidedp.units.backward_reads_weights)."""
        return self._refetched[u]

    def offloads_checkpoint(self, u: int) -> bool:
        return self.units[u].checkpoint_bytes > 0 and not self.resident_in_backward(u)

    # ---- per-chunk traffic (per rank) -------------------------------------------------------------------
    def h2d_param_bytes(self, u: int) -> float:
        return self.routes.h2d_param_factor * self.units[u].params / self.chunks

    def allgather_bytes(self, u: int) -> float:
        return self.routes.allgather_factor * self.units[u].params / self.chunks

    def d2h_grad_bytes(self, u: int) -> float:
        return self.routes.d2h_grad_factor * self.units[u].params / self.chunks

    def reduce_scatter_bytes(self, u: int) -> float:
        return self.routes.reduce_scatter_factor * self.units[u].params / self.chunks

    # ---- CPU update jobs --------------------------------------------------------------------------------
    def update_owners(self, u: int, c: int) -> tuple[tuple[int, float], ...]:
        """(rank, params) pairs whose optimizer worker updates chunk ``c`` of unit ``u`` (see Routes)."""
        owners = self.routes.chunk_owners(u, c)
        params = self.units[u].params / self.chunks * self.routes.host_state_fraction  # this host's part
        return tuple((r, params / len(owners)) for r in owners)

    # ---- across hosts (per host; zero on one host) -------------------------------------------------------
    def nic_grad_bytes(self, u: int) -> float:
        """Bytes a host sends over its NICs for one chunk's gradient (all-reduce or reduce-scatter)."""
        return self.routes.nic_grad_factor * self.units[u].params / self.chunks

    def nic_weight_bytes(self, u: int) -> float:
        """Bytes a host receives over its NICs for one chunk's new weights (sharded: the all-gather)."""
        return self.routes.nic_weight_factor * self.units[u].params / self.chunks

    @property
    def nic_grad_op(self) -> str | None:
        """Trace op of the gradient's cross-host collective (None on one host)."""
        if self.hosts == 1:
            return None
        return "host_reduce_scatter" if self.routes.shards_hosts else "host_allreduce"

    @property
    def nic_grad_from_host(self) -> bool:
        """The cross-host gradient collective runs on the CPU sums in host memory (per-rank route), not on the
        GPU's reduced shards."""
        return self.hosts > 1 and self.routes.cpu_reduces

    def nic_cap(self) -> float:
        return self.hw.network.host_Bps if self.hw.network is not None else float("inf")

    @property
    def nic_latency(self) -> float:
        return self.hw.network.latency_us * 1e-6 if self.hw.network is not None else 0.0

    def cpu_reduce_host_bytes(self, params: float) -> float:
        """Read N gradient copies and write their sum (zero unless the CPU sums per-rank copies)."""
        return self.routes.cpu_reduce_bytes_per_param * params

    @cached_property
    def state(self) -> StatePrecision:
        """Precision of the host optimizer state (the policy's); GPU-held units keep fp32 state whatever it is."""
        return self.policy.state_precision

    @cached_property
    def adam_bytes_per_param(self) -> float:
        """DRAM bytes per parameter of the CPU optimizer update in the host state's precision (28 for exact fp32
        state with bf16 gradients and the one-pass kernel; see slidedp.resources.update_host_bytes_per_param)."""
        return update_host_bytes_per_param(self.state, self.policy.grad_bytes, self.hw.host.fused_cast)

    def adam_host_bytes(self, params: float) -> float:
        return self.adam_bytes_per_param * params

    def cast_host_bytes(self, params: float) -> float:
        """Zero when the optimizer kernel writes the bf16 copy itself (``HostSpec.fused_cast``) or the master is
        itself bf16 (nothing to cast)."""
        return cast_host_bytes_per_param(self.state, self.hw.host.fused_cast) * params

    @cached_property
    def state_update_rate_measured(self) -> bool:
        """Whether the host profile has measured the update rate of this state precision (fp32 always is);
        otherwise ``state_update_params_per_s`` is derived from the fp32 rate (see there)."""
        return self.hw.host.measured_state_update_rate(self.state.name, self.adam_threads) is not None

    @cached_property
    def state_update_params_per_s(self) -> float:
        """Parameters per second one rank's optimizer worker updates in the host state's precision, inside a
        training step: the host's measured rate of that mode, or else (an assumption until calibrated) the exact
        fp32 rate scaled by DRAM bytes, i.e. the mode's pass moves DRAM bytes exactly as fast as the fp32 pass
        does (which ignores the arithmetic a compact mode adds, so it is an upper bound where the pass stops
        being DRAM-bound); divided by the host's step_update_factor (what a step adds beside the pass)."""
        host = self.hw.host
        measured = host.measured_state_update_rate(self.state.name, self.adam_threads)
        if measured is None:
            fp32_bytes = update_host_bytes_per_param(EXACT, self.policy.grad_bytes, host.fused_cast)
            measured = host.adam_rate(self.adam_threads) * fp32_bytes / self.adam_bytes_per_param
        return measured / host.step_update_factor

    @property
    def state_update_rate_needs_saying(self) -> bool:
        """Whether outputs print state_update_rate_note: the rate is derived, not measured, or a step prices the
        update slower than it was measured alone (host.step_update_factor)."""
        return (not self.state_update_rate_measured or self.hw.host.step_update_factor != 1.0
                or self.update_call_latency > 0)

    @property
    def state_update_rate_note(self) -> str:
        """One line saying where the update rate comes from, for outputs that print predictions."""
        rate = self.state_update_params_per_s / 1e9
        factor = self.hw.host.step_update_factor
        in_step = (f"; {rate * factor:.2f} alone / {factor:.3g}, host.step_update_factor, in a step"
                   if factor != 1.0 else "")
        if self.update_call_latency > 0:
            in_step += f"; + {self.update_call_latency * 1e6:.0f} us a call, host.update_call_us"
        if self.state_update_rate_measured:
            return f"CPU update rate of {self.state.name} state: {rate:.2f} G params/s (measured{in_step})"
        return (f"CPU update rate of {self.state.name} state: {rate:.2f} G params/s, DERIVED from the measured fp32 "
                f"rate by DRAM bytes ({self.adam_bytes_per_param:g} vs "
                f"{update_host_bytes_per_param(EXACT, self.policy.grad_bytes, self.hw.host.fused_cast):g} B/param), "
                f"not measured on this host{in_step}")

    def cpu_update_host_bytes_per_param(self) -> tuple[float, float, float]:
        """DRAM bytes per parameter of the model of the three CPU passes of an update on one host: gradient
        sum, AdamW, cast (the last two over this host's share only when sharded across hosts)."""
        share = self.routes.host_state_fraction
        return self.cpu_reduce_host_bytes(1.0), share * self.adam_host_bytes(1.0), share * self.cast_host_bytes(1.0)

    def cpu_update_seconds_per_param(self) -> float:
        """Seconds one rank's optimizer worker spends per parameter of the model on its passes, each alone at
        its rate."""
        reduce_b, adam_b, cast_b = self.cpu_update_host_bytes_per_param()
        return (reduce_b / self.cpu_reduce_cap() if reduce_b else 0.0) + adam_b / self.adam_cap() \
            + cast_b / self.cast_cap()

    # CPU passes are flows over DRAM capped by the worker's compute rate, expressed in DRAM bytes/s.
    def cpu_reduce_cap(self) -> float:
        return self.hw.host.stream_rate(self.adam_threads)

    def adam_cap(self) -> float:
        return self.state_update_params_per_s * self.adam_bytes_per_param

    def cast_cap(self) -> float:
        return self.hw.host.cast_rate(self.adam_threads) * CAST_HOST_BYTES

    def collective_cap(self) -> float:
        return self.hw.link.bw_gbps * GB

    # ---- latencies ---------------------------------------------------------------------------------------
    @property
    def pcie_latency(self) -> float:
        return self.hw.gpu.pcie_latency_us * 1e-6

    @property
    def update_call_latency(self) -> float:
        """Seconds one call of the CPU update of this state mode costs beside its parameters
        (host.update_call_us): one call per chunk each owner updates."""
        return self.hw.host.update_call_seconds(self.state.name)

    def update_calls(self, u: int) -> int:
        """CPU update calls of unit ``u`` in a step, over all ranks (none for a GPU-state unit)."""
        return 0 if self.gpu_state(u) else self.chunks * self.routes.owners_per_chunk

    @property
    def link_latency(self) -> float:
        return self.hw.link.latency_us * 1e-6

    # ---- totals ------------------------------------------------------------------------------------------
    @property
    def tokens_per_step(self) -> int:
        return self.seq * self.global_batch

    def model_flops_per_step(self) -> float:
        """Useful FLOPs (fwd + bwd, no recompute) for the whole step: the TFLOPS numerator."""
        return self.model.train_flops_per_token(self.seq, self.attention_span) * self.tokens_per_step
