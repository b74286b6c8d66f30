"""Shape-aware compute: the operations of each architecture, their costs summing to unit times, and fits that
recover known curves from synthetic, noisy measurements (never wall-clock timing of this machine)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from slidedp import compute as c
from slidedp.calibration.shape_bench import GPU_ATTENTION, GPU_ELEMENTWISE, GPU_GEMMS, GPU_HEADS
from slidedp.calibration.shape_fit import ShapeSamples, fit_curves, head_sample, samples_from_json, samples_to_json
from slidedp.errors import SlideDPError
from slidedp.hardware import load_hardware
from slidedp.model_spec import ModelSpec, load_model_spec
from slidedp.units import build_units

CURVES = c.ComputeCurves(gemm_tflops=700.0, gemm_half_m=120.0, gemm_half_n=60.0, gemm_half_k=90.0,
                         attention_fwd_tflops=450.0, attention_bwd_tflops=330.0, attention_half_seq=900.0,
                         memory_gbps=3300.0, kernel_us=6.0, layer_overhead_us=150.0, backward_overhead_us=400.0,
                         attention_fwd_us=40.0, attention_bwd_us=250.0,
                         memory_gbps_by_kind={"logits": 1900.0})

ARCHS = {
    "llama": ModelSpec("llama", 4, 3072, 8192, 24, 8, 128, 128256),
    "qwen2": ModelSpec("qwen2", 4, 2048, 11008, 16, 2, 128, 151936, tied_embeddings=True, attn_bias=True),
    "qwen3": ModelSpec("qwen3", 4, 2048, 6144, 16, 8, 128, 151936, tied_embeddings=True, qk_norm=True),
    "mistral": ModelSpec("mistral", 4, 4096, 14336, 32, 8, 128, 32000),
}


@pytest.mark.parametrize("name", list(ARCHS))
def test_layer_ops_have_the_models_flops(name):
    m = ARCHS[name]
    ops = m.layer_forward_ops(2, 1024)
    gemm = sum(op.flops for op in ops if isinstance(op, c.Gemm))
    attn = sum(op.flops for op in ops if isinstance(op, c.Attention))
    tokens = 2 * 1024
    # Biases and q/k norms are parameters without matmul FLOPs: the counts agree to their share.
    assert gemm == pytest.approx(m.layer_linear_flops_per_token() * tokens, rel=2e-3)
    assert attn == pytest.approx(m.layer_attention_flops_per_token(1024) * tokens)
    names = {op.name for op in ops if isinstance(op, c.Elementwise)}
    assert ("qkv_bias" in names) == m.attn_bias and ("qk_norm" in names) == m.qk_norm
    back = c.backward_ops(ops)
    assert sum(op.flops for op in back if isinstance(op, c.Gemm)) == pytest.approx(2 * gemm)


def test_operation_costs_sum_to_the_unit_times():
    hw = load_hardware("h200-x1")
    gpu = replace(hw.gpu, compute=CURVES)
    m = ARCHS["qwen3"]
    for activation, mb, acc in (("recompute", 2, 3), ("keep", 1, 1), ("offload", 4, 2)):
        units = build_units(m, gpu, activation, mb, acc, 512, loss_chunk_tokens=300)
        layer, head, embed = units[1], units[-1], units[0]
        fwd_ops = m.layer_forward_ops(mb, 512)
        one_fwd = CURVES.total_seconds(fwd_ops) + CURVES.layer_overhead_us * 1e-6
        one_bwd = CURVES.total_seconds(c.backward_ops(fwd_ops)) + CURVES.backward_overhead_us * 1e-6
        if activation != "keep":
            one_bwd += one_fwd
        grads = CURVES.total_seconds(c.gradient_ops(m.layer_params, m.layer_tensors, acc))
        assert layer.fwd_s == pytest.approx(acc * one_fwd)
        assert layer.bwd_s == pytest.approx(acc * one_bwd + grads)
        h_fwd, h_bwd = m.head_ops(mb * 512, 300)
        full, rest = divmod(mb * 512, 300)  # full logits chunks (one GEMM op counted `full` times) + the rest
        assert [(op.m, op.count) for op in h_fwd if isinstance(op, c.Gemm)] == [(300, full), (rest, 1)]
        assert head.fwd_s == pytest.approx(acc * CURVES.total_seconds(h_fwd))
        assert head.bwd_s == pytest.approx(acc * CURVES.total_seconds(h_bwd)
                                           + CURVES.total_seconds(c.gradient_ops(m.head_params, 1, 0)))
        assert embed.fwd_s > 0 and embed.bwd_s > embed.fwd_s


def test_without_curves_the_layer_level_model_is_unchanged():
    hw = load_hardware("h200-x1")
    hw = replace(hw, gpu=replace(hw.gpu, compute=None))
    m = load_model_spec("qwen3-4b")
    units = build_units(m, hw.gpu, "recompute", 1, 1, 4096)
    lin = m.layer_linear_flops_per_token() * 4096
    att = m.layer_attention_flops_per_token(4096) * 4096
    fwd = hw.gpu.linear_time(lin, 4096) + hw.gpu.attention_time(att) + hw.gpu.layer_overhead_us * 1e-6
    assert units[1].fwd_s == pytest.approx(fwd, rel=1e-12)


def _synthetic(curves: c.ComputeCurves, noise: float, seed: int = 0) -> ShapeSamples:
    rng = np.random.default_rng(seed)

    def jitter(t: float) -> float:
        return t * float(np.exp(rng.normal(0.0, noise)))

    s = ShapeSamples()
    s.gemm = [(op, jitter(curves.seconds(op))) for op in (c.Gemm(*shape) for shape in GPU_GEMMS)]
    for b, seq, h, kv, d in GPU_ATTENTION:
        for backward in (False, True):
            op = c.Attention(b, seq, h, kv, d, backward)
            s.attention.append((op, jitter(curves.seconds(op))))
    for tokens, width in GPU_ELEMENTWISE:
        for module in (c.RMSNORM, c.SWIGLU, c.RESIDUAL):
            op = c.Elementwise("x", tokens * width * module.fwd_bytes, module.fwd_kernels)
            s.elementwise.append((op, jitter(curves.seconds(op))))
    for tokens, hidden, vocab in GPU_HEADS:
        shape, ops, _ = head_sample(tokens, hidden, vocab, 0.0)
        s.heads.append((shape, ops, jitter(curves.total_seconds(ops))))
    m = ARCHS["llama"]
    for seq, batch in ((1024, 1), (4096, 1), (4096, 4)):
        ops = m.layer_forward_ops(batch, seq)
        s.layers.append(("fwd", ops, jitter(curves.total_seconds(ops) + curves.layer_overhead_us * 1e-6)))
    return s


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_fit_recovers_known_curves_from_noisy_samples(noise):
    fit = fit_curves(_synthetic(CURVES, noise), peak_tflops=989.0, peak_memory_gbps=4800.0)
    got = fit.curves
    tol = 0.02 if noise == 0 else 0.12
    assert got.gemm_tflops == pytest.approx(CURVES.gemm_tflops, rel=tol)
    assert got.attention_fwd_tflops == pytest.approx(CURVES.attention_fwd_tflops, rel=tol)
    assert got.attention_bwd_tflops == pytest.approx(CURVES.attention_bwd_tflops, rel=tol)
    assert got.memory_gbps == pytest.approx(CURVES.memory_gbps, rel=tol)
    assert got.memory_gbps_by_kind["logits"] == pytest.approx(1900.0, rel=tol)
    # The loss head of a vocabulary and width the head samples never had, priced like the true curves.
    for m in ARCHS.values():
        fwd, bwd = m.head_ops(8192, 4096)
        assert got.total_seconds(fwd + bwd) == pytest.approx(CURVES.total_seconds(fwd + bwd), rel=0.03 + noise)
    # What matters: a layer of an architecture the fit never saw is priced like the true curves price it.
    for m in ARCHS.values():
        for batch, seq in ((1, 2048), (8, 4096), (1, 32768)):
            ops = m.layer_forward_ops(batch, seq)
            ops_b = c.backward_ops(ops)
            assert got.total_seconds(ops) == pytest.approx(CURVES.total_seconds(ops), rel=0.05 + noise)
            assert got.total_seconds(ops_b) == pytest.approx(CURVES.total_seconds(ops_b), rel=0.05 + noise)
    assert all(r < 0.02 + 2 * noise for r in fit.residuals.values())
    assert not [w for w in fit.warnings if "not credible" in w]
    # Attention far beyond the longest sample (32K) and at the shortest, where the fixed cost per call
    # dominates: both priced like the true curves, in each direction.
    for seq, batch in ((262144, 1), (1024, 1)):
        for backward in (False, True):
            op = c.Attention(batch, seq, 40, 8, 128, backward)
            assert got.seconds(op) == pytest.approx(CURVES.seconds(op), rel=0.03 + 2 * noise)


def test_attention_fixed_cost_defaults_to_the_kernel_cost():
    """Profiles fitted before the attention fixed costs existed price attention exactly as they did."""
    old = replace(CURVES, attention_fwd_us=None, attention_bwd_us=None)
    op = c.Attention(1, 4096, 32, 8, 128, backward=True)
    assert old.seconds(op) - replace(old, kernel_us=0.0).seconds(op) == pytest.approx(old.kernel_us * 1e-6)
    assert CURVES.seconds(op) - replace(CURVES, attention_bwd_us=0.0).seconds(op) == pytest.approx(250e-6)


def test_a_fit_that_runs_into_the_chips_peak_is_flagged():
    fast = replace(CURVES, gemm_tflops=2000.0)
    fit = fit_curves(_synthetic(fast, 0.0), peak_tflops=989.0, peak_memory_gbps=4800.0)
    assert any("gemm_tflops" in w and "not credible" in w for w in fit.warnings)


def test_a_logits_bandwidth_at_the_chips_peak_is_flagged():
    """Loss heads faster than any logits bandwidth up to the chip's could make them: the head fit runs into the
    peak and says so, like every other fitted bandwidth."""
    fast = replace(CURVES, memory_gbps_by_kind={"logits": 1e6})
    fit = fit_curves(_synthetic(fast, 0.0), peak_tflops=989.0, peak_memory_gbps=4800.0)
    assert any("memory_gbps_by_kind.logits" in w and "not credible" in w for w in fit.warnings)
    assert not [w for w in fit_curves(_synthetic(CURVES, 0.0), 989.0, 4800.0).warnings if "logits" in w]


def test_curves_reject_non_physical_values():
    from slidedp.errors import SlideDPError

    for bad in (dict(gemm_tflops=0.0), dict(memory_gbps=float("inf")), dict(kernel_us=-1.0),
                dict(attention_half_seq=float("nan")), dict(attention_bwd_us=-5.0),
                dict(attention_fwd_us=float("inf")), dict(step_factor=0.0), dict(step_factor=float("nan"))):
        with pytest.raises(SlideDPError):
            replace(CURVES, **bad)


def test_profile_with_curves_round_trips_through_yaml(tmp_path):
    from slidedp.hardware import HardwareProfile

    hw = load_hardware("h200-x1")
    hw = replace(hw, gpu=replace(hw.gpu, compute=CURVES))
    hw.save(tmp_path / "p.yaml")
    from slidedp.config_io import read_mapping

    assert HardwareProfile.from_dict(read_mapping(tmp_path / "p.yaml", "profile")) == hw


def test_shape_benchmarks_run_on_the_cpu():
    """Only that the CPU path produces one sample per shape (timings here are never asserted)."""
    from slidedp.calibration.shape_bench import CPU_ATTENTION, CPU_GEMMS, CPU_HEADS, shape_samples

    s = shape_samples(quick=True, repeats=1)
    assert len(s.gemm) == len(CPU_GEMMS) and len(s.attention) == 2 * len(CPU_ATTENTION)
    assert [shape for shape, _, _ in s.heads] == list(CPU_HEADS)
    assert all(t > 0 for _, t in s.gemm + s.attention + s.elementwise)
    assert all(t > 0 for _, _, t in s.heads)
    again = samples_from_json(samples_to_json(s))  # kept beside a profile, refitted without the device
    assert [(shape, t) for shape, _, t in again.heads] == [(shape, t) for shape, _, t in s.heads]
    from slidedp.calibration.shape_bench import CPU_OPTIMIZER

    optimizer = [op for op, _ in again.elementwise if c.MEASURED_KIND.get(op.name) == "optimizer"]
    assert len(optimizer) == len(CPU_OPTIMIZER) and all(op.kernels == c.GPU_OPTIMIZER_KERNELS for op in optimizer)
    layer_params = 4 * 32 * 32 + 3 * 64 * 32 + 2 * 32  # hidden 32, ffn 64
    assert optimizer[0].nbytes == c.GPU_OPTIMIZER_HBM_BYTES * 2 * layer_params


def test_the_optimizer_bandwidth_is_its_own_and_leaves_the_generic_one_alone():
    """Clip + fused AdamW timed at 2200 GB/s beside elementwise modules at the generic 3300: the fit finds 2200 for
    the optimizer kind and the generic bandwidth as without those samples; a GPU-resident peer's optimizer step is
    priced at it."""
    from slidedp.peers import SYSTEMS, PeerStep, system_workload

    truth = replace(CURVES, memory_gbps_by_kind={**CURVES.memory_gbps_by_kind, "optimizer": 2200.0})
    plain = _synthetic(truth, 0.0)
    with_optimizer = _synthetic(truth, 0.0)
    with_optimizer.elementwise += [(op, truth.seconds(op)) for op in (c.gpu_optimizer_op(n) for n in (1.3e8, 5.4e8))]
    fit, before = (fit_curves(s, 989.0, 4800.0).curves for s in (with_optimizer, plain))
    assert fit.memory_gbps_by_kind["optimizer"] == pytest.approx(2200.0, rel=0.01)
    assert "optimizer" not in before.memory_gbps_by_kind
    assert fit.memory_gbps == pytest.approx(before.memory_gbps, rel=1e-6)
    assert fit.memory_kernel_us == pytest.approx(before.memory_kernel_us, rel=1e-6)
    alone = _synthetic(truth, 0.0)
    alone.elementwise = with_optimizer.elementwise[len(plain.elementwise):]  # no one-tensor module timed
    assert fit_curves(alone, 989.0, 4800.0).curves.memory_gbps_by_kind["optimizer"] == pytest.approx(2200.0, rel=0.05)
    alone.elementwise = alone.elementwise[:1]
    one = fit_curves(alone, 989.0, 4800.0)
    assert "optimizer" not in one.curves.memory_gbps_by_kind
    assert any(w.startswith("memory_gbps_by_kind.optimizer: one sample") for w in one.warnings)
    m, hw = load_model_spec("qwen3-0.6b"), load_hardware("h200-x1")
    resident = SYSTEMS["ddp-resident"]
    step = PeerStep(resident, system_workload(resident, m, replace(hw, gpu=replace(hw.gpu, compute=fit)), 1024, 1))
    expected = c.GPU_OPTIMIZER_HBM_BYTES * step.params_per_rank / 2200e9 + 3 * fit.memory_kernel_us * 1e-6
    assert step.gpu_adam_s() == pytest.approx(expected, rel=0.01)


def test_a_layer_pass_is_not_faster_than_its_dispatch():
    fast = replace(CURVES, layer_dispatch_us=2000.0, backward_dispatch_us=3000.0)
    small = ARCHS["qwen3"].layer_forward_ops(1, 256)
    assert fast.layer_pass_seconds(small, backward=False) == pytest.approx(2000e-6 + 150e-6)
    big = ARCHS["qwen3"].layer_forward_ops(8, 8192)
    assert fast.layer_pass_seconds(big, backward=False) == pytest.approx(fast.total_seconds(big) + 150e-6)


def test_fit_recovers_the_dispatch_floor_and_pass_overhead():
    truth = replace(CURVES, layer_dispatch_us=1800.0, layer_overhead_us=60.0, backward_dispatch_us=0.0,
                    backward_overhead_us=1500.0)
    s = _synthetic(truth, 0.0)
    m = ARCHS["llama"]
    s.layers = []
    for seq, batch in ((512, 1), (1024, 1), (4096, 1), (4096, 4), (16384, 1)):
        ops = m.layer_forward_ops(batch, seq)
        s.layers.append((f"x fwd s{seq} b{batch}", ops, truth.layer_pass_seconds(ops, backward=False)))
        s.layers.append((f"x bwd s{seq} b{batch}", c.backward_ops(ops),
                         truth.layer_pass_seconds(c.backward_ops(ops), backward=True)))
    got = fit_curves(s, peak_tflops=989.0, peak_memory_gbps=4800.0)
    assert got.residuals["layers"] < 0.02
    for seq, batch in ((768, 1), (8192, 2)):
        ops = m.layer_forward_ops(batch, seq)
        for backward, o in ((False, ops), (True, c.backward_ops(ops))):
            assert got.curves.layer_pass_seconds(o, backward) == pytest.approx(truth.layer_pass_seconds(o, backward),
                                                                               rel=0.03)


def test_shipped_presets_follow_the_one_chip_rule():
    """A preset of a measured chip carries that chip's measured curves; the RTX 4090's, the H200's carried by
    datasheet ratios (slidedp.chips); each says so in its notes."""
    from pathlib import Path

    import slidedp.presets
    from slidedp.chips import CHIPS, MEASURED_PRESETS, derived_presets

    derived = derived_presets(Path(slidedp.presets.__file__).parent)
    assert {p.stem for p in derived} == {"h100-sxm-x4", "h100-sxm-x8", "h100-sxm-x8-ib", "rtx4090-x4"}
    for path, expected in derived.items():
        shipped = load_hardware(path.stem)
        assert shipped.gpu.compute == expected.gpu.compute and shipped.notes == expected.notes
        assert "assumed unchanged" in shipped.notes
        if shipped.gpu.name in MEASURED_PRESETS:
            assert shipped.gpu.compute == load_hardware(MEASURED_PRESETS[shipped.gpu.name]).gpu.compute
        else:
            assert CHIPS[shipped.gpu.name].source in shipped.notes
    rtx = load_hardware("rtx4090-x4").gpu.compute
    h200 = load_hardware("h200-x1").gpu.compute
    assert rtx.memory_gbps == pytest.approx(h200.memory_gbps * 1008.0 / 4800.0)


def test_the_h100_preset_carries_the_calibration_its_notes_name():
    """call59's fitted curves as written, but the layer pass terms it did not time (those stay the H200's: the fit
    alone would have set them to 0), and the GPU optimizer step's bandwidth, which call59 did not time and call65
    did; SlideDP's GPU update rate from call67's calibration."""
    from pathlib import Path

    from slidedp.calibration.profile_fit import LAYER_PASS_FIELDS

    shipped, h200 = load_hardware("h100-sxm-x1"), load_hardware("h200-x1")
    source = "benchmarks/results/h100-2026-12-07i/c59/full.yaml"
    assert source in shipped.notes
    root = Path(__file__).parents[2]
    measured = load_hardware(str(root / source)).gpu.compute
    optimizer_source, update_source = ("benchmarks/results/h100-2026-12-08/c65/queued.yaml",
                                       "benchmarks/results/h100-2026-12-08/c67/full.yaml")
    assert optimizer_source in shipped.notes and update_source.split("/", 3)[-1] in shipped.notes
    optimizer = load_hardware(str(root / optimizer_source)).gpu.compute.memory_gbps_by_kind["optimizer"]
    assert shipped.gpu.compute == replace(measured, **{n: getattr(h200.gpu.compute, n) for n in LAYER_PASS_FIELDS}
                                          ).with_module_gbps("optimizer", optimizer)
    assert shipped.gpu.adam_gparams_per_s == load_hardware(str(root / update_source)).gpu.adam_gparams_per_s
    assert shipped.gpu.compute.memory_gbps_by_kind["residual"] / h200.gpu.compute.memory_gbps_by_kind["residual"] \
        == pytest.approx(0.748, abs=0.001)


def test_step_factor_scales_the_operations_not_the_dispatch_floor():
    """gpu.compute.step_factor prices the GPU's operations inside a step; a pass bound by the CPU's dispatch stays
    at its floor."""
    ops = ARCHS["qwen3"].layer_forward_ops(8, 4096)
    slow = replace(CURVES, step_factor=1.25)
    assert slow.total_seconds(ops) == pytest.approx(1.25 * CURVES.total_seconds(ops))
    floor_bound = replace(CURVES, layer_dispatch_us=1e6 * 10 * CURVES.total_seconds(ops), layer_overhead_us=0.0)
    assert replace(floor_bound, step_factor=1.25).layer_pass_seconds(ops, backward=False) == pytest.approx(
        floor_bound.layer_pass_seconds(ops, backward=False))
    # the peers' whole-model GPU passes (the optimizer step, a serial gradient offload's passes) are step operations too
    from slidedp.peers.step import gpu_memory_pass_seconds

    gpu = load_hardware("h100-sxm-x1").gpu
    slow_gpu = replace(gpu, compute=replace(gpu.compute, step_factor=1.25))
    for price in (lambda g: g.optimizer_pass_seconds(c.gpu_optimizer_op(1e9)),
                  lambda g: g.optimizer_pass_seconds(c.gpu_state_update_op(1e9)),
                  lambda g: gpu_memory_pass_seconds(g, 4e10, 3)):
        assert price(slow_gpu) == pytest.approx(1.25 * price(gpu))


def test_eager_attention_materialises_every_score():
    """HF's eager attention (SlideFormer's): the full QK^T and PV (twice the causal kernel's FLOPs), the K/V heads
    expanded, 20 B per score in the forward's chain and 24 in its backward; the layer's other ops unchanged."""
    m = ARCHS["qwen3"]
    b, s = 2, 1024
    sdpa = m.layer_forward_ops(b, s)
    eager = m.layer_forward_ops(b, s, attention="eager")
    (flash,) = [op for op in sdpa if isinstance(op, c.Attention)]
    assert not any(isinstance(op, c.Attention) for op in eager)
    extra_gemm = sum(op.flops for op in eager if isinstance(op, c.Gemm)) - \
        sum(op.flops for op in sdpa if isinstance(op, c.Gemm))
    assert extra_gemm == pytest.approx(2 * flash.flops)
    (scores,) = [op for op in eager if isinstance(op, c.Elementwise) and op.name == "eager_scores"]
    assert scores.nbytes == b * m.heads * s * s * c.EAGER_SCORES.fwd_bytes
    (back,) = [op for op in c.backward_ops(eager) if isinstance(op, c.Elementwise) and op.name == "eager_scores"]
    assert back.nbytes == pytest.approx(b * m.heads * s * s * 24)
    assert any(op.name == "repeat_kv" for op in eager if isinstance(op, c.Elementwise))  # 16 q heads, 8 kv
    rest = [op for op in eager if not (isinstance(op, c.Gemm) and op.k in (s, m.head_dim) and op.count > 1)
            and getattr(op, "name", "") not in ("eager_scores", "repeat_kv")]
    assert rest == [op for op in sdpa if op is not flash]
    hw = load_hardware("h200-x1")
    eager_unit = build_units(m, hw.gpu, "recompute", b, 1, s, attention="eager")[1]
    sdpa_unit = build_units(m, hw.gpu, "recompute", b, 1, s)[1]
    assert eager_unit.fwd_s > sdpa_unit.fwd_s and eager_unit.bwd_s > sdpa_unit.bwd_s
    with pytest.raises(SlideDPError, match="varlen"):
        m.layer_forward_ops(b, s, span=300.0, attention="eager")
    with pytest.raises(SlideDPError, match="choose one of"):
        m.layer_forward_ops(b, s, attention="flash3")


def test_a_peer_step_prices_the_peers_own_attention():
    from slidedp.peers import SYSTEMS, PeerStep, peer_workload

    m, hw = load_model_spec("qwen3-0.6b"), load_hardware("h200-x1")
    assert SYSTEMS["slideformer"].attention == "eager" and SYSTEMS["megatrain"].attention == "sdpa"
    with pytest.raises(ValueError, match="eager attention"):
        PeerStep(SYSTEMS["slideformer"], peer_workload(m, hw, 1024, 1))
    w = peer_workload(m, hw, 1024, 1, "eager")
    assert PeerStep(SYSTEMS["slideformer"], w).w.with_policy(w.policy).attention == "eager"


@pytest.mark.parametrize("name, qk_fwd, qk_bwd", [("qwen3-4b", 28, 50), ("qwen2.5-72b", 16, 26),
                                                   ("llama-3-8b", 16, 26)])
def test_autocast_over_fp32_weights_adds_its_stream_and_weight_casts_in_closed_form(name, qk_fwd, qk_bwd):
    """amp-fp32 (plain GPU-resident training) moves, per layer, 24 B per element of the hidden state and 28 B per
    element of q and k with q/k norms (16 without) forward, 74 and 50 (26) backward, beyond the bf16 operations (the
    counts of benchmarks.layer_bytes), and casts every projection weight (6 B per parameter, one kernel each); the
    weights' casts have no backward of their own: the gradients' casts replace the per-unit gradient passes."""
    from slidedp.compute import AMP_FP32

    m = load_model_spec(name)
    b, s = 2, 1024
    t = b * s
    bf16 = m.layer_forward_ops(b, s)
    amp = m.layer_forward_ops(b, s, precision=AMP_FP32)
    assert amp[:len(bf16)] == bf16
    stream, weights = amp[len(bf16):]
    assert (stream.name, stream.kernels) == ("amp_stream", 3)
    assert stream.nbytes == t * (24 * m.hidden + qk_fwd * (m.q_dim + m.kv_dim))
    h = m.hidden
    linear = 2 * h * m.q_dim + 2 * h * m.kv_dim + 3 * h * m.ffn + (m.q_dim + 2 * m.kv_dim if m.attn_bias else 0)
    assert m.layer_linear_params == linear
    assert weights.nbytes == 6 * linear and weights.kernels == 7 + (3 if m.attn_bias else 0)
    back = {op.name: op for op in c.backward_ops([stream, weights])}
    assert back["amp_stream"].nbytes == t * (74 * m.hidden + qk_bwd * (m.q_dim + m.kv_dim))
    assert back["amp_stream"].kernels == 8
    assert "amp_weight_cast" not in back
    with pytest.raises(SlideDPError, match="precision 'fp16'"):
        m.layer_forward_ops(b, s, precision="fp16")


def test_only_the_autocast_peer_prices_an_fp32_stream_and_a_mismatched_workload_is_refused():
    """Its layers' forward is the bf16 one plus the amp ops; its backward adds their backward and the recomputed
    forward's amp ops, and swaps the per-unit gradient passes for the gradients' casts. Nothing else changes."""
    from dataclasses import replace as dc_replace

    from slidedp.compute import AMP_FP32, BF16, amp_fp32_ops, amp_gradient_ops, gradient_ops
    from slidedp.peers import SYSTEMS, PeerStep, peer_workload, system_workload

    m, hw = load_model_spec("qwen3-0.6b"), load_hardware("h200-x1")
    assert {n for n, s in SYSTEMS.items() if s.precision == AMP_FP32} == {"ddp-resident"}
    resident = SYSTEMS["ddp-resident"]
    with pytest.raises(ValueError, match="amp-fp32"):
        PeerStep(resident, peer_workload(m, hw, 1024, 1))
    with pytest.raises(SlideDPError, match="precision"):
        dc_replace(resident, precision="fp8")
    with pytest.raises(SlideDPError, match="precision"):
        m.layer_gradient_ops(1, "fp8")
    curves = replace(hw.gpu.compute, layer_dispatch_us=0.0, backward_dispatch_us=0.0, layer_overhead_us=0.0,
                     backward_overhead_us=0.0)
    hw = replace(hw, gpu=replace(hw.gpu, compute=curves))
    b, s = 4, 4096
    amp = PeerStep(resident, system_workload(resident, m, hw, s, b)).w
    bf16 = peer_workload(m, hw, s, b, precision=BF16)
    extra = amp_fp32_ops(b * s, m.hidden, m.q_dim + m.kv_dim, True, m.layer_linear_params, m.layer_linear_tensors)
    layer = next(i for i, u in enumerate(amp.units) if u.kind == "layer")
    assert amp.units[layer].fwd_s - bf16.units[layer].fwd_s == pytest.approx(curves.total_seconds(extra))
    grads = curves.total_seconds(amp_gradient_ops(m.layer_linear_params, m.layer_linear_tensors)) - \
        curves.total_seconds(gradient_ops(m.layer_params, m.layer_tensors, 1))
    assert amp.units[layer].bwd_s - bf16.units[layer].bwd_s == pytest.approx(
        curves.total_seconds(c.backward_ops(extra)) + curves.total_seconds(extra) + grads)
    assert [(u.fwd_s, u.bwd_s) for u in amp.units if u.kind != "layer"] == \
        [(u.fwd_s, u.bwd_s) for u in bf16.units if u.kind != "layer"]
    rebuilt = amp.with_policy(amp.policy.with_(loss_chunk_tokens=2048))  # new units: the precision must carry over
    assert rebuilt.precision == AMP_FP32 and rebuilt.units[layer].fwd_s == amp.units[layer].fwd_s
