"""Peer systems in the simulator: the trace moves exactly the closed-form bytes and FLOPs of each system, each
single-resource limit is met, faster resources never slow a peer, and a missing optimizer rate refuses cleanly."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.peer_setup import spec_as_trained
from slidedp.compute import GPU_OPTIMIZER_HBM_BYTES, GPU_STATE_UPDATE_HBM_BYTES
from slidedp.errors import SlideDPError
from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.peers import (
    SYSTEMS,
    PeerStep,
    build_peer_plan,
    estimate_peer_memory,
    peer_step,
    peer_workload,
    phase_seconds,
    simulate_peer,
    system_workload,
)
from slidedp.peers.systems import (
    DEEPSPEED_CPU_ADAM,
    DEEPSPEED_CPU_ADAM_BF16,
    SLIDEFORMER_CPU_ADAM,
    TORCH_ADAMW_FUSED,
    TORCH_CLIP_GRAD_NORM,
    TORCH_CLIP_GRAD_NORM_BF16,
)
from tests.builders import free_machine, tiny_model, with_gpu, with_host, with_link

RATES = {TORCH_ADAMW_FUSED: {1: 1.0, 8: 4.0}, DEEPSPEED_CPU_ADAM: {1: 1.5, 8: 5.0},
         TORCH_CLIP_GRAD_NORM: {1: 2.0, 8: 8.0}, SLIDEFORMER_CPU_ADAM: {1: 1.2, 8: 4.5},
         DEEPSPEED_CPU_ADAM_BF16: {1: 1.8, 8: 6.0}, TORCH_CLIP_GRAD_NORM_BF16: {1: 1.0, 8: 3.0}}


def machine(gpus: int = 1, link: str = "nvlink", rates: dict | None = None):
    """A machine where every resource is finite but fast, with both peers' CPU optimizer rates."""
    hw = free_machine(gpus, link)
    hw = with_gpu(hw, h2d_gbps=25.0, d2h_gbps=20.0, duplex_gbps=40.0, matmul_tflops=50.0, attention_tflops=40.0,
                  pcie_latency_us=5.0)
    hw = with_link(hw, bw_gbps=30.0, latency_us=3.0)
    return with_host(hw, mem_bw_gbps=80.0, adam_gparams_per_s={1: 1.0}, cast_gelems_per_s={1: 2.0, 8: 8.0},
                     stream_gbps={1: 10.0, 8: 40.0}, cores=16, peer_adam_gparams_per_s=rates or RATES)


CASES = [(name, gpus, link, tied) for name in SYSTEMS for gpus, link, tied in
         ((1, "nvlink", False), (2, "nvlink", True), (4, "host", False), (3, "nvlink", False), (1, "host", True))
         if gpus == 1 or not SYSTEMS[name].single_gpu]


@pytest.mark.parametrize("name, gpus, link, tied", CASES, ids=lambda v: str(v))
def test_trace_bytes_and_flops_equal_the_closed_form(name, gpus, link, tied):
    step = peer_step(name, tiny_model(layers=5, tied=tied), machine(gpus, link), 512, 2 * gpus)
    trace = simulate_peer(step).trace.assign(seconds=lambda t: t.end_s - t.start_s)
    by_op = trace.groupby("op")[["bytes", "host_bytes", "flops", "seconds"]].sum()
    expected = step.closed_form_totals()
    assert set(by_op.index) == set(expected)
    for op, totals in expected.items():
        for column, value in totals.items():
            assert by_op.loc[op, column] == pytest.approx(value, rel=1e-9, abs=1e-6), (op, column)


def test_closed_forms_are_the_documented_bytes_per_parameter():
    """Per parameter and step, summed over N = 4 ranks: FSDP2-offload copies fp32 weights in twice (forward and
    backward, the root once) and fp32 gradients out once; ZeRO-2-Offload copies fp32 gradients out and bf16
    weights back; DDP all-reduces fp32 gradients (2 (N-1)/N x 4 B per rank)."""
    model = tiny_model(layers=6)
    p, layers = model.total_params, model.layers * model.layer_params
    totals = {name: peer_step(name, model, machine(4), 256, 4).closed_form_totals() for name in SYSTEMS
              if not SYSTEMS[name].single_gpu}
    assert totals["fsdp2-offload"]["h2d_param"]["bytes"] == pytest.approx(4 * (p + layers))
    assert totals["fsdp2-offload"]["d2h_grad"]["bytes"] == pytest.approx(4 * p)
    assert totals["fsdp2-offload"]["adam"]["host_bytes"] == pytest.approx(28 * p)
    assert totals["zero2-offload"]["h2d_param"]["bytes"] == pytest.approx(2 * p)
    assert totals["zero2-offload"]["d2h_grad"]["bytes"] == pytest.approx(4 * p)
    assert totals["zero2-offload"]["cast"]["host_bytes"] == pytest.approx(6 * p)
    assert totals["zero3-offload"]["h2d_param"]["bytes"] == pytest.approx(2 * (p + layers))
    # ZeRO-3 stages each bf16 gradient partition on the host and back before its fp32 copy: 2 + 4 B out, 2 B in
    assert totals["zero3-offload"]["d2h_grad"]["bytes"] == pytest.approx(6 * p)
    assert totals["zero3-offload"]["h2d_grad"]["bytes"] == pytest.approx(2 * p)
    assert totals["zero3-offload"]["adam"]["host_bytes"] == pytest.approx(28 * p)  # reads the fp32 gradient
    assert totals["ddp-resident"]["allreduce"]["bytes"] == pytest.approx(4 * 2 * 3 / 4 * 4 * p)
    assert totals["fsdp2-resident"]["reduce_scatter"]["bytes"] == pytest.approx(4 * 3 / 4 * 4 * p)
    for name in ("ddp-resident", "fsdp2-resident"):
        assert not {"h2d_param", "d2h_grad", "adam"} & set(totals[name])


def test_cpu_optimizer_limit_matches_its_closed_form():
    """Everything but the peer's CPU AdamW free: the step is the update of every parameter at that rate."""
    model = tiny_model(layers=4)
    hw = with_host(free_machine(1), peer_adam_gparams_per_s={TORCH_ADAMW_FUSED: {1: 0.001},
                                                             TORCH_CLIP_GRAD_NORM: {1: 1e6}}, cores=1)
    step = PeerStep(SYSTEMS["fsdp2-offload"], peer_workload(model, hw, 256, 1))
    assert simulate_peer(step).step_time_s == pytest.approx(model.total_params / 1e6, rel=0.01)


def test_measured_clip_rate_sets_fsdp2_offloads_clip_pass():
    """FSDP2-offload's clip runs at torch's measured clip_grad_norm_ rate; ZeRO-2's at the streaming rate."""
    model = tiny_model(layers=4)
    hw = with_host(free_machine(1), peer_adam_gparams_per_s={TORCH_ADAMW_FUSED: {1: 1e6}, DEEPSPEED_CPU_ADAM: {1: 1e6},
                                                             TORCH_CLIP_GRAD_NORM: {1: 0.001}}, cores=1)
    assert simulate_peer(PeerStep(SYSTEMS["fsdp2-offload"], peer_workload(model, hw, 256, 1))).step_time_s == \
        pytest.approx(model.total_params / 1e6, rel=0.01)
    assert simulate_peer(PeerStep(SYSTEMS["zero2-offload"], peer_workload(model, hw, 256, 1))).step_time_s < \
        model.total_params / 1e7


def test_gpu_resident_step_is_its_compute_plus_the_gpu_update():
    model = tiny_model(layers=4)
    hw = with_gpu(free_machine(1), matmul_tflops=5.0, attention_tflops=5.0, adam_gparams_per_s=0.01)
    step = peer_step("ddp-resident", model, hw, 256, 2)
    compute = sum(u.fwd_s + u.bwd_s for u in step.w.units)
    # its clip + AdamW (40 B a parameter) at the bandwidth of the profile's GPU update rate (SlideDP's 42 B pass)
    update = model.total_params / 1e7 * GPU_OPTIMIZER_HBM_BYTES / GPU_STATE_UPDATE_HBM_BYTES
    assert simulate_peer(step).step_time_s == pytest.approx(compute + update, rel=1e-6)


def test_gpu_resident_optimizer_step_is_its_clip_and_fused_adamw_through_hbm():
    """The clip (12 B) and fused AdamW (28 B) are one memory pass at the optimizer's own bandwidth where calibration
    timed it (the H100 presets: 2646 GB/s, call65): for Qwen3-4B 60.8 ms, 10% under the 22.7 + 45.0 ms measured on
    an H100 (benchmarks/RESULTS.md, call49 --phases; 66-68 ms in c65, which has a fixed part of about 4 ms the
    bandwidth does not price); sharded over N GPUs by FSDP2, replicated by DDP. Without that bandwidth (the H200's
    preset, a profile without curves) the pass runs at the bandwidth of the profile's GPU update rate, SlideDP's own
    pass (adam_gparams_per_s x GPU_STATE_UPDATE_HBM_BYTES): the one rule both share (GPUSpec.optimizer_pass_seconds)."""
    from slidedp.hardware import load_hardware
    from slidedp.model_spec import load_model_spec

    qwen = load_model_spec("qwen3-4b")
    h100 = peer_step("ddp-resident", qwen, load_hardware("h100-sxm-x1"), 4096, 1)
    assert h100.gpu_adam_s() == pytest.approx(0.0608, rel=0.005)
    assert h100.gpu_adam_s() == pytest.approx(0.0227 + 0.0450, rel=0.15)
    four = load_hardware("h100-sxm-x4")
    replicated = peer_step("ddp-resident", qwen, four, 4096, 4).gpu_adam_s()
    sharded = peer_step("fsdp2-resident", qwen, four, 4096, 4).gpu_adam_s()
    assert sharded == pytest.approx(replicated / 4, rel=0.01)
    h200 = load_hardware("h200-x1")
    assert "optimizer" not in h200.gpu.compute.memory_gbps_by_kind
    at_update_rate = qwen.total_params * GPU_OPTIMIZER_HBM_BYTES / (
        h200.gpu.adam_gparams_per_s * 1e9 * GPU_STATE_UPDATE_HBM_BYTES)
    assert peer_step("ddp-resident", qwen, h200, 4096, 1).gpu_adam_s() == pytest.approx(at_update_rate, rel=1e-9)
    hw = with_gpu(free_machine(1), adam_gparams_per_s=2.0)
    model = tiny_model(layers=4)
    assert peer_step("ddp-resident", model, hw, 256, 2).gpu_adam_s() == pytest.approx(
        model.total_params / 2e9 * GPU_OPTIMIZER_HBM_BYTES / GPU_STATE_UPDATE_HBM_BYTES)


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_faster_resources_never_slow_a_peer(name):
    model = tiny_model(layers=5)
    base = machine(1 if SYSTEMS[name].single_gpu else 2)
    faster = [
        with_host(base, peer_adam_gparams_per_s={k: {t: 3 * r for t, r in c.items()} for k, c in RATES.items()}),
        with_host(base, mem_bw_gbps=400.0), with_gpu(base, h2d_gbps=100.0, d2h_gbps=100.0, duplex_gbps=200.0),
        with_gpu(base, matmul_tflops=200.0, attention_tflops=200.0), with_link(base, bw_gbps=300.0),
    ]
    t0 = simulate_peer(peer_step(name, model, base, 512, 4)).step_time_s
    for hw in [*faster, with_host(base, cast_gelems_per_s={1: 20.0, 8: 80.0})]:
        assert simulate_peer(peer_step(name, model, hw, 512, 4)).step_time_s <= t0 * (1 + 0.01)


def test_offloading_peers_wait_for_the_whole_backward_before_the_cpu_update():
    step = peer_step("zero2-offload", tiny_model(layers=4), machine(1), 512, 2)
    trace = simulate_peer(step).trace
    last_backward = trace[trace.op.isin(["bwd", "d2h_grad"])].end_s.max()
    cpu = trace[trace.op.isin(["clip", "adam", "cast"])]
    assert cpu.start_s.min() >= last_backward - 1e-12
    writeback = trace[(trace.op == "h2d_param")]
    assert writeback.start_s.min() >= cpu.end_s.max() - 1e-12


def test_a_peer_without_its_cpu_optimizer_rate_refuses_with_one_line():
    h200 = load_hardware("h200-x1")
    hw = with_host(h200, peer_adam_gparams_per_s={  # as if DeepSpeedCPUAdam had never been timed there
        k: v for k, v in h200.host.peer_adam_gparams_per_s.items() if k != DEEPSPEED_CPU_ADAM})
    with pytest.raises(SlideDPError, match="deepspeed_cpu_adam") as err:
        peer_step("zero2-offload", load_model_spec("qwen3-4b"), hw, 4096, 1)
    assert "\n" not in str(err.value) and "peer_adam_gparams_per_s" in str(err.value)
    step = PeerStep(SYSTEMS["zero3-offload"], peer_workload(load_model_spec("qwen3-0.6b"), hw, 1024, 1))
    with pytest.raises(SlideDPError, match="deepspeed_cpu_adam"):
        build_peer_plan(step)
    assert peer_step("fsdp2-offload", load_model_spec("qwen3-0.6b"), hw, 1024, 1)  # torch's rate is there


def test_h200_preset_carries_the_measured_peer_rates():
    host = load_hardware("h200-x1").host
    assert host.peer_adam_gparams_per_s[TORCH_ADAMW_FUSED] == {4: 1.533, 8: 3.536, 16: 4.141}
    assert host.peer_adam_gparams_per_s[DEEPSPEED_CPU_ADAM] == {4: 2.145, 8: 3.571, 16: 4.113}
    assert host.peer_adam_gparams_per_s[TORCH_CLIP_GRAD_NORM] == {4: 1.617, 8: 1.983, 16: 1.983}
    assert "peer_bench" in load_hardware("h200-x1").notes


def test_specs_are_frozen_and_batch_must_divide():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SYSTEMS["ddp-resident"].gpu_weight_bytes = 2
    with pytest.raises(SlideDPError, match="divisible"):
        peer_step("ddp-resident", tiny_model(), machine(2), 256, 3)


def test_host_memory_of_the_offloading_peers_includes_what_they_were_measured_to_hold():
    """ZeRO-2-Offload held 27.8 B/param and FSDP2-offload 19.2 on the H200 (RSS), where their state is 16: the
    memory model adds the measured excess, so a 14B model does not 'fit' a 128 GiB host for DeepSpeed. DeepSpeed's
    rows trained Qwen3-4B with its head untied (4.41 G parameters), so they are set against that model."""
    hw, spec = load_hardware("h200-x1"), load_model_spec("qwen3-4b")
    zero2 = estimate_peer_memory(peer_step("zero2-offload", spec, hw, 4096, 1))
    fsdp2 = estimate_peer_memory(peer_step("fsdp2-offload", spec, hw, 4096, 1))
    assert zero2.host_bytes_per_param == fsdp2.host_bytes_per_param == 16  # the state
    assert zero2.host_total / spec.total_params == pytest.approx(27.8)
    assert fsdp2.host_total / spec.total_params == pytest.approx(19.2)
    assert fsdp2.host_total_gib() == pytest.approx(73.7 - 1.6, rel=0.01)  # the measured RSS less the baseline
    untied = spec_as_trained(spec, {"system": "deepspeed-offload"})
    as_trained = estimate_peer_memory(peer_step("zero2-offload", untied, hw, 4096, 1))
    assert as_trained.host_total_gib() == pytest.approx(115.9 - 1.6, rel=0.01)
    big = estimate_peer_memory(peer_step("zero2-offload", load_model_spec("qwen3-14b"), hw, 4096, 1))
    assert big.shortfalls(1e15, hw.host.memory_gib * 2**30)


def test_layer_streaming_peers_move_the_bytes_their_code_moves():
    """Per parameter and step (benchmarks/peer_sources.md): SlideFormer copies bf16 weights in for forward and
    again for each decoder layer's backward, each copy fed by a CPU cast of the fp32 master (6 DRAM bytes per
    element on top of the copy's 2), bf16 gradients out, every decoder layer's input out and back, and its CPU Adam
    reads a bf16 gradient beside fp32 p, m, v (26 B); no clip. MegaTrain copies each decoder layer in three times
    (forward, the block's recompute, the forward with autograd) and never the GPU-resident embedding and head, which
    it copies back after the update; its AdamW updates bf16 weights (22 B), its clip reads and scales bf16
    gradients (6 B), and the pinned copies of the decoder layers are refreshed (4 B); each layer runs one extra
    forward in backward."""
    model = tiny_model(layers=6, tied=False)
    p, layers = model.total_params, model.layers * model.layer_params
    root = p - layers
    sf = peer_step("slideformer", model, machine(1), 256, 2)
    ckpt = model.layers * model.checkpoint_bytes_per_token() * 256 * 2
    t = sf.closed_form_totals()
    assert t["h2d_param"]["bytes"] == pytest.approx(2 * (p + layers))
    assert t["h2d_param"]["host_bytes"] == pytest.approx(4 * 2 * (p + layers))
    assert t["d2h_grad"]["bytes"] == pytest.approx(2 * p)
    assert t["adam"]["host_bytes"] == pytest.approx(26 * p)
    assert t["d2h_ckpt"]["bytes"] == t["h2d_ckpt"]["bytes"] == pytest.approx(ckpt)
    assert not {"clip", "cast"} & set(t)
    mt = peer_step("megatrain", model, machine(1), 256, 2)
    t = mt.closed_form_totals()
    assert t["h2d_param"]["bytes"] == pytest.approx(2 * 3 * layers + 2 * root)
    assert t["adam"]["host_bytes"] == pytest.approx(22 * p)
    assert t["clip"]["host_bytes"] == pytest.approx(6 * p)
    assert t["cast"]["host_bytes"] == pytest.approx(4 * layers)
    layer_fwd = sum(u.fwd_flops for u in mt.w.units if u.kind == "layer")
    assert t["bwd"]["flops"] == pytest.approx(sum(u.bwd_flops for u in mt.w.units) + layer_fwd)
    assert "d2h_ckpt" not in t


def test_slideformer_updates_each_layer_during_backward_and_reuses_two_gradient_buffers():
    step = peer_step("slideformer", tiny_model(layers=6), machine(1), 512, 2)
    trace = simulate_peer(step).trace
    adam, bwd, d2h = (trace[trace.op == op].set_index("unit") for op in ("adam", "bwd", "d2h_grad"))
    assert len(adam) == step.w.num_units
    assert adam.start_s.min() < bwd.end_s.max()  # the first updates run while backward goes on
    for u in d2h.index:
        assert adam.loc[u, "start_s"] >= d2h.loc[u, "end_s"] - 1e-12
        if u + 2 in adam.index:  # its host buffer is the one the update two units later read
            assert d2h.loc[u, "start_s"] >= adam.loc[u + 2, "end_s"] - 1e-12


def test_megatrain_never_fetches_its_gpu_resident_root_and_updates_after_backward():
    step = peer_step("megatrain", tiny_model(layers=4, tied=False), machine(1), 512, 2)
    trace = simulate_peer(step).trace
    roots = [u.index for u in step.w.units if u.kind != "layer"]
    fetched = trace[(trace.op == "h2d_param") & trace.unit.isin(roots)]
    backward_end = trace[trace.op.isin(["bwd", "d2h_grad"])].end_s.max()
    assert (fetched.start_s >= backward_end - 1e-12).all()  # only the copy back after the update
    cpu = trace[trace.op.isin(["clip", "adam", "cast"])]
    assert cpu.start_s.min() >= backward_end - 1e-12


def test_layer_streaming_peers_without_their_measured_rates_refuse_and_run_on_one_gpu_only():
    """A profile without SlideFormer's own Adam (the shipped one has none) or MegaTrain's bf16 DeepSpeedCPUAdam and
    clip (h200-x1 has them since 2026-12-06) refuses in one line rather than borrow the fp32 rates of the other
    peers; with them, both run."""
    shipped = load_hardware("h200-x1")
    host = shipped.host
    untimed = dataclasses.replace(shipped, host=dataclasses.replace(host, peer_adam_gparams_per_s={
        k: v for k, v in host.peer_adam_gparams_per_s.items() if k != DEEPSPEED_CPU_ADAM_BF16}))
    cases = (("slideformer", SLIDEFORMER_CPU_ADAM, shipped), ("megatrain", DEEPSPEED_CPU_ADAM_BF16, untimed))
    for name, key, hw in cases:
        with pytest.raises(SlideDPError, match=key) as err:
            peer_step(name, load_model_spec("qwen3-4b"), hw, 4096, 1)
        assert "\n" not in str(err.value)
        assert peer_step(name, tiny_model(), machine(1), 256, 1)
    assert peer_step("megatrain", load_model_spec("qwen3-4b"), shipped, 4096, 1)
    for name in ("slideformer", "megatrain"):
        with pytest.raises(SlideDPError, match="one GPU"):
            peer_step(name, tiny_model(), machine(2), 256, 2)


def test_peer_bench_times_the_bf16_clip_megatrain_runs():
    """The bf16 variants time the same functions over bf16 tensors (the clip here; DeepSpeed is not installed)."""
    from slidedp.calibration.peer_bench import BF16_IMPLEMENTATIONS, IMPLEMENTATIONS, time_step

    assert set(BF16_IMPLEMENTATIONS) == {DEEPSPEED_CPU_ADAM_BF16, TORCH_CLIP_GRAD_NORM_BF16}
    assert not set(BF16_IMPLEMENTATIONS) & set(IMPLEMENTATIONS)  # `slidedp calibrate` does not time them
    assert time_step(TORCH_CLIP_GRAD_NORM_BF16, 2**14, 1) > 0


def test_two_cpu_passes_on_every_core_time_share_the_cores():
    """A peer's fetch cast and its update, each a team of every core (SlideFormer: torch's copy_ and its own
    OpenMP Adam on the same 16 cores), run each at its share of its solo rate, not both at full speed."""
    import simpy

    from sim.fluid import FluidNetwork
    from slidedp.resources import CORES, cpu_pass_usage

    env = simpy.Environment()
    net = FluidNetwork(env, {"hostmem": 1e12, CORES: 1.0})
    done = {}

    def run(name, amount, rate):
        yield net.transfer(amount, cpu_pass_usage(rate), cap=rate)
        done[name] = env.now

    env.process(run("cast", 4.0, 2.0))  # 2 s alone
    env.process(run("adam", 6.0, 3.0))  # 2 s alone
    env.run()
    assert done["cast"] == pytest.approx(4.0) and done["adam"] == pytest.approx(4.0)  # together: the sum


def test_slideformers_cast_and_update_share_the_cores_in_its_step():
    from dataclasses import replace as _replace

    from slidedp.resources import CORES

    hw = load_hardware("h200-x1")
    rates = {**hw.host.peer_adam_gparams_per_s, "slideformer_cpu_adam": hw.host.peer_adam_gparams_per_s[
        "deepspeed_cpu_adam"]}
    hw = _replace(hw, host=_replace(hw.host, peer_adam_gparams_per_s=rates))
    step = PeerStep(SYSTEMS["slideformer"], peer_workload(load_model_spec("qwen3-0.6b"), hw, 1024, 1, "eager"))
    plan = build_peer_plan(step)
    assert all(CORES in op.usage for op in plan.ops if op.op in ("adam", "h2d_param"))
    assert simulate_peer(step).step_time_s > 0


def _ops(sim, name: str):
    t = sim.trace[(sim.trace["rank"] == 0) & (sim.trace["op"] == name)]
    return t, float((t["end_s"] - t["start_s"]).sum())


def test_fsdp2_offloads_copies_wait_for_the_previous_pass_so_each_pass_waits_for_its_whole_copy():
    """FSDP2 + CPUOffloadPolicy measured forward = passes + copies (c54): no copy overlaps a pass; with the flag off
    (every other streaming peer) the copies run ahead and the forward is shorter."""
    hw, model = machine(), tiny_model()
    serial = PeerStep(SYSTEMS["fsdp2-offload"], peer_workload(model, hw, 256, 1))
    overlapped = PeerStep(dataclasses.replace(SYSTEMS["fsdp2-offload"], fetch_overlaps_passes=True),
                          peer_workload(model, hw, 256, 1))
    sim, ahead = simulate_peer(serial), simulate_peer(overlapped)
    fwd, passes = _ops(sim, "fwd")
    copies = sim.trace[(sim.trace["rank"] == 0) & (sim.trace["op"] == "h2d_param")
                       & (sim.trace["end_s"] <= fwd["end_s"].max())]
    for (_, c), (_, p) in zip(copies.sort_values("start_s").iterrows(), fwd.sort_values("start_s").iterrows(),
                                  strict=True):
        assert c["end_s"] <= p["start_s"] + 1e-12  # each pass waits for its copy
    starts = copies.sort_values("start_s")["start_s"].tolist()[1:]
    ends = fwd.sort_values("start_s")["end_s"].tolist()[:-1]
    assert all(s >= e - 1e-12 for s, e in zip(starts, ends, strict=True))  # and the next copy waits for that pass
    forward = phase_seconds(serial, sim.trace, sim.step_time_s)["forward"]
    assert forward == pytest.approx(passes + float((copies["end_s"] - copies["start_s"]).sum()), rel=1e-6)
    assert phase_seconds(overlapped, ahead.trace, ahead.step_time_s)["forward"] < forward


@pytest.mark.parametrize("name", ["zero2-offload", "fsdp2-offload", "ddp-resident", "zero3-offload"])
def test_a_peers_phases_add_up_to_its_step_and_name_the_clip_where_it_runs_on_the_cpu(name):
    hw = machine()
    step = PeerStep(SYSTEMS[name], system_workload(SYSTEMS[name], tiny_model(), hw, 256, 2))
    sim = simulate_peer(step)
    phases = phase_seconds(step, sim.trace, sim.step_time_s)
    assert phases["forward"] + phases["backward"] + phases["after_backward"] == pytest.approx(sim.step_time_s)
    assert phases["forward"] == pytest.approx(float(_ops(sim, "fwd")[0]["end_s"].max()))
    assert min(phases.values()) > 0
    assert ("clip" in phases) == step.system.updates_on_cpu
    if "clip" in phases:
        assert phases["clip"] == pytest.approx(_ops(sim, "clip")[1])
        assert phases["clip"] < phases["after_backward"]


@pytest.mark.parametrize("gpus", [1, 2])
def test_fsdp2_offloads_backward_refetch_waits_for_the_layer_after_it(gpus):
    """In backward a layer's re-fetch starts only when the layer after it (computed just before) has finished its
    backward, on every rank; with copies that overlap, it may start a layer earlier than that."""
    hw, model = machine(gpus), tiny_model()
    for overlaps in (False, True):
        system = dataclasses.replace(SYSTEMS["fsdp2-offload"], fetch_overlaps_passes=overlaps)
        step = PeerStep(system, system_workload(system, model, hw, 256, 2 * gpus))
        t = simulate_peer(step).trace
        for r in range(gpus):
            mine = t[t["rank"] == r]
            fwd_end = float(mine.loc[mine["op"] == "fwd", "end_s"].max())
            refetch = mine[(mine["op"] == "h2d_param") & (mine["start_s"] >= fwd_end - 1e-12)]
            bwd_end = mine[mine["op"] == "bwd"].set_index("unit")["end_s"]
            waits = [row.start_s >= bwd_end[row.unit + 1] - 1e-12 for row in refetch.itertuples()
                     if row.unit + 1 in bwd_end.index]
            assert waits and all(waits) != overlaps


def test_the_backward_ends_where_the_first_op_after_it_starts_once_every_gradient_is_on_the_host():
    hw = machine()
    for name in ("zero2-offload", "fsdp2-offload"):
        step = PeerStep(SYSTEMS[name], system_workload(SYSTEMS[name], tiny_model(), hw, 256, 2))
        sim = simulate_peer(step)
        phases = phase_seconds(step, sim.trace, sim.step_time_s)
        backward_end = phases["forward"] + phases["backward"]
        clip, _ = _ops(sim, "clip")
        d2h, _ = _ops(sim, "d2h_grad")
        assert backward_end == pytest.approx(float(clip["start_s"].min()))
        assert backward_end >= float(d2h["end_s"].max()) - 1e-12
    with pytest.raises(ValueError, match="no forward pass"):
        phase_seconds(step, sim.trace[sim.trace["op"] != "fwd"], sim.step_time_s)


def test_fsdp2_offload_holds_one_fetched_layer_where_its_copies_cannot_run_ahead():
    hw = machine()
    serial = estimate_peer_memory(PeerStep(SYSTEMS["fsdp2-offload"], peer_workload(tiny_model(), hw, 256, 1)))
    ahead = estimate_peer_memory(PeerStep(dataclasses.replace(SYSTEMS["fsdp2-offload"], fetch_overlaps_passes=True),
                                          peer_workload(tiny_model(), hw, 256, 1)))
    assert ahead.gpu_forward > serial.gpu_forward and ahead.gpu_state == serial.gpu_state


def test_slidedps_gpu_held_update_keeps_its_own_rate_where_the_peers_pass_has_a_measured_bandwidth():
    """GPUSpec.optimizer_pass_seconds: SlideDP's update of GPU-held units is priced at the rate calibrate times for
    exactly that pass (params / adam_gparams_per_s), even where the curves carry the peers' clip + fused AdamW
    bandwidth (the H100 presets); the peers' pass takes that bandwidth."""
    from slidedp import compute as c
    from slidedp.hardware import load_hardware
    from slidedp.policy import Policy
    from slidedp.workload import StepWorkload

    hw = load_hardware("h100-sxm-x1")
    assert "optimizer" in hw.gpu.compute.memory_gbps_by_kind
    model = tiny_model(layers=4)
    w = StepWorkload(model, hw, Policy(micro_batch=1, accumulation=1, gpu_state_units=2), 256, 1)
    assert w.gpu_adam_s(0) == pytest.approx(w.units[0].params / (hw.gpu.adam_gparams_per_s * 1e9), rel=1e-9)
    assert w.gpu_adam_s(3) == 0.0
    peers = hw.gpu.optimizer_pass_seconds(c.gpu_optimizer_op(1e9))
    assert peers == pytest.approx(hw.gpu.compute.seconds(c.gpu_optimizer_op(1e9)), rel=1e-9)
    assert peers != pytest.approx(hw.gpu.update_rate_seconds(c.gpu_optimizer_op(1e9).nbytes), rel=0.01)
