"""The streaming runtime must train exactly like plain PyTorch (same model, data, AdamW, clipping)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from slidedp.policy import Policy
from slidedp.runtime.optim import OptimConfig
from tests.builders import TINY, write_config
from tests.runtime.helpers import OPTIM, batches, make_engine, reference_training

CASES = [
    ("qwen3", Policy(micro_batch=2, accumulation=2, chunks_per_layer=3)),
    ("qwen3", Policy(activation="keep", micro_batch=1, accumulation=4, chunks_per_layer=1, prefetch_depth=1)),
    ("qwen3", Policy(activation="offload", micro_batch=2, accumulation=2, chunks_per_layer=5, prefetch_depth=3)),
    ("qwen3", Policy(update_schedule="after_backward", micro_batch=4, accumulation=1, chunks_per_layer=7)),
    ("llama", Policy(activation="recompute", micro_batch=1, accumulation=4, chunks_per_layer=2)),
    ("llama", Policy(activation="keep", micro_batch=2, accumulation=2, chunks_per_layer=4, prefetch_depth=2)),
    ("llama", Policy(activation="offload", micro_batch=1, accumulation=4, chunks_per_layer=1, prefetch_depth=1)),
    ("qwen3-tied", Policy(activation="offload", micro_batch=2, accumulation=2, chunks_per_layer=2)),
    ("qwen3-tied", Policy(activation="keep", micro_batch=1, accumulation=4, chunks_per_layer=3)),
    # Leading units with their optimizer state on the GPU (embedding + layer 0; the tied matrix; every unit).
    ("qwen3", Policy(gpu_state_units=2, micro_batch=2, accumulation=2, chunks_per_layer=3)),
    ("qwen3", Policy(gpu_state_units=3, update_schedule="after_backward", activation="offload", micro_batch=4,
                     accumulation=1, chunks_per_layer=2, prefetch_depth=1)),
    ("qwen3-tied", Policy(gpu_state_units=1, activation="keep", micro_batch=1, accumulation=4, chunks_per_layer=3)),
    ("llama", Policy(gpu_state_units=4, activation="keep", micro_batch=2, accumulation=2, chunks_per_layer=4)),
]


@pytest.mark.parametrize("name, policy", CASES, ids=lambda v: v if isinstance(v, str) else
                         f"{v.activation}-{v.update_schedule}-mb{v.micro_batch}x{v.accumulation}-c{v.chunks_per_layer}"
                         f"-g{v.gpu_state_units}")
def test_matches_plain_pytorch(tmp_path, name, policy):
    seq = 16
    engine, adapter, host = make_engine(write_config(tmp_path, name), policy, seq)
    data = batches(TINY[name]["vocab_size"], seq, 4, 4, seed=1)
    initial = host.master.clone()
    stats = [engine.step(t) for t in data]
    engine.flush()
    ref_losses, ref_final = reference_training(adapter, initial, data, policy.micro_batch)
    assert [s.loss for s in stats] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert any(s.grad_norm > OPTIM.max_grad_norm for s in stats)  # clipping was active
    torch.testing.assert_close(host.master, ref_final, rtol=1e-5, atol=2e-6)
    assert not torch.equal(host.master, initial)


def test_as_ready_updates_match_without_clipping(tmp_path):
    optim = OptimConfig(lr=3e-3, weight_decay=0.1, max_grad_norm=None, warmup_steps=1, total_steps=5)
    policy = Policy(update_schedule="as_ready", micro_batch=2, accumulation=2, chunks_per_layer=3)
    engine, adapter, host = make_engine(write_config(tmp_path, "qwen3"), policy, 16, optim)
    data = batches(TINY["qwen3"]["vocab_size"], 16, 4, 3, seed=2)
    initial = host.master.clone()
    losses = [engine.step(t).loss for t in data]
    ref_losses, ref_final = reference_training(adapter, initial, data, 2, optim)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    torch.testing.assert_close(host.master, ref_final, rtol=1e-5, atol=2e-6)


def test_as_ready_refuses_to_clip(tmp_path):
    from slidedp.errors import SlideDPError

    with pytest.raises(SlideDPError, match="cannot clip"):
        make_engine(write_config(tmp_path, "qwen3"), Policy(update_schedule="as_ready"), 16)


@pytest.mark.parametrize("fused", [False, True], ids=["torch-adamw-then-cast", "one-pass-kernel"])
def test_bf16_trace_conserves_bytes_and_uses_14_bytes_per_param(tmp_path, fused):
    """In bf16 the runtime's trace moves exactly the bytes the analytical model counts, with the separate
    cast pass (torch path) and with the one-pass kernel (``HostSpec.fused_cast``)."""
    import json
    from dataclasses import replace

    from slidedp.hardware import load_hardware
    from slidedp.model.demands import op_totals
    from slidedp.model_spec import ModelSpec
    from slidedp.runtime.cpu_adam import fused_kernel
    from slidedp.runtime.device import Device
    from slidedp.runtime.engine import EngineConfig, StreamingEngine
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
    from slidedp.runtime.host_state import HostState
    from slidedp.runtime.tracing import TraceRecorder
    from slidedp.workload import StepWorkload

    path = write_config(tmp_path, "qwen3")
    policy = Policy(micro_batch=2, accumulation=2, chunks_per_layer=3, activation="offload")
    adapter = ModelAdapter(load_hf_config(path))
    host = HostState.allocate(adapter.total_params, torch.bfloat16, torch.bfloat16, pin=False)
    host.init_random(adapter, 0)
    assert host.bytes_per_param() == 14
    spec = ModelSpec.from_hf_config(json.loads(Path(path).read_text()), "tiny")
    device = Device("cpu")
    if fused and fused_kernel() is None:
        pytest.skip("the one-pass kernel does not compile here")
    engine = StreamingEngine(EngineConfig(policy, OPTIM, 16, torch.bfloat16, fused_adam=fused), adapter, spec, host,
                             device, TraceRecorder(device))
    engine.step(batches(97, 16, 4, 1)[0])
    trace = engine.step(batches(97, 16, 4, 2)[1]).trace
    hw = load_hardware("h200-x1")
    w = StepWorkload(spec, replace(hw, host=replace(hw.host, fused_cast=fused)), policy, 16, 4)
    expected = op_totals(w)
    got = trace.groupby("op")["bytes"].sum()
    for op in ("h2d_param", "d2h_grad", "d2h_ckpt", "h2d_ckpt", "adam", "cast"):
        assert got.get(op, 0.0) == pytest.approx(expected.get(op, {"bytes": 0.0})["bytes"], rel=1e-9), op
    assert ("cast" in set(trace.op)) != fused
    assert set(trace.resource) == {"gpu[0]", "h2d[0]", "d2h[0]", "cpu[0]"}
    assert trace.groupby("op")["flops"].sum()["fwd"] == pytest.approx(expected["fwd"]["flops"])


def test_fused_bf16_adamw_kernel_matches_torch():
    """The one-pass kernel (compiled on first use) equals torch's AdamW and writes the bf16 weights."""
    from slidedp.runtime.cpu_adam import fused_kernel, fused_kernel_error

    kernel = fused_kernel()
    if kernel is None:
        pytest.skip(f"no C++ toolchain: {fused_kernel_error()}")
    torch.manual_seed(0)
    n = 100_003
    p = torch.randn(n)
    m, v = torch.zeros(n), torch.zeros(n)
    ref = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([ref], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    for step in range(1, 5):
        g = (torch.randn(n) * 1e-2).bfloat16()
        slot = g.clone()
        kernel.adamw_bf16(p, m, v, slot, 1e-3, 0.9, 0.95, 1e-8, 0.1, float(step), 0.5)
        ref.grad = g.float() * 0.5
        opt.step()
        assert torch.equal(slot, p.bfloat16())
    torch.testing.assert_close(p, ref.detach(), rtol=1e-5, atol=1e-5)
    nan_slot = torch.tensor([float("nan")]).bfloat16()
    one = torch.ones(1)
    kernel.adamw_bf16(one, torch.zeros(1), torch.zeros(1), nan_slot, 1e-3, 0.9, 0.95, 1e-8, 0.0, 1.0, 1.0)
    assert torch.isnan(nan_slot).all()


def test_exact_update_is_bit_identical_to_its_operations_in_order():
    """The exact kernel (adamw_compact's fp32/fp32 loop where the CPU has AVX-512, the simple loop elsewhere) is
    each IEEE fp32 operation of AdamW in one fixed order, so numpy doing the same operations gives the same bits,
    with denormal parameters, OpenMP's split and a length off the block size. (numpy, not torch: torch's
    `scalar * a / b` differed from the exact quotient in 1 of 5,505 elements here.)"""
    from slidedp.runtime.cpu_adam import fused_kernel, fused_kernel_error

    kernel = fused_kernel()
    if kernel is None:
        pytest.skip(f"no C++ toolchain: {fused_kernel_error()}")
    gen = torch.Generator().manual_seed(3)
    n = 3 * 256 * 7 + 129
    p = torch.randn(n, generator=gen)
    m, v = torch.randn(n, generator=gen) * 1e-3, torch.rand(n, generator=gen) * 1e-6
    # Denormal parameters with zero moments and gradients stay denormal (p * decay): 4 whole vectors of 16 and
    # one mixed, so the bf16 store's denormal path runs too.
    p[:72] = torch.rand(72, generator=gen) * 1e-39
    m[:72], v[:72] = 0.0, 0.0
    rp, rm, rv = (t.numpy().copy() for t in (p, m, v))
    lr, b1, b2, eps, wd, scale = 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.5
    f32 = np.float32  # the kernel's constants: computed in double, stored as float
    for step in range(1, 4):
        slot = (torch.randn(n, generator=gen) * 1e-2).bfloat16()
        slot[:72] = 0.0
        gi = slot.float().numpy() * f32(scale)
        kernel.adamw_bf16(p, m, v, slot, lr, b1, b2, eps, wd, float(step), scale)
        rm = rm + f32(1 - b1) * (gi - rm)
        rv = f32(b2) * rv + f32(1 - b2) * gi * gi
        denom = np.sqrt(rv) * f32(1 / math.sqrt(1 - b2**step)) + f32(eps)
        rp = rp * f32(1 - lr * wd) - f32(lr / (1 - b1**step)) * rm / denom
        for got, want in ((p, rp), (m, rm), (v, rv)):
            assert np.array_equal(got.numpy().view(np.int32), want.view(np.int32)), step
        assert torch.equal(slot.view(torch.int16), torch.from_numpy(rp).bfloat16().view(torch.int16))
        assert (p[:72].abs() < 1.1754944e-38).all() and (p[:72] != 0).any()  # still denormal: the path ran


def test_gpu_state_survives_checkpoints_and_reloads(tmp_path):
    """GPU-held units are written back at every flush (checkpoint) and reloaded when the host state changes
    under them (a resume), and training still equals plain PyTorch."""
    policy = Policy(gpu_state_units=3, micro_batch=2, accumulation=2, chunks_per_layer=2)
    config = write_config(tmp_path, "qwen3")
    engine, adapter, host = make_engine(config, policy, 16)
    data = batches(TINY["qwen3"]["vocab_size"], 16, 4, 4, seed=3)
    initial = host.master.clone()
    losses = [engine.step(t).loss for t in data[:2]]
    engine.flush()
    host.save(tmp_path / "ckpt", {"data_step": 2})
    losses.append(engine.step(data[2]).loss)  # keeps training on the same replica after the write-back
    engine.close()
    resumed, _, host2 = make_engine(config, policy, 16)
    host2.load(tmp_path / "ckpt")
    resumed_losses = [resumed.step(t).loss for t in data[2:]]
    resumed.flush()
    assert resumed_losses[0] == pytest.approx(losses[2], rel=1e-6)
    ref_losses, ref_final = reference_training(adapter, initial, data, policy.micro_batch)
    assert losses + resumed_losses[1:] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(host2.master, ref_final, rtol=1e-5, atol=2e-6)


def test_gpu_state_units_move_nothing_over_pcie(tmp_path):
    """The trace of a step with GPU-held units has no copies or CPU updates for them, one gpu_adam launch,
    and the bytes the analytical model counts."""
    import json
    from dataclasses import replace

    from slidedp.hardware import load_hardware
    from slidedp.model.demands import op_totals
    from slidedp.model_spec import ModelSpec
    from slidedp.workload import StepWorkload

    policy = Policy(gpu_state_units=2, micro_batch=2, accumulation=2, chunks_per_layer=3)
    path = write_config(tmp_path, "qwen3")
    engine, _, _ = make_engine(path, policy, 16)
    data = batches(97, 16, 4, 2, seed=4)
    engine.step(data[0])
    trace = engine.step(data[1]).trace
    host_ops = trace[trace.op.isin(["h2d_param", "d2h_grad", "adam", "cast"])]
    assert set(host_ops.unit) == {2, 3, 4}
    assert (trace.op == "gpu_adam").sum() == 1
    spec = ModelSpec.from_hf_config(json.loads(Path(path).read_text()), "tiny")
    hw = load_hardware("h200-x1")
    w = StepWorkload(spec, replace(hw, host=replace(hw.host, fused_cast=False)),
                     policy.with_(grad_dtype="fp32"), 16, 4)
    expected = op_totals(w)
    got = trace.groupby("op")["bytes"].sum()
    assert got["h2d_param"] == pytest.approx(2 * expected["h2d_param"]["bytes"], rel=1e-9)  # fp32 weights here
    assert got["d2h_grad"] == pytest.approx(expected["d2h_grad"]["bytes"], rel=1e-9)
    assert set(got.index) == set(expected)


def test_embedding_is_not_fetched_again_for_backward(tmp_path):
    """The embedding's backward (an index-add into the looked-up rows) reads no weights: one H2D of the streamed
    (untied) embedding per step, while a layer that left the GPU is fetched twice; training is unchanged (the
    tied, pinned embedding is covered by test_matches_plain_pytorch)."""
    name = "qwen3"
    policy = Policy(micro_batch=2, accumulation=2, chunks_per_layer=3, prefetch_depth=1)
    engine, adapter, host = make_engine(write_config(tmp_path, name), policy, 16)
    data = batches(TINY[name]["vocab_size"], 16, 4, 2, seed=5)
    initial = host.master.clone()
    stats = [engine.step(t) for t in data]
    engine.flush()
    for s in stats:
        h2d = s.trace[s.trace.op == "h2d_param"]
        assert (h2d.unit == 0).sum() == 3 and (h2d.unit == 1).sum() == 6
    ref_losses, ref_final = reference_training(adapter, initial, data, policy.micro_batch)
    assert [s.loss for s in stats] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    # Each element's total update within 0.5% of plain PyTorch's: an element whose gradient is near Adam's eps
    # moves by a ratio that float reassociation can shift (on an AVX-512 CPU one element of 34,128 lands 4e-6
    # from the reference, 0.25% of its 1.7e-3 update, the rest within 6e-8); a fetch that dropped the
    # embedding's gradient or trained on stale weights would miss by whole updates.
    torch.testing.assert_close(host.master - initial, ref_final - initial, rtol=5e-3, atol=2e-6)
