"""ZeRO-2-Offload's gradient offload in series with backward (PeerSystem.serial_grad_copy): the simulated backward
grows by exactly what the rule prices from the plan's bytes and the profile's rates, the DES agrees with the
closed form, and no other peer is touched."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slidedp.compute import GPU_STATE_UPDATE_HBM_BYTES
from slidedp.hardware import load_hardware
from slidedp.peers import SYSTEMS, peer_step, simulate_peer, system_workload
from slidedp.peers.step import GRAD_SYNC_OP, PeerStep, peer_workload
from slidedp.peers.systems import DEEPSPEED_OFFLOAD_GRAD_SYNC
from tests.builders import free_machine, tiny_model, with_gpu, with_host

SYNC = DEEPSPEED_OFFLOAD_GRAD_SYNC


def _tensors(model) -> int:
    """Every parameter tensor: each layer's, the embedding, the final norm and the untied lm_head."""
    return model.layers * model.layer_tensors + 1 + (1 if model.tied_embeddings else 2)


def _phase_ends(trace):
    fwd_end = trace[trace.op == "fwd"].end_s.max()
    bwd_end = trace[trace.op.isin(["bwd", GRAD_SYNC_OP, "d2h_grad"])].end_s.max()
    return fwd_end, bwd_end


def test_backward_is_compute_plus_every_gradient_pass_read_and_copy_in_series():
    """One H200 (h200-x1 as shipped): backward = its compute + per parameter the passes' HBM bytes at the compute
    model's memory bandwidth, 11 kernels and one host read per tensor, and the fp32 copy at the D2H rate."""
    hw = load_hardware("h200-x1")
    model = tiny_model(layers=3)
    step = peer_step("zero2-offload", model, hw, 512, 2)
    fwd_end, bwd_end = _phase_ends(simulate_peer(step).trace)
    gpu, p, t = hw.gpu, model.total_params, _tensors(model)
    passes = ((SYNC.bucket_bytes + SYNC.partition_bytes) * p / (gpu.compute.memory_gbps * 1e9)
              + (SYNC.bucket_kernels + SYNC.partition_kernels) * t * gpu.compute.memory_kernel_us * 1e-6
              + SYNC.host_reads * t * gpu.pcie_latency_us * 1e-6)
    copies = 4 * p / (gpu.d2h_gbps * 1e9) + len(step.w.units) * gpu.pcie_latency_us * 1e-6
    compute = sum(u.bwd_s for u in step.w.units)
    assert bwd_end - fwd_end == pytest.approx(compute + passes + copies, rel=1e-6)
    assert step.grad_sync_total_s() == pytest.approx(passes, rel=1e-9)


def test_without_the_rule_the_copies_hide_behind_backward():
    """The same system with serial_grad_copy=None overlaps the copies: its backward is shorter by at least the
    passes and all but the last unit's copy."""
    hw = load_hardware("h200-x1")
    model = tiny_model(layers=3)
    serial = peer_step("zero2-offload", model, hw, 512, 2)
    overlapped = PeerStep(replace(SYSTEMS["zero2-offload"], serial_grad_copy=None), serial.w)
    f0, b0 = _phase_ends(simulate_peer(serial).trace)
    f1, b1 = _phase_ends(simulate_peer(overlapped).trace)
    assert f0 == pytest.approx(f1)
    assert GRAD_SYNC_OP not in set(simulate_peer(overlapped).trace.op)
    last_copy = 4 * serial.w.units[0].params / (hw.gpu.d2h_gbps * 1e9)
    assert (b0 - f0) - (b1 - f1) >= serial.grad_sync_total_s() - last_copy


@pytest.mark.parametrize("gpus", [1, 2])
def test_each_rank_runs_the_bucket_passes_on_all_and_the_partition_passes_on_its_share(gpus):
    """Per rank: bucket bytes and kernels over every parameter and tensor, partition bytes, kernels and host reads
    over 1/N of them; a profile without compute curves prices the bytes at the bandwidth of its GPU AdamW rate
    (x GPU_STATE_UPDATE_HBM_BYTES per parameter)."""
    hw = with_gpu(free_machine(gpus), adam_gparams_per_s=2.0, pcie_latency_us=7.0)
    hw = with_host(hw, peer_adam_gparams_per_s={"deepspeed_cpu_adam": {1: 1.0}})
    model = tiny_model(layers=2, tied=True)
    step = PeerStep(SYSTEMS["zero2-offload"], peer_workload(model, hw, 256, 2 * gpus))
    p, t = model.total_params, _tensors(model)
    expected = ((SYNC.bucket_bytes + SYNC.partition_bytes / gpus) * p / (2.0e9 * GPU_STATE_UPDATE_HBM_BYTES)
                + SYNC.host_reads * t / gpus * 7e-6)
    assert step.grad_sync_total_s() == pytest.approx(expected, rel=1e-9)
    trace = simulate_peer(step).trace
    per_rank = (trace[trace.op == GRAD_SYNC_OP].assign(s=lambda d: d.end_s - d.start_s).groupby("rank").s.sum())
    assert list(per_rank.index) == list(range(gpus))
    assert per_rank.to_numpy() == pytest.approx([expected] * gpus, rel=1e-9)


def test_only_zero2_offload_runs_its_offload_in_series():
    """FSDP2 (no per-parameter host read in its backward) and ZeRO-3 (stage3.py tracks overflow on the GPU) keep
    their overlapped copies; their plans have no grad_sync op."""
    assert [name for name, s in SYSTEMS.items() if s.serial_grad_copy is not None] == ["zero2-offload"]
    hw = load_hardware("h200-x1")
    for name, system in SYSTEMS.items():
        if name != "zero2-offload":
            step = PeerStep(system, system_workload(system, tiny_model(layers=2), hw, 256, 1))
            assert GRAD_SYNC_OP not in step.closed_form_totals() and step.grad_sync_total_s() == 0.0
    for name in ("zero3-offload", "fsdp2-offload", "fsdp2-resident", "ddp-resident"):  # their rates are in h200-x1
        assert GRAD_SYNC_OP not in set(simulate_peer(peer_step(name, tiny_model(layers=2), hw, 256, 1)).trace.op)


def test_the_offloads_passes_summed_per_unit_equal_the_closed_form_on_several_ranks_with_curves():
    """A rank's share of the partition passes is fractional in kernels (9/8 a tensor on 8 ranks): priced per unit
    or once over the whole model, the same seconds (nothing truncated)."""
    from slidedp.hardware import load_hardware
    from slidedp.model_spec import load_model_spec

    hw = with_host(load_hardware("h100-sxm-x8"), peer_adam_gparams_per_s={"deepspeed_cpu_adam": {1: 1.0}})
    step = PeerStep(SYSTEMS["zero2-offload"], peer_workload(load_model_spec("qwen3-4b"), hw, 4096, 8))
    assert step.n == 8 and step.w.hw.gpu.compute is not None
    per_unit = sum(step.grad_sync_s(u) for u in range(step.w.num_units))
    assert per_unit == pytest.approx(step.grad_sync_total_s(), rel=1e-9)
