"""Resolve CLI-level inputs (names, paths, sizes) into a checked StepWorkload.

Shared by simulate, tune, sweep and train so that every command validates the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, HardwareProfile, load_hardware
from slidedp.model_spec import ModelSpec, load_model_spec
from slidedp.policy import Policy, default_policy, load_policy_for
from slidedp.workload import StepWorkload

HOST_USABLE_FRACTION = 0.9  # leave room for the OS, the Python processes and page cache
GPU_USABLE_FRACTION = 0.92  # leave room for allocator fragmentation and the memory model's error (about 5%)
# After a plan ran out of GPU memory, plan again for this fraction of its budget (the memory model errs by up to
# ~20%): what `slidedp train`'s out-of-memory line suggests and what peer_compare's drivers do.
REPLAN_BUDGET_FRACTION = 0.85


@dataclass(frozen=True)
class Budget:
    gpu_bytes: float
    host_bytes: float


def resolve_hardware(name: str, gpus: int | None) -> HardwareProfile:
    hw = load_hardware(name)
    if gpus is not None and gpus != hw.num_gpus:
        if gpus > hw.num_gpus:
            raise SlideDPError(f"--gpus {gpus}: hardware {hw.name!r} has only {hw.num_gpus} GPU(s)")
        hw = hw.with_gpus(gpus)
    return hw


def gpu_memory_gib(hw: HardwareProfile, device_gib: float | None) -> float:
    """The GPU memory a run has: the profile's card or, where the card the run will have is known (``device_gib``,
    a rank's share of it: slidedp.runtime.device.rank_gpu_gib) and smaller, that."""
    return hw.gpu.memory_gib if device_gib is None else min(hw.gpu.memory_gib, device_gib)


def resolve_budget(hw: HardwareProfile, gpu_budget_gib: float | None, host_limit_gib: float | None,
                   device_gib: float | None = None) -> Budget:
    """The memory a plan may use. Without ``--gpu-budget``: the usable fraction of the profile's GPU or, where
    the GPU the run will have is known (``device_gib``) and smaller, of that one, so that a profile of a larger
    card (h200-x1's 139 GiB on an 80 GiB H100) does not plan what the card cannot hold."""
    gpu = _gpu_budget(hw, gpu_budget_gib, GPU_USABLE_FRACTION * gpu_memory_gib(hw, device_gib))
    host = (host_limit_gib if host_limit_gib is not None else HOST_USABLE_FRACTION * hw.host.memory_gib) * GIB
    return Budget(gpu, host)


def capacity_budget(hw: HardwareProfile, gpu_budget_gib: float | None, host_limit_gib: float | None) -> Budget:
    """Whether a run fits at all: a peer's predicted run, a sweep's rows. The GPU's and the host's whole memory
    unless limits are given; planning (:func:`resolve_budget`) keeps margins below both, but a prediction of
    what a system does holds it to what the machine has (DeepSpeed ZeRO-2-Offload ran Qwen3-4B at 115.9 GiB RSS
    on h200-x1's 125.8 GiB host, above the planning margin's 113.2; benchmarks/RESULTS.md)."""
    gpu = _gpu_budget(hw, gpu_budget_gib, hw.gpu.memory_gib)
    return Budget(gpu, (host_limit_gib if host_limit_gib is not None else hw.host.memory_gib) * GIB)


def _gpu_budget(hw: HardwareProfile, given_gib: float | None, default_gib: float) -> float:
    """Bytes of GPU memory: ``--gpu-budget`` where given (never above the GPU's memory), else the default."""
    if given_gib is not None and given_gib > hw.gpu.memory_gib:
        raise SlideDPError(f"--gpu-budget {given_gib} GiB exceeds the GPU's {hw.gpu.memory_gib} GiB")
    return (given_gib if given_gib is not None else default_gib) * GIB


def resolve_policy(path: str | None, batch: int, hw: HardwareProfile, hosts: int = 1) -> Policy:
    if path is None:
        return default_policy(batch, hw.num_gpus * hosts)
    ranks = hw.num_gpus * hosts
    return load_policy_for(path, batch // ranks if batch % ranks == 0 else None)


def checked_span(span: float | None, seq: int) -> float | None:
    """``--attention-span``: at most the sequence (a row's examples cannot be longer than the row)."""
    if span is not None and span > seq:
        raise SlideDPError(f"--attention-span {span:g} exceeds --seq {seq}: examples packed into a row are at "
                           f"most the row long")
    return span


def resolve_problem(model: str, hardware: str, gpus: int | None, seq: int, batch: int, policy_path: str | None,
                    hosts: int = 1, attention_span: float | None = None
                    ) -> tuple[ModelSpec, HardwareProfile, Policy, StepWorkload]:
    spec = load_model_spec(model)
    hw = resolve_hardware(hardware, gpus)
    policy = resolve_policy(policy_path, batch, hw, hosts)
    return spec, hw, policy, StepWorkload(spec, hw, policy, seq, batch, hosts=hosts,
                                          attention_span=checked_span(attention_span, seq))
