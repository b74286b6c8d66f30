from dataclasses import replace

import numpy as np
import pytest
import torch

from slidedp.calibration.fits import fit_backward_ratios, fit_compute, fit_link, layer_time, thread_curve
from slidedp.calibration.from_run import load_record, mape, refit_profile, validate
from slidedp.calibration.measurements import Measurements
from slidedp.calibration.profile_fit import profile_from
from slidedp.cli import main
from slidedp.errors import SlideDPError
from slidedp.hardware import HardwareProfile, load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.sim import simulate
from slidedp.state_precision import STATE_CHOICES
from tests.builders import simulated_run


def test_link_fit_recovers_latency_and_bandwidth():
    rng = np.random.default_rng(0)
    sizes = np.array([1, 4, 16, 64, 256, 1024]) * 2**20
    times = (12e-6 + sizes / 50e9) * (1 + rng.normal(0, 0.01, len(sizes)))
    fit = fit_link(sizes, times)
    assert fit.bandwidth_Bps == pytest.approx(50e9, rel=0.03)
    assert fit.latency_s == pytest.approx(12e-6, rel=0.3)
    assert fit.residual < 0.02


def test_compute_fit_predicts_layer_times():
    rng = np.random.default_rng(1)
    spec = load_model_spec("qwen3-8b")
    tokens = np.array([512, 1024, 2048, 4096, 8192, 16384, 4096, 8192])
    seqs = np.array([512, 1024, 2048, 4096, 8192, 16384, 1024, 2048])
    lin = spec.layer_linear_flops_per_token() * tokens
    att = np.array([spec.layer_attention_flops_per_token(s) for s in seqs]) * tokens
    truth = layer_time((lin, att, tokens), 540.0, 200.0, 400.0, 20e-6)
    fit = fit_compute(lin, att, tokens, truth * (1 + rng.normal(0, 0.01, len(truth))))
    predicted = layer_time((lin, att, tokens), fit.matmul_tflops, fit.half_efficiency_tokens, fit.attention_tflops,
                           fit.overhead_s)
    assert np.max(np.abs(predicted / truth - 1)) < 0.03 and fit.residual < 0.02


def test_backward_fit_recovers_linear_and_attention_ratios():
    rng = np.random.default_rng(2)
    lin = np.array([1.0, 2.0, 4.0, 8.0, 2.0, 4.0]) * 1e-3
    att = np.array([0.1, 0.2, 0.4, 0.8, 2.0, 6.0]) * 1e-3
    bwd = (2.1 * lin + 2.6 * att + 30e-6) * (1 + rng.normal(0, 0.01, len(lin)))
    fit = fit_backward_ratios(lin, att, bwd, 30e-6)
    assert fit.linear_ratio == pytest.approx(2.1, rel=0.05)
    assert fit.attention_ratio == pytest.approx(2.6, rel=0.1)
    assert fit.residual < 0.02


def test_thread_curve_is_monotone():
    assert thread_curve([1, 2, 4, 8], [1.0, 1.8, 1.7, 2.5]) == {1: 1.0, 2: 1.8, 4: 1.8, 8: 2.5}


def _truth(base: HardwareProfile) -> HardwareProfile:
    gpu = replace(base.gpu, h2d_gbps=40.0, d2h_gbps=35.0, matmul_tflops=base.gpu.matmul_tflops * 0.8,
                  attention_tflops=base.gpu.attention_tflops * 0.8)
    host = replace(base.host, adam_gparams_per_s={k: v * 0.6 for k, v in base.host.adam_gparams_per_s.items()})
    return replace(base, gpu=gpu, host=host)


def _simulated_runs(tmp_path, hw: HardwareProfile) -> list:
    """'Measured' runs: simulated on the true machine and written as run directories."""
    spec = load_model_spec("qwen3-4b")
    paths = []
    for i, (seq, mb, act) in enumerate([(1024, 1, "recompute"), (2048, 2, "recompute"), (4096, 1, "keep"),
                                        (4096, 4, "recompute"), (8192, 1, "offload"), (2048, 8, "recompute")]):
        policy = Policy(micro_batch=mb, accumulation=1, activation=act, chunks_per_layer=4)
        paths.append(simulated_run(tmp_path / f"run{i}", spec, policy, hw, seq, mb)[0])
    return paths


def _as_cpu_runs(paths) -> None:
    """The runs as a CPU run records them: device cpu, and copies whose times do not grow with their size."""
    import json

    import pandas as pd

    for path in paths:
        summary = json.loads((path / "summary.json").read_text())
        (path / "summary.json").write_text(json.dumps({**summary, "source": "measured", "device": "cpu"}))
        trace = pd.read_parquet(path / "trace.parquet")
        copies = trace.op.isin(["h2d_param", "d2h_grad"])
        trace.loc[copies, "end_s"] = trace.loc[copies, "start_s"] + 1e-3 / (1 + trace.loc[copies, "bytes"] / 1e6)
        trace.to_parquet(path / "trace.parquet", index=False)


def test_cpu_runs_keep_the_base_links_and_say_why(tmp_path, capsys):
    paths = _simulated_runs(tmp_path, _truth(load_hardware("h200-x1")))[:3]
    _as_cpu_runs(paths)
    refit_out = tmp_path / "refit.yaml"
    assert main(["calibrate", "--from-run", *map(str, paths), "--out", str(refit_out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any("ran on the CPU" in line and "describes this CPU as the device" in line for line in err), err
    assert any(line.startswith("slidedp: warning: h2d_gbps: kept h200-x1's value") for line in err), err
    assert load_hardware(str(refit_out)).gpu.h2d_gbps == load_hardware("h200-x1").gpu.h2d_gbps
    assert main(["validate", *map(str, paths)]) == 0
    assert "ran on the CPU: h200-x1 prices a GPU host" in capsys.readouterr().err
    assert main(["calibrate", "--quick", "--from-run", str(paths[0])]) == 2
    capsys.readouterr()
    assert main(["calibrate", "--model", "qwen3-8b", "--from-run", str(paths[0])]) == 2  # --model was ignored
    assert "--model times a model's layers on this machine" in capsys.readouterr().err


def test_refit_from_runs_lowers_the_prediction_error(tmp_path):
    base = load_hardware("h200-x1")
    records = [load_record(p) for p in _simulated_runs(tmp_path, _truth(base))]
    before = mape(validate(records, base))
    refit, report = refit_profile(base, records)
    after = mape(validate(records, refit))
    assert before > 10 and after < before / 3 and after < 5
    assert refit.gpu.h2d_gbps == pytest.approx(40.0, rel=0.1)
    assert {"h2d_gbps", "d2h_gbps", "step_update_factor", "compute"} <= set(report)
    # The true update ran at 0.6x the base's rate: the refit keeps the base's curve (the pass alone) and says
    # how much longer the update is busy in a step.
    assert refit.host.adam_gparams_per_s == base.host.adam_gparams_per_s
    assert refit.host.step_update_factor == pytest.approx(base.host.step_update_factor / 0.6, rel=0.1)


def test_layer_times_that_do_not_grow_keep_the_base_rates_with_a_warning(tmp_path):
    """A busy machine (#14: notebook 03 failed with "link fit: times do not grow with size"): forward times that
    shrink as the layers grow are no fit; the refit keeps the base's GPU rates and says so in one line."""
    from slidedp.trace import load_trace, save_trace

    base = load_hardware("h200-x1")
    paths = _simulated_runs(tmp_path, _truth(base))[:3]  # three sizes: the one-rate-plus-fixed-cost fit
    for i, path in enumerate(paths):  # every forward takes the same time, less for the larger layers
        trace = load_trace(path / "trace.parquet")
        fwd = trace.op == "fwd"
        trace.loc[fwd, "end_s"] = trace.loc[fwd, "start_s"] + 0.010 / (i + 1)
        save_trace(trace, path / "trace.parquet")
    refit, report = refit_profile(base, [load_record(p) for p in paths])
    assert refit.gpu.matmul_tflops == base.gpu.matmul_tflops
    assert refit.gpu.attention_tflops == base.gpu.attention_tflops
    (line,) = [w for w in report["warnings"] if w.startswith("GPU compute rates")]
    assert "times do not grow with size" in line and "kept the base profile's" in line


def test_step_update_factor_recovers_a_known_in_step_slowdown(tmp_path):
    from slidedp.calibration.from_run import fit_step_update_factor

    base = load_hardware("h200-x1")
    base = replace(base, host=replace(base.host, step_update_factor=1.0))
    truth = replace(base, host=replace(base.host, step_update_factor=1.3))
    records = [load_record(p) for p in _simulated_runs(tmp_path, truth)]
    factor, runs = fit_step_update_factor(records, base)
    assert runs == len(records) and factor == pytest.approx(1.3, rel=0.02)
    # Fitted against a base that already has the factor: nothing left to add.
    again, _ = fit_step_update_factor(records, truth)
    assert again == pytest.approx(1.3, rel=0.02)


def test_cli_calibrate_and_validate(tmp_path, capsys, monkeypatch):
    paths = _simulated_runs(tmp_path, _truth(load_hardware("h200-x1")))
    assert main(["calibrate", "--from-run", *map(str, paths), "--out", str(tmp_path / "refit.yaml")]) == 0
    assert main(["validate", *map(str, paths), "--hardware", str(tmp_path / "refit.yaml"),
                 "--out", str(tmp_path / "v.csv")]) == 0
    assert "MAPE" in capsys.readouterr().out
    assert main(["report", str(paths[0]), "--validation", str(tmp_path / "v.csv"), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "validation.png").exists()
    # calibrate --quick, the README's example: its micro-benchmarks (run once, seen through a spy) make a
    # valid profile, saved and read back whole.
    import slidedp.calibration.host_bench as host_bench
    import slidedp.calibration.profile_fit as profile_fit

    seen, built = [], []
    measure, fit = host_bench.host_benchmarks, profile_fit.profile_from
    monkeypatch.setattr(host_bench, "host_benchmarks", lambda *a, **k: seen.append(measure(*a, **k)) or seen[-1])
    monkeypatch.setattr(profile_fit, "profile_from", lambda *a, **k: built.append(fit(*a, **k)) or built[-1])
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "q.yaml")]) == 0
    measured, = seen
    (fitted, _), = built
    assert measured.stream_gbps and min(measured.adam_gparams_per_s.values()) > 0
    chunks = measured.report["adam_vs_chunk"]
    assert {"bf16_grads", "fp32_grads"} == set(chunks)
    assert all(c["gparams_per_s"] > 0 and c["overhead_us"] >= 0 for c in chunks.values())
    profile = load_hardware(str(tmp_path / "q.yaml"))
    assert profile == fitted  # the measured profile survives its file whole
    assert profile.host.fused_cast == measured.adam_fused_cast
    modes = {p.name for p in STATE_CHOICES if not p.is_exact}
    assert set(measured.state_update_gparams_per_s) == modes
    assert set(profile.host.state_update_gparams_per_s) == modes
    assert all(min(curve.values()) > 0 for curve in profile.host.state_update_gparams_per_s.values())
    (tmp_path / "empty").mkdir()
    assert main(["validate", str(tmp_path / "empty")]) == 2


def _layer_samples(gpu, model: str, noise: float, seed: int = 0):
    """(model, seq, tokens, forward s, backward s) as the layer benchmark records them, from a known GPUSpec."""
    rng = np.random.default_rng(seed)
    spec = load_model_spec(model)
    samples = []
    for seq, batch in [(1024, 1), (1024, 8), (4096, 1), (4096, 4), (16384, 1), (32768, 1)]:
        tokens = seq * batch
        lin = spec.layer_linear_flops_per_token() * tokens
        att = spec.layer_attention_flops_per_token(seq) * tokens
        lin_s, att_s = gpu.linear_time(lin, tokens), gpu.attention_time(att)
        fwd = lin_s + att_s + gpu.layer_overhead_us * 1e-6
        bwd = gpu.backward_linear_ratio * lin_s + gpu.backward_attention_ratio * att_s + gpu.layer_overhead_us * 1e-6
        jitter = np.exp(rng.normal(0.0, noise, 2))
        samples.append((model, seq, tokens, fwd * jitter[0], bwd * jitter[1]))
    return samples


def test_layer_fit_recovers_a_known_compute_model_from_noisy_synthetic_timings():
    truth = replace(load_hardware("h200-x1").gpu, matmul_tflops=600.0, attention_tflops=450.0,
                    half_efficiency_tokens=300.0, layer_overhead_us=150.0, backward_linear_ratio=2.2,
                    backward_attention_ratio=2.6)
    m = Measurements(stream_gbps={1: 10.0}, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 1.0},
                     layer=_layer_samples(truth, "qwen3-4b", 0.02) + _layer_samples(truth, "qwen3-8b", 0.02, 1))
    profile, report = profile_from(load_hardware("h200-x1"), m)
    gpu = profile.gpu
    assert report["warnings"] == []
    assert gpu.matmul_tflops == pytest.approx(600.0, rel=0.15)
    assert gpu.backward_linear_ratio == pytest.approx(2.2, rel=0.15)
    for seq, tokens in ((2048, 8192), (8192, 8192)):  # predicted layer time, shapes it was not fitted on
        spec = load_model_spec("qwen3-4b")
        lin = spec.layer_linear_flops_per_token() * tokens
        att = spec.layer_attention_flops_per_token(seq) * tokens
        assert gpu.linear_time(lin, tokens) + gpu.attention_time(att) == pytest.approx(
            truth.linear_time(lin, tokens) + truth.attention_time(att), rel=0.05)


def test_a_layer_fit_that_is_not_credible_keeps_the_base_and_says_so():
    """What a busy 2-core machine produced: backward 7e6 times the forward, rates at the fit's bound."""
    base = load_hardware("h200-x1")
    noisy = [("qwen3-4b", 64, 64, 1e-3, 7e3), ("qwen3-4b", 64, 256, 1.2e-3, 8e3), ("qwen3-4b", 256, 256, 0.9e-3, 6e3),
             ("qwen3-4b", 256, 512, 1.1e-3, 9e3)]
    m = Measurements(stream_gbps={1: 10.0}, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 1.0}, layer=noisy)
    profile, report = profile_from(base, m)
    assert report["warnings"] and all(w.startswith("layer compute:") for w in report["warnings"])
    assert profile.gpu.backward_linear_ratio == base.gpu.backward_linear_ratio
    assert profile.gpu.backward_attention_ratio == base.gpu.backward_attention_ratio


def test_noisy_link_timings_warn_instead_of_aborting():
    m = Measurements(stream_gbps={1: 10.0}, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 1.0},
                     h2d={2**20: 5e-3, 2**22: 1e-3, 2**24: 2e-4})  # times fall with size: noise, not a link
    base = load_hardware("h200-x1")
    profile, report = profile_from(base, m)
    assert profile.gpu.h2d_gbps == base.gpu.h2d_gbps
    assert any(w.startswith("h2d_gbps:") for w in report["warnings"])


@pytest.mark.slow
def test_layer_benchmark_runs_on_this_cpu(tmp_path):
    """Only that the CPU path times every grid point (timings of this machine are never asserted)."""
    import json

    from slidedp.calibration.gpu_bench import layer_benchmarks

    config = tmp_path / "small.json"
    config.write_text(json.dumps(dict(model_type="qwen3", vocab_size=300, hidden_size=128, intermediate_size=384,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      max_position_embeddings=4096)))
    measured = Measurements(stream_gbps={1: 10.0}, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 1.0})
    layer_benchmarks(measured, str(config), quick=True)
    assert len(measured.layer) == 4 and all(f > 0 and b > 0 for *_, f, b in measured.layer)
    # The command completes whatever this machine's load did to the fits (a fit that is not credible warns).
    assert main(["calibrate", "--quick", "--model", str(config), "--out", str(tmp_path / "p.yaml")]) == 0
    assert main(["calibrate", "--quick", "--model", str(tmp_path / "missing.json")]) == 2


def test_multi_gpu_measurements_set_the_link_and_a_shared_uplink():
    """Collective timings fit the link; 4 GPUs copying at once below 4x one GPU become one shared uplink."""
    base = load_hardware("h100-sxm-x4")
    sizes = [2**20, 2**22, 2**24, 2**26]
    m = Measurements(stream_gbps={1: 10.0}, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 1.0},
                     collectives={"allgather": {s: 15e-6 + s / 150e9 for s in sizes},
                                  "reduce_scatter": {s: 20e-6 + s / 120e9 for s in sizes}},
                     concurrent_h2d_gbps={(1, 1): 50.0, (1, 2): 51.0, (2, 1): 100.0, (4, 1): 120.0})
    profile, report = profile_from(base, m)
    assert profile.link.bw_gbps == pytest.approx(120.0, rel=0.01)  # the slower collective bounds the link
    assert profile.link.latency_us == pytest.approx(20.0, rel=0.05)
    assert profile.switches and profile.switches[0].uplink_gbps == pytest.approx(120.0)
    assert set(report["collectives"]) == {"allgather", "reduce_scatter"}
    one_gpu = Measurements(stream_gbps={1: 10.0}, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 1.0},
                           concurrent_h2d_gbps={(1, 1): 50.0, (1, 2): 50.0})
    profile, _ = profile_from(load_hardware("h200-x1"), one_gpu)
    assert profile.link == load_hardware("h200-x1").link and not profile.switches


def test_gpu_adam_rate_sets_the_profile_and_its_benchmark_times_the_runtime_update():
    """The measured rate of the GPU-held update lands in the profile; the benchmark's state object updates
    exactly like torch's AdamW (the CPU stands in for the GPU here)."""
    m = Measurements(stream_gbps={1: 10.0}, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 1.0},
                     gpu_adam_gparams_per_s=123.0)
    profile, report = profile_from(load_hardware("h200-x1"), m)
    assert profile.gpu.adam_gparams_per_s == 123.0 and report["gpu_adam_gparams_per_s"] == 123.0
    from slidedp.runtime.gpu_state import GpuOptimizerState
    from slidedp.runtime.optim import OptimConfig

    torch.manual_seed(0)
    p = torch.randn(1000)
    ref = torch.nn.Parameter(p.clone())
    cfg = OptimConfig(lr=1e-3, weight_decay=0.1)
    opt = torch.optim.AdamW([ref], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=0.1)
    state = GpuOptimizerState.from_tensors([p], torch.bfloat16)
    for step in range(1, 4):
        g = torch.randn(1000)
        ref.grad = g * 0.5
        opt.step()
        state.update_all([g.clone()], step, cfg.lr, cfg, 0.5)
    torch.testing.assert_close(state.master[0], ref.detach(), rtol=1e-6, atol=1e-6)
    assert torch.equal(state.weights[0], state.master[0].bfloat16())


def test_quick_host_passes_keep_the_base_dram_capacity():
    base = load_hardware("h200-x1")
    m = Measurements(stream_gbps={1: 10.0, 16: 300.0}, adam_gparams_per_s={1: 1.0, 16: 9.0},
                     cast_gelems_per_s={1: 1.0}, cache_resident=True)
    profile, report = profile_from(base, m)
    assert profile.host.mem_bw_gbps == base.host.mem_bw_gbps
    assert any(w.startswith("host DRAM capacity") for w in report["warnings"])
    profile, report = profile_from(base, replace(m, cache_resident=False))
    assert profile.host.mem_bw_gbps == pytest.approx(300.0)  # the most traffic one pass moved


def test_the_duplex_cap_comes_from_this_hosts_copies_where_pcie_was_not_benchmarked():
    base = load_hardware("h200-x1")
    m = Measurements(stream_gbps={1: 10.0, 16: 150.0}, adam_gparams_per_s={1: 1.0, 16: 5.0},
                     cast_gelems_per_s={1: 1.0})
    assert profile_from(base, m)[0].gpu.duplex_gbps == base.gpu.duplex_gbps  # nothing measured: the base's
    contention = {"adam_alone_s": 0.045, "adam_with_h2d+d2h_s": 0.06, "dma_gbps_alone": 73.5,
                  "dma_gbps_with_adam": 50.9, "total_gbps": 176.0}
    profile, report = profile_from(base, replace(m, contention=contention))
    assert profile.gpu.duplex_gbps == pytest.approx(73.5) and report["duplex_gbps"] == pytest.approx(73.5)
    assert profile_from(base, replace(m, contention=contention, duplex_gbps=80.0))[0].gpu.duplex_gbps == 80.0


def test_compute_curves_that_are_not_credible_or_not_timed_keep_the_base_ones():
    """Attention samples faster than the chip's peak: the attention parameters stay the base profile's. No
    decoder-layer passes timed: so do its dispatch floor and pass costs."""
    from slidedp import compute as c
    from slidedp.calibration.shape_bench import GPU_GEMMS
    from slidedp.calibration.shape_fit import ShapeSamples

    base = load_hardware("h200-x1")
    truth = base.gpu.compute
    s = ShapeSamples()
    s.gemm = [(c.Gemm(*shape), truth.seconds(c.Gemm(*shape))) for shape in GPU_GEMMS]
    s.attention = [(op, truth.seconds(op) / 10) for op in (c.Attention(1, q, 32, 8, 128, b) for q in (2048, 8192, 32768)
                                                            for b in (False, True))]
    m = Measurements(stream_gbps={1: 10.0}, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 1.0}, shapes=s)
    profile, report = profile_from(base, m)
    got = profile.gpu.compute
    assert got.attention_fwd_tflops == truth.attention_fwd_tflops
    assert got.attention_bwd_tflops == truth.attention_bwd_tflops
    assert got.gemm_tflops == pytest.approx(truth.gemm_tflops, rel=0.05)
    assert any("kept the attention parameters" in w for w in report["warnings"])
    # no decoder-layer passes timed: the base's dispatch floor and pass costs stand (the fit would say 0)
    assert truth.layer_dispatch_us > 0 and truth.backward_dispatch_us > 0
    for name in ("layer_dispatch_us", "layer_overhead_us", "backward_dispatch_us", "backward_overhead_us"):
        assert getattr(got, name) == getattr(truth, name)
    assert any("no decoder-layer passes timed" in w for w in report["warnings"])


def test_logits_bandwidth_recovers_the_heads_measured_time(tmp_path):
    """Runs whose loss head ran its logits chain at 1500 GB/s: the fit against curves that price the chain at the
    generic bandwidth finds 1500; a profile without shape-aware curves has nothing to fit."""
    from slidedp.calibration.from_run import fit_logits_gbps

    base = load_hardware("h200-x1")
    plain = {k: v for k, v in base.gpu.compute.memory_gbps_by_kind.items() if k != "logits"}
    base = replace(base, gpu=replace(base.gpu, compute=replace(base.gpu.compute, memory_gbps_by_kind=plain)))
    truth = replace(base, gpu=replace(base.gpu, compute=replace(
        base.gpu.compute, memory_gbps_by_kind={**plain, "logits": 1500.0})))
    records = [load_record(p) for p in _simulated_runs(tmp_path, truth)]
    logits, runs = fit_logits_gbps(records, base)
    assert runs == len(records) and logits == pytest.approx(1500.0, rel=0.01)
    layer_level = replace(base, gpu=replace(base.gpu, compute=None))
    assert fit_logits_gbps(records, layer_level) == (None, 0)


def test_step_compute_factor_recovers_the_gpus_in_step_slowdown(tmp_path):
    """Runs whose GPU operations took 6% longer than the micro-benchmarked curves price them: the fit finds 1.06
    from the decoder layers' passes, skipping none of these GPU-bound runs; without shape curves, nothing to fit."""
    from slidedp.calibration.from_run import fit_step_compute_factor

    base = load_hardware("h200-x1")
    base = replace(base, gpu=replace(base.gpu, compute=replace(base.gpu.compute, step_factor=1.0)))
    truth = replace(base, gpu=replace(base.gpu, compute=replace(base.gpu.compute, step_factor=1.06)))
    records = [load_record(p) for p in _simulated_runs(tmp_path, truth)]
    factor, runs = fit_step_compute_factor(records, base)
    assert 4 <= runs <= len(records) and factor == pytest.approx(1.06, rel=0.005)
    assert fit_step_compute_factor(records, replace(base, gpu=replace(base.gpu, compute=None))) == (None, 0)


def test_a_compact_modes_rate_is_refitted_from_its_own_runs_not_through_the_exact_factor(tmp_path):
    """2026-12-06: a lent host ran bf16+int8 at 0.44x the profile's rate and fp32 at about its rate; one
    step_update_factor fitted to both runs made the refit worse than the base. Each mode's curve is rescaled
    from its own runs; the factor comes from the exact runs alone."""
    from slidedp.calibration.from_run import refit_state_update_rates

    base = load_hardware("h200-x1")
    mode = "bf16+int8"
    slow = {t: v * 0.44 for t, v in base.host.state_update_gparams_per_s[mode].items()}
    truth = replace(base, host=replace(base.host, state_update_gparams_per_s={
        **base.host.state_update_gparams_per_s, mode: slow}))
    spec = load_model_spec("qwen3-4b")
    paths = []
    for i, (state, mb) in enumerate([(mode, 1), (mode, 2), ("fp32", 1), ("fp32", 2)]):
        policy = Policy(micro_batch=mb, accumulation=1, chunks_per_layer=4, state=state)
        paths.append(simulated_run(tmp_path / f"run{i}", spec, policy, truth, 2048, mb)[0])
    records = [load_record(p) for p in paths]
    refit, report = refit_profile(base, records)
    assert refit.host.step_update_factor == pytest.approx(base.host.step_update_factor, rel=0.02)
    for t, v in refit.host.state_update_gparams_per_s[mode].items():
        assert v == pytest.approx(slow[t], rel=0.03)
    assert report[f"state_update_gparams_per_s.{mode}"]["runs"] == 2
    assert mape(validate(records, refit)) < 2 < mape(validate(records, base))
    # A mode the base had not measured gets the derived curve, rescaled to what its runs measured.
    unmeasured = replace(base, host=replace(base.host, state_update_gparams_per_s={}))
    host, report = refit_state_update_rates(records[:2], unmeasured)
    assert not report[f"state_update_gparams_per_s.{mode}"]["measured_before"]
    w = records[0].workload(replace(unmeasured, host=host))
    assert w.state_update_rate_measured
    assert busy_adam(simulate(w).trace) == pytest.approx(busy_adam(records[0].trace), rel=0.03)


def busy_adam(trace) -> float:
    from slidedp.calibration.from_run import busy_seconds

    return busy_seconds(trace, "adam")


def test_host_only_refreshes_the_cpu_rates_and_keeps_every_gpu_field(tmp_path, monkeypatch, capsys):
    """`calibrate --host-only` on a machine with a GPU: the host's rates come from this host's measurements (here
    synthetic: half of h200-x1's, as the slowest lent host measured), nothing on the GPU side is benchmarked, and
    the GPU, link and contention fields are the base's."""
    import slidedp.calibration.gpu_bench as gpu_bench
    import slidedp.calibration.host_bench as host_bench
    import slidedp.calibration.peer_bench as peer_bench

    base = load_hardware("h200-x1")
    slow = {t: r / 2 for t, r in base.host.adam_gparams_per_s.items()}

    def measured(quick, progress=None):
        return Measurements(stream_gbps=dict(base.host.stream_gbps), adam_gparams_per_s=slow,
                            cast_gelems_per_s=dict(base.host.cast_gelems_per_s), adam_fused_cast=True,
                            state_update_gparams_per_s={"bf16+int8": {8: 3.0, 16: 6.0}})

    def never(*args, **kwargs):
        raise AssertionError("--host-only ran a GPU benchmark")

    monkeypatch.setattr(host_bench, "host_benchmarks", measured)
    monkeypatch.setattr(peer_bench, "peer_adam_benchmarks", lambda *a, **k: None)
    monkeypatch.setattr(gpu_bench, "gpu_benchmarks", never)
    monkeypatch.setattr(gpu_bench, "layer_benchmarks", never)
    out = tmp_path / "host.yaml"
    assert main(["calibrate", "--host-only", "--out", str(out)]) == 0
    profile = load_hardware(str(out))
    assert profile.gpu == base.gpu and profile.link == base.link
    assert profile.host.dma_interference == base.host.dma_interference
    assert profile.host.adam_gparams_per_s[16] == pytest.approx(base.host.adam_gparams_per_s[16] / 2)
    assert profile.host.state_update_gparams_per_s["bf16+int8"][16] == pytest.approx(6.0)
    assert profile.host.state_update_gparams_per_s["fp32+int8"] == base.host.state_update_gparams_per_s["fp32+int8"]
    assert "kept from h200-x1" in capsys.readouterr().out
    assert main(["calibrate", "--host-only", "--model", "qwen3-4b"]) == 2


def test_repricing_a_runs_cpu_update_recovers_the_step_when_only_the_update_was_slower(tmp_path):
    """calibration.from_run.reprice_update (train's closing line): runs 'measured' on a machine whose CPU update
    is slower than the profile's and everything else alike; priced at the rate each run's trace implies, the
    simulator gives back the measured step, for the exact update and for a compact mode."""
    from slidedp.calibration.from_run import reprice_update

    base = load_hardware("h200-x1")
    spec = load_model_spec("qwen3-4b")
    slow = dict(base.host.state_update_gparams_per_s["bf16+int8"])
    truth = replace(base, host=replace(base.host, step_update_factor=base.host.step_update_factor * 1.5,
                                       state_update_gparams_per_s={**base.host.state_update_gparams_per_s,
                                                                   "bf16+int8": {t: v * 0.8 for t, v in slow.items()}}))
    for state, rate_ratio in (("fp32", 1 / 1.5), ("bf16+int8", 0.8 / 1.5)):
        policy = Policy(micro_batch=1, activation="keep", update_schedule="next_forward", state=state,
                        param_route="replicated", grad_route="per_rank")
        path, sim = simulated_run(tmp_path / state, spec, policy, truth, 4096, 1)
        record = load_record(path)
        before = simulate(record.workload(base)).step_time_s
        repriced = reprice_update(record, base)
        assert before < 0.9 * sim.step_time_s  # the profile's faster update: a miss of over 10%
        assert repriced.predicted_s == pytest.approx(sim.step_time_s, rel=0.02)
        # The rate comes from busy seconds, which hold some copy contention too (it overlaps the copies differently
        # at the other rate): close to the true ratio, not exact.
        assert repriced.rate_gparams_per_s / repriced.profile_gparams_per_s == pytest.approx(rate_ratio, rel=0.05)


def test_a_cost_per_update_call_is_recovered_from_runs_of_several_chunk_sizes(tmp_path):
    """2026-12-06: on a lent host the step's CPU update was busy 0.46 / 0.55 / 0.58 / 0.63 s at 1 / 2 / 4 / 8
    chunks a layer for the same parameters. Runs 'measured' on a machine with a cost per call and a slower
    compact rate: the refit recovers both (the cost within 12%: a later call meets fewer copies, so the rate
    part is not exactly a scale of the base's), and then predicts the runs; runs of one chunk size cannot
    separate the two, so the cost is kept and the report says why."""
    from slidedp.calibration.from_run import fit_update_call_us

    base = load_hardware("h200-x1")
    base = replace(base, host=replace(base.host, update_call_us={}))  # (the preset prices bf16+int8's calls)
    mode = "bf16+int8"
    slow = {t: v * 0.8 for t, v in base.host.state_update_gparams_per_s[mode].items()}
    truth = replace(base, host=replace(base.host, update_call_us={mode: 600.0}, state_update_gparams_per_s={
        **base.host.state_update_gparams_per_s, mode: slow}))
    spec = load_model_spec("qwen3-4b")
    paths = []
    for chunks in (1, 2, 4, 8):
        policy = Policy(micro_batch=1, accumulation=1, chunks_per_layer=chunks, state=mode, activation="keep",
                        update_schedule="next_forward", param_route="replicated", grad_route="per_rank")
        paths.append(simulated_run(tmp_path / f"c{chunks}", spec, policy, truth, 4096, 1)[0])
    records = [load_record(p) for p in paths]
    calls, report = fit_update_call_us(records, base)
    assert set(calls) == {mode} and calls[mode] == pytest.approx(600.0, rel=0.12)
    refit, report = refit_profile(base, records)
    assert refit.host.update_call_us[mode] == pytest.approx(600.0, rel=0.12)
    for t, v in refit.host.state_update_gparams_per_s[mode].items():
        assert v == pytest.approx(slow[t], rel=0.03)
    assert mape(validate(records, refit)) < 1.5 < 10 < mape(validate(records, base))
    # One chunk size: a cost per call is indistinguishable from a slower rate.
    kept, report = fit_update_call_us(records[2:3], base)
    assert kept == {} and "not separable" in report[mode]["why"]
    refit, report = refit_profile(base, records[2:3])
    assert refit.host.update_call_us == base.host.update_call_us and "why" in report["update_call_us"][mode]
    # Another mode's runs, at one size, leave its cost alone: the cost is fitted per mode.
    exact = Policy(micro_batch=1, accumulation=1, chunks_per_layer=4, activation="keep")
    other = simulated_run(tmp_path / "fp32", spec, exact, truth, 4096, 1)[0]
    calls, report = fit_update_call_us([*records, load_record(other)], base)
    assert set(calls) == {mode} and "not separable" in report["fp32"]["why"]


def test_the_cost_per_update_call_is_priced_per_call_by_the_simulator_and_the_analytical_model():
    """host.update_call_us adds its mode's microseconds per CPU update call: exactly in the analytical model's CPU
    demand, and in the simulator's busy time of the update (which also moves the copies it overlaps: close, not
    exact: shifted by the cost, its DRAM passes meet fewer copies); so more chunks a layer cost a CPU-bound step
    more, which the tuner then weighs."""
    from slidedp.calibration.from_run import busy_seconds
    from slidedp.model.demands import resource_demands
    from slidedp.model.step_model import estimate_step
    from slidedp.workload import StepWorkload

    base = load_hardware("h200-x1")
    base = replace(base, host=replace(base.host, update_call_us={}))
    costly = replace(base, host=replace(base.host, update_call_us={"bf16+int8": 1000.0}))
    spec = load_model_spec("qwen3-4b")
    policy = Policy(micro_batch=1, accumulation=1, chunks_per_layer=4, state="bf16+int8", activation="keep",
                    update_schedule="next_forward", param_route="replicated", grad_route="per_rank")
    w0, w1 = StepWorkload(spec, base, policy, 4096, 1), StepWorkload(spec, costly, policy, 4096, 1)
    calls = sum(map(w1.update_calls, range(len(w1.units))))
    assert calls == 4 * len(w1.units)
    assert resource_demands(w1)["cpu[0]"] - resource_demands(w0)["cpu[0]"] == pytest.approx(calls * 1e-3)
    s0, s1 = simulate(w0), simulate(w1)
    # The calls' cost, less what the update's DRAM passes gain where they now meet fewer copies.
    assert 0.8 * calls * 1e-3 < busy_seconds(s1.trace, "adam") - busy_seconds(s0.trace, "adam") <= calls * 1e-3
    assert s1.step_time_s > s0.step_time_s + 0.5 * calls * 1e-3
    one = replace(policy, chunks_per_layer=1)
    gain = (estimate_step(w1).step_time_s - estimate_step(StepWorkload(spec, costly, one, 4096, 1)).step_time_s)
    assert gain > 0.5 * 3 * len(w1.units) * 1e-3  # 3 calls a unit saved
    gpu_held = replace(policy, gpu_state_units=3)
    w = StepWorkload(spec, costly, gpu_held, 4096, 1)
    assert [w.update_calls(u) for u in range(3)] == [0, 0, 0] and w.update_calls(3) == 4
    # The cost is the mode's: the exact update on the same host has none.
    assert StepWorkload(spec, costly, replace(policy, state="fp32"), 4096, 1).update_call_latency == 0.0


def test_update_call_us_is_checked():
    base = load_hardware("h200-x1")
    with pytest.raises(SlideDPError, match="update_call_us.fp32"):
        replace(base.host, update_call_us={"fp32": -1.0})


def test_torch_threads_sets_the_count_in_the_block_and_restores_it_after_an_error():
    import torch

    from slidedp.calibration.measurements import torch_threads

    entry = torch.get_num_threads()
    other = 1 if entry != 1 else 2
    with pytest.raises(RuntimeError), torch_threads(other):
        assert torch.get_num_threads() == other
        torch.set_num_threads(entry + 1)  # a change inside the block is undone too
        raise RuntimeError("a benchmark failed")
    assert torch.get_num_threads() == entry
    with torch_threads(None):
        assert torch.get_num_threads() == entry


def test_link_rates_are_fitted_from_copies_that_had_their_switch_alone():
    """Copies of ranks behind one PCIe switch that overlap share its uplink: their rate is the uplink's share,
    not the link's. Only copies no other rank's overlapped behind the same switch are the link's own."""
    import pandas as pd

    from slidedp.calibration.from_run import uncontended_copies

    hw = load_hardware("h100-sxm-x4")  # GPUs 0 and 1 behind one switch, 2 and 3 behind the other
    assert {0, 1} == set(next(sw.gpus for sw in hw.switches if 0 in sw.gpus))
    copies = pd.DataFrame({"op": "h2d_param", "bytes": 1e8, "rank": [0, 1, 2, 0],
                           "start_s": [0.0, 0.5, 0.2, 2.0], "end_s": [1.0, 1.5, 1.2, 3.0]})
    # rank 1 overlaps rank 0 behind their switch; rank 2 overlaps them in time but sits behind the other one
    assert uncontended_copies(copies, "h2d_param", hw).index.tolist() == [2, 3]


def test_a_replicated_run_on_shared_switches_keeps_the_link_rates(tmp_path, capsys):
    """Four ranks fetching the same layers at once on two-GPU switches: every copy shares an uplink, so the
    refit keeps the base's link rates and says why (it halved them before, and no longer reproduced the run)."""
    (tmp_path / "p.yaml").write_text("param_route: replicated\n")
    run = tmp_path / "rep4"
    assert main(["simulate", "--hardware", "h100-sxm-x4", "--batch", "4", "--policy", str(tmp_path / "p.yaml"),
                 "--out", str(run)]) == 0
    base = load_hardware("h100-sxm-x4")
    record = load_record(run)
    refit, report = refit_profile(base, [record])
    assert (refit.gpu.h2d_gbps, refit.gpu.d2h_gbps) == (base.gpu.h2d_gbps, base.gpu.d2h_gbps)
    assert any("shared its PCIe switch" in w for w in report["warnings"])
    assert mape(validate([record], refit)) < 1


def test_runs_with_more_ranks_than_the_profiles_gpus_are_validated_with_a_warning(tmp_path, capsys):
    """validate (and calibrate --from-run) widen a profile to a run's rank count, each added GPU with a link of its
    own: said in one warning line, since several ranks may have shared a GPU."""
    import json

    paths = _simulated_runs(tmp_path, _truth(load_hardware("h200-x1")))[:2]
    paths[0] = paths[0].rename(paths[0].with_name("run[seed1]"))  # rich markup must not eat the name
    summary = json.loads((paths[0] / "summary.json").read_text())
    (paths[0] / "summary.json").write_text(json.dumps({**summary, "ranks": 2, "batch": 2 * summary["batch"]}))
    assert main(["validate", "--hardware", "h200-x1", *map(str, paths)]) == 0
    err = capsys.readouterr().err
    assert "run[seed1] ran 2 ranks, more than h200-x1's 1 GPU(s)" in err and paths[1].name not in err
    assert main(["validate", "--hardware", "h200-x1", str(paths[1])]) == 0
    assert "more than" not in capsys.readouterr().err


def test_a_run_that_cannot_be_predicted_on_the_profile_names_itself_and_the_profile_it_was_made_with(tmp_path,
                                                                                                     capsys):
    """validate and calibrate --from-run: a run made on a bigger machine (4 ranks x 28 optimizer threads) judged
    against the default 16-core h200-x1 is one error line that names the run and the profile it saved."""
    Policy(chunks_per_layer=4, adam_threads=28).save(tmp_path / "policy.yaml")
    path = tmp_path / "big"
    assert main(["simulate", "--model", "qwen3-4b", "--hardware", "h100-sxm-x4", "--seq", "1024", "--batch", "4",
                 "--policy", str(tmp_path / "policy.yaml"), "--out", str(path)]) == 0
    for argv in (["validate", str(path)], ["calibrate", "--from-run", str(path), "--out", str(tmp_path / "c.yaml")]):
        assert main(argv) == 2
        error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("slidedp: error:")]
        assert len(error) == 1 and "run 'big' on h200-x1: policy.adam_threads 28" in error[0], error
        assert f"made with h100-sxm-x4, saved as {path / 'hardware.yaml'}" in error[0], error
    assert main(["validate", str(path), "--hardware", str(path / "hardware.yaml")]) == 0


def test_a_gpu_calibration_names_the_card_it_measured(monkeypatch):
    """The report carries the card's name, UUID, SM count and memory (two lent cards of one model differ)."""
    from types import SimpleNamespace

    import slidedp.calibration.gpu_bench as gpu_bench

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid="GPU-1234", multi_processor_count=132,
                            total_memory=80 * 2**30)
    monkeypatch.setattr(gpu_bench.torch.cuda, "get_device_properties", lambda index: props)
    assert gpu_bench.device_identity() == {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234", "sm_count": 132,
                                           "memory_gib": 80.0}
