"""Physical sanity of the simulator: monotonic in resources, sharded routes save host traffic,
replicated H2D saturates a host whose DRAM is slower than the links together, fluid sharing is fair."""

import pytest
import simpy

from slidedp.policy import Policy
from slidedp.sim import simulate
from slidedp.sim.fluid import FluidNetwork
from slidedp.workload import StepWorkload
from tests.builders import free_machine, tiny_model, with_gpu, with_host, with_link
from tests.sim.sweep import SWEEP

FASTER = {
    "h2d": lambda hw: with_gpu(hw, h2d_gbps=hw.gpu.h2d_gbps * 1.5),
    "d2h": lambda hw: with_gpu(hw, d2h_gbps=hw.gpu.d2h_gbps * 1.5),
    "duplex": lambda hw: with_gpu(hw, duplex_gbps=hw.gpu.duplex_gbps * 1.5),
    "gpu": lambda hw: with_gpu(hw, matmul_tflops=hw.gpu.matmul_tflops * 1.5,
                               attention_tflops=hw.gpu.attention_tflops * 1.5),
    "hostmem": lambda hw: with_host(hw, mem_bw_gbps=hw.host.mem_bw_gbps * 1.5),
    "cores": lambda hw: with_host(hw, adam_gparams_per_s={k: v * 1.5 for k, v in hw.host.adam_gparams_per_s.items()},
                                  cast_gelems_per_s={k: v * 1.5 for k, v in hw.host.cast_gelems_per_s.items()}),
    "link": lambda hw: with_link(hw, bw_gbps=hw.link.bw_gbps * 1.5),
}


# Faster compute or more DRAM bandwidth never hurts. A faster PCIe link, CPU or GPU link can: host DRAM is
# shared in proportion to each flow's solo rate (sim/fluid.py, as measured on the H200), so a faster flow takes
# a larger share from a flow on the critical path (a scheduling anomaly real hosts show too). Across the
# 60-config sweep these stay below 1.2% for the links and 5.3% for 1.5x faster CPU passes (whose share of DRAM
# grows by the same 1.5x); the bounds below still catch any real inversion.
STRICT = {"gpu", "hostmem"}
ANOMALY_BOUND = {"cores": 0.06}


@pytest.mark.parametrize("resource", sorted(FASTER))
@pytest.mark.parametrize("case", range(0, 60, 3))
def test_faster_resources_never_slow_the_step(resource, case):
    w = SWEEP[case]
    base = simulate(w).step_time_s
    faster_hw = FASTER[resource](w.hw)
    faster = simulate(StepWorkload(w.model, faster_hw, w.policy, w.seq, w.global_batch)).step_time_s
    assert faster <= base * (1 + (1e-9 if resource in STRICT else ANOMALY_BOUND.get(resource, 0.015)))


@pytest.mark.parametrize("resource", ["h2d", "d2h", "cores", "link", "gpu", "hostmem"])
def test_single_bottleneck_machines_are_strictly_monotonic(resource):
    """Where one resource is the only limit, making it faster must make the step strictly faster."""
    limits = {
        "h2d": lambda hw: with_gpu(hw, h2d_gbps=10.0), "d2h": lambda hw: with_gpu(hw, d2h_gbps=10.0),
        "cores": lambda hw: with_host(hw, adam_gparams_per_s={1: 0.5}),
        "link": lambda hw: with_link(hw, bw_gbps=10.0),
        "gpu": lambda hw: with_gpu(hw, matmul_tflops=50.0, attention_tflops=50.0),
        "hostmem": lambda hw: with_host(hw, mem_bw_gbps=20.0),
    }
    hw = limits[resource](free_machine(2))
    w = StepWorkload(tiny_model(), hw, Policy(), 256, 2)
    faster = StepWorkload(tiny_model(), FASTER[resource](hw), Policy(), 256, 2)
    assert simulate(faster).step_time_s < simulate(w).step_time_s / 1.4


def _host_bytes(w, op):
    trace = simulate(w).trace
    return trace.loc[trace.op == op, "host_bytes"].sum()


@pytest.mark.parametrize("ranks", [2, 4])
def test_sharded_routes_move_one_nth_of_the_host_bytes(ranks):
    hw = free_machine(ranks)
    model = tiny_model()
    rep = StepWorkload(model, hw, Policy(param_route="replicated", grad_route="per_rank"), 256, ranks)
    sh = StepWorkload(model, hw, Policy(param_route="sharded", grad_route="reduce_scatter"), 256, ranks)
    assert _host_bytes(sh, "h2d_param") == pytest.approx(_host_bytes(rep, "h2d_param") / ranks, rel=1e-12)
    assert _host_bytes(sh, "d2h_grad") == pytest.approx(_host_bytes(rep, "d2h_grad") / ranks, rel=1e-12)


def test_replicated_h2d_on_four_gpus_saturates_host_memory():
    # Four 50 GB/s links but only 120 GB/s of DRAM: replicated delivery is DRAM-bound, sharded is not.
    hw = with_host(with_gpu(free_machine(4), h2d_gbps=50.0), mem_bw_gbps=120.0)
    model = tiny_model(layers=8)
    rep = simulate(StepWorkload(model, hw, Policy(param_route="replicated"), 256, 4))
    sh = simulate(StepWorkload(model, hw, Policy(param_route="sharded"), 256, 4))
    assert rep.utilization["hostmem"] > 0.95
    assert rep.bottleneck == "hostmem"
    per_gpu = rep.trace.query("op == 'h2d_param' and rank == 0")
    achieved = per_gpu.bytes.sum() / (per_gpu.end_s - per_gpu.start_s).sum()
    # Each link gets at most a quarter of DRAM (it shares the rest with the CPU update), never its 50 GB/s.
    assert achieved <= 120e9 / 4 * (1 + 1e-6)
    assert sh.step_time_s < 0.85 * rep.step_time_s  # the CPU update still needs its DRAM share


def test_rtx4090_routes_work_without_peer_links():
    from slidedp.hardware import load_hardware
    from slidedp.model_spec import load_model_spec

    hw = load_hardware("rtx4090-x4")
    model = load_model_spec("qwen3-0.6b")
    for pr in ("replicated", "sharded"):
        for gr in ("per_rank", "reduce_scatter"):
            result = simulate(StepWorkload(model, hw, Policy(param_route=pr, grad_route=gr), 1024, 4))
            assert result.step_time_s > 0
            coll = result.trace[result.trace.op.isin(["allgather", "reduce_scatter"])]
            assert (coll.host_bytes == 2 * coll.bytes).all()  # NCCL bounces through host DRAM


def test_fluid_processor_sharing():
    env = simpy.Environment()
    net = FluidNetwork(env, {"link": 10.0})
    finished = {}

    def flow(name, amount, delay=0.0, cap=float("inf")):
        yield env.timeout(delay)
        yield net.transfer(amount, {"link": 1.0}, cap)
        finished[name] = env.now

    env.process(flow("small", 10.0))
    env.process(flow("big", 30.0))
    env.process(flow("capped", 2.0, cap=1.0))
    env.run()
    # Each flow runs at the same fraction of its solo rate (10, 10 and 1): 21 t = 10, so the uncapped pair get
    # 100/21 each and "capped" 10/21 until "small" (10 units) is done at t = 2.1.
    assert finished["small"] == pytest.approx(2.1)
    # "capped" has 1 unit left; with "big" it now gets 1/11 of the link: 2.1 + 1 / (10/11) = 3.2.
    assert finished["capped"] == pytest.approx(3.2)
    # Work conservation: 42 units through a 10/s link finish at 4.2 s.
    assert finished["big"] == pytest.approx(4.2)


def test_fluid_multi_resource_bottleneck():
    env = simpy.Environment()
    net = FluidNetwork(env, {"a": 10.0, "b": 4.0})
    times = {}

    def flow(name, usage):
        yield net.transfer(8.0, usage)
        times[name] = env.now

    env.process(flow("ab", {"a": 1.0, "b": 1.0}))  # 4/s alone (b)
    env.process(flow("a", {"a": 1.0}))  # 10/s alone
    env.run()
    # Together they ask 14/s of a: each gets 10/14 of its solo rate (2.857 and 7.143/s), b is not saturated.
    # "a" ends at 8 / 7.143 = 1.12 s; "ab" has moved 3.2 by then and runs its last 4.8 at 4/s: 2.32 s.
    assert times["a"] == pytest.approx(1.12)
    assert times["ab"] == pytest.approx(2.32)


def test_simulation_is_deterministic():
    a = simulate(SWEEP[3])
    b = simulate(SWEEP[3])
    assert a.step_time_s == b.step_time_s and a.trace.equals(b.trace)


def _host_split(interference: dict[str, float], weight: float, dirs: tuple[str, ...], dram: float = 150.0):
    """GB/s of an AdamW-like pass (118 GB/s alone) and of copies (50 GB/s alone each direction) run together on
    the host network of slidedp.resources / sim.fluid."""
    from slidedp.resources import flow_class

    env = simpy.Environment()
    caps = {"hostmem": dram, "h2d[0]": 50.0, "d2h[0]": 50.0, "pcie[0]": 97.5}
    net = FluidNetwork(env, caps, flow_class, lambda d, _traffic: interference.get(d, 1.0) if d else 1.0, weight)
    cpu = net.transfer(1e6, {"hostmem": 1.0}, cap=118.0)
    copies = {d: net.transfer(1e6, {f"{d}[0]": 1.0, "pcie[0]": 1.0, "hostmem": 1.0}) for d in dirs}
    env.run(until=1.0)
    left = net.remaining()
    return 1e6 - left[cpu], {d: 1e6 - left[ev] for d, ev in copies.items()}


def test_a_cpu_pass_slows_for_the_copies_beside_it_and_weighs_more_on_dram():
    """The H200's measured behaviour (benchmarks/RESULTS.md, fifth session): the pass (118 GB/s alone) ran 1.47x
    slower with both copy directions running, 1.43x with D2H only; DRAM is shared by weight, the pass weighing
    ``weight`` x its (slowed) solo rate and each copy its own."""
    factors = {"h2d": 1.15, "d2h": 1.43, "h2d+d2h": 1.47}
    cpu, copies = _host_split(factors, 1.4, ("h2d", "d2h"))
    w_cpu = 1.4 * 118.0 / 1.47
    assert cpu == pytest.approx(150.0 * w_cpu / (w_cpu + 100.0))
    assert copies["h2d"] == pytest.approx(150.0 * 50.0 / (w_cpu + 100.0)) == copies["d2h"]
    cpu, copies = _host_split(factors, 1.4, ("h2d",), dram=400.0)  # DRAM to spare: only the interference
    assert cpu == pytest.approx(118.0 / 1.15) and copies["h2d"] == pytest.approx(50.0)
    cpu, copies = _host_split({}, 1.0, ("h2d", "d2h"))  # a host not measured: proportional sharing
    assert cpu == pytest.approx(150.0 * 118 / 218) and copies["h2d"] == pytest.approx(150.0 * 50 / 218)


def test_copies_keep_a_share_when_cpu_passes_alone_would_fill_dram():
    """A CPU pass of weight 2 and a copy of the same solo rate share 10/s as 2:1; the copy never starves."""
    from slidedp.resources import flow_class

    env = simpy.Environment()
    net = FluidNetwork(env, {"hostmem": 10.0, "h2d[0]": 10.0}, flow_class, None, 2.0)
    ends = {}

    def run(name, amount, usage, cap=float("inf")):
        yield net.transfer(amount, usage, cap)
        ends[name] = env.now

    env.process(run("cpu", 20.0, {"hostmem": 1.0}))
    env.process(run("copy", 12.0, {"h2d[0]": 1.0, "hostmem": 1.0}))
    env.run()
    # 6.67/s and 3.33/s until the pass ends at 3 s (the copy has 2 left), then the copy alone at 10/s.
    assert ends == {"cpu": pytest.approx(3.0), "copy": pytest.approx(3.2)}


def test_contention_fit_recovers_interference_and_weight_from_synthetic_measurements():
    """calibration.profile_fit: factors = times with copies over alone; the weight is the smallest with which the
    simulator, re-running the calibration experiment, gives the copies what they measured (or, where the pass's
    interference limit leaves them more whatever the weight, puts the pass at that limit)."""
    from dataclasses import replace

    from slidedp.calibration.profile_fit import contention_host, fit_cpu_dram_weight
    from slidedp.hardware import load_hardware
    from slidedp.sim.fluid import pass_beside_copies

    h200 = load_hardware("h200-x1")
    hw = replace(h200, gpu=replace(h200.gpu, duplex_gbps=97.5))  # the copies' duplex rate alone, as measured
    c = {"params": 2**28, "adam_bytes_per_param": 28, "threads": 16, "adam_alone_s": 0.064, "adam_with_h2d_s": 0.0734,
         "adam_with_d2h_s": 0.0917, "adam_with_h2d+d2h_s": 0.094, "dma_gbps_alone": 97.5, "dma_gbps_with_adam": 69.6}
    host = contention_host(c, hw)
    factors = host.dma_interference
    assert factors == {"h2d": pytest.approx(1.147), "d2h": pytest.approx(1.433), "h2d+d2h": pytest.approx(1.469)}
    pass_bytes, cap = 28 * 2**28, hw.host.adam_rate(16) * 28

    def copies(profile) -> float:
        run = pass_beside_copies(profile, pass_bytes, cap, ("h2d", "d2h"))
        return (run["h2d"] + run["d2h"]) / 1e9

    # With the copies' slowdown curve (one point: at 16 threads, keyed by the profile's pass traffic there, 4.52 G
    # params/s x 28 B = 126 GB/s (whole GB/s, rounded down), not the timed pass's 117; the factor 97.5 / 69.6) the
    # simulator gives them
    # the 69.6 GB/s they measured, with less extra weight on DRAM (which is full here: 86 + 69.6 > 149.6).
    assert host.copy_slowdown == {126: pytest.approx(97.5 / 69.6, abs=1e-3)}
    assert copies(replace(hw, host=host)) == pytest.approx(69.6, rel=0.01)
    # Without the curve (a profile from before it), the weight alone reproduces the experiment in-sample.
    no_curve = replace(hw, host=replace(hw.host, dma_interference=factors))
    weight = fit_cpu_dram_weight(no_curve, c)
    assert 1.0 <= host.cpu_dram_weight < weight
    fitted = replace(no_curve, host=replace(no_curve.host, cpu_dram_weight=weight))
    assert copies(fitted) == pytest.approx(69.6, rel=0.01)
    below = replace(fitted, host=replace(fitted.host, cpu_dram_weight=weight * 0.95))
    assert copies(below) > 69.6 * 1.005  # and the weight is the smallest that does it
    # Copies that got more during the pass than the weight-1 sharing gives: weight 1.
    assert fit_cpu_dram_weight(fitted, {**c, "dma_gbps_with_adam": 90.0}) == pytest.approx(1.0)
    # Copies that got less than any weight leaves them (the pass at its interference limit, 126.6 / 1.469 GB/s,
    # and the copies what DRAM leaves, 63.4): the smallest weight that puts the pass there.
    tight = fit_cpu_dram_weight(fitted, {**c, "dma_gbps_with_adam": 40.0})
    floor = 149.6 - hw.host.adam_rate(16) * 28 / 1.469 / 1e9
    assert copies(replace(fitted, host=replace(fitted.host, cpu_dram_weight=tight))) == pytest.approx(floor, rel=1e-3)
    assert copies(replace(fitted, host=replace(fitted.host, cpu_dram_weight=tight * 0.95))) > floor * 1.005
    assert contention_host({**c, "adam_with_h2d_s": 0.05}, hw).dma_interference["h2d"] == 1.0  # never below 1
    assert fit_cpu_dram_weight(hw, {k: v for k, v in c.items() if k != "dma_gbps_with_adam"}) == 1.0


def test_a_copy_slows_beside_cpu_passes_by_their_summed_traffic_even_with_dram_to_spare():
    """HostSpec.copy_slowdown through sim.fluid: the capacities only copies cross (PCIe direction, duplex) are
    divided by the slowdown at the CPU passes' summed solo traffic (here 60 + 40 GB/s -> 1.5), whatever DRAM has
    left; with no pass they are whole."""
    from slidedp.resources import flow_class

    def run(passes: list[float]) -> float:
        env = simpy.Environment()
        caps = {"hostmem": 1000.0, "h2d[0]": 50.0, "pcie[0]": 97.5}
        net = FluidNetwork(env, caps, flow_class, None, 1.0, lambda traffic: 1.0 + traffic / 200.0)
        for cap in passes:
            net.transfer(1e6, {"hostmem": 1.0}, cap=cap)
        copy = net.transfer(1e6, {"h2d[0]": 1.0, "pcie[0]": 1.0, "hostmem": 1.0})
        env.run(until=1.0)
        return 1e6 - net.remaining()[copy]

    assert run([]) == pytest.approx(50.0)
    assert run([60.0]) == pytest.approx(50.0 / 1.3)
    assert run([60.0, 40.0]) == pytest.approx(50.0 / 1.5)


def test_the_copy_slowdown_curve_interpolates_in_the_passes_traffic_and_is_checked():
    """1 with no traffic, linear from there to the first point and between points, flat beyond the last."""
    from dataclasses import replace

    from slidedp.errors import SlideDPError
    from slidedp.hardware import load_hardware

    host = replace(load_hardware("h200-x1").host, copy_slowdown={100: 1.2, 200: 1.4})
    assert host.copy_slowdown_at(0.0) == 1.0
    assert host.copy_slowdown_at(50e9) == pytest.approx(1.1)
    assert host.copy_slowdown_at(150e9) == pytest.approx(1.3)
    assert host.copy_slowdown_at(500e9) == pytest.approx(1.4)
    assert replace(host, copy_slowdown={}).copy_slowdown_at(150e9) == 1.0
    for bad in ({100: 0.9}, {0: 1.2}, {100: float("nan")}, {"100": 1.2}):
        with pytest.raises(SlideDPError, match="host.copy_slowdown"):
            replace(host, copy_slowdown=bad)


def test_the_copy_slowdown_curve_is_read_off_copies_timed_beside_the_pass_at_each_thread_count():
    """calibration.profile_fit.copy_slowdown_curve: key = the pass's DRAM traffic alone at that thread count,
    value = the copies' rate alone over their rate beside it; equal traffic averaged; nothing without the copies."""
    from slidedp.calibration.contention_bench import contention_grid_threads
    from slidedp.calibration.profile_fit import copy_slowdown_curve

    gb = 2**28 * 28 / 1e9  # the pass's GB
    c = {"params": 2**28, "adam_bytes_per_param": 28, "threads": 16, "dma_gbps_alone": 93.5,
         "adam_alone_s": gb / 210, "dma_gbps_with_adam": 67.5,
         "adam12_alone_s": gb / 190, "dma_gbps_with_adam12": 66.8,
         "adam8_alone_s": gb / 150, "dma_gbps_with_adam8": 72.0,
         "adam4_alone_s": gb / 95.2, "dma_gbps_with_adam4": 85.0,
         "adam3_alone_s": gb / 95.1, "dma_gbps_with_adam3": 87.0,  # the same whole GB/s as 4 threads: averaged
         "adam2_alone_s": gb / 50, "dma_gbps_with_adam2": 95.0}  # faster beside the pass than alone: 1
    curve = copy_slowdown_curve(c)
    assert curve == {50: 1.0, 95: pytest.approx((93.5 / 85 + 93.5 / 87) / 2, abs=1e-3),
                     150: pytest.approx(93.5 / 72, abs=1e-3), 190: pytest.approx(93.5 / 66.8, abs=1e-3),
                     210: pytest.approx(93.5 / 67.5, abs=1e-3)}
    assert copy_slowdown_curve({k: v for k, v in c.items() if k != "dma_gbps_alone"}) == {}
    # With the host profile, keyed by its AdamW rate at each thread count (the simulator's scale), not the pass's.
    from dataclasses import replace

    from slidedp.hardware import load_hardware

    host = replace(load_hardware("h200-x1").host, adam_gparams_per_s={2: 2.0, 4: 4.0, 8: 5.0, 16: 8.0})
    assert set(copy_slowdown_curve(c, host)) == {56, 84, 112, 140, 182, 224}  # 3 and 12: interpolated
    assert contention_grid_threads(16, quick=False) == [12, 8, 4, 2]
    assert contention_grid_threads(16, quick=True) == [8]
    assert contention_grid_threads(1, quick=False) == []


def test_the_contention_calibration_reports_how_far_its_repeats_ranged():
    """calibration.contention_bench.repeat_spread: largest over smallest less one, so a user sees what a
    contention prediction on the host can be held to; one sample (or a zero) has no spread."""
    from slidedp.calibration.contention_bench import repeat_spread

    assert repeat_spread([0.10, 0.12, 0.11]) == pytest.approx(0.2)
    assert repeat_spread([0.05]) == 0.0 and repeat_spread([0.0, 1.0]) == 0.0


def test_the_passes_interference_scales_with_its_own_traffic_where_a_curve_was_measured():
    """HostSpec.interference: a direction set's factor keeps its excess over 1 scaled by the h2d+d2h curve at the
    pass's traffic over the curve's top; no traffic given, or no curve: the factor as measured at all cores. The
    fit: with over alone at each thread count timed, keyed by traffic; one point is no curve."""
    from dataclasses import replace

    from slidedp.calibration.profile_fit import interference_curve
    from slidedp.hardware import load_hardware

    host = replace(load_hardware("h200-x1").host, dma_interference={"h2d": 1.2, "h2d+d2h": 1.4},
                   dma_interference_curve={100: 1.2, 200: 1.4})
    assert host.interference("h2d", 100e9) == pytest.approx(1.1)
    assert host.interference("h2d+d2h", 50e9) == pytest.approx(1.1)
    assert host.interference("h2d+d2h", 300e9) == pytest.approx(1.4) == host.interference("h2d+d2h")
    assert host.interference("", 100e9) == 1.0 and host.interference("d2h", 100e9) == 1.0
    assert replace(host, dma_interference_curve={}).interference("h2d", 100e9) == 1.2
    gb = 2**28 * 28 / 1e9
    c = {"params": 2**28, "adam_bytes_per_param": 28, "adam_alone_s": gb / 210, "adam_with_h2d+d2h_s": gb / 210 * 1.37,
         "adam8_alone_s": gb / 150, "adam8_with_h2d+d2h_s": gb / 150 * 1.3}
    assert interference_curve(c) == {150: pytest.approx(1.3), 210: pytest.approx(1.37)}
    assert interference_curve({k: v for k, v in c.items() if not k.startswith("adam8")}) == {}


def test_the_contention_benchmark_times_the_grid_the_fit_reads(monkeypatch):
    """calibration.contention_bench.contention_benchmark on a stand-in rig (no GPU here): every thread count of
    the grid gets the keys profile_fit.copy_slowdown_curve and interference_curve read, and both curves come out
    with one point per thread count."""
    import torch

    from slidedp.calibration import contention_bench
    from slidedp.calibration.measurements import Measurements
    from slidedp.calibration.profile_fit import copy_slowdown_curve, interference_curve

    class Rig:
        def __init__(self, params: int):
            self.params, self.adam_bytes_per_param = params, 28

        def adam(self, threads: int | None = None) -> float:
            return self.params * 28 / (10e9 * (threads or 16))  # 10 GB/s a thread

        def adam_during(self, dirs, threads: int | None = None):
            return self.adam(threads) * (1 + (threads or 16) / 40), {}

        def copies(self, dirs, stop=None, seconds=0.0):
            return dict.fromkeys(dirs, 50.0)

        def copies_during_adam(self, dirs, threads: int | None = None):
            return dict.fromkeys(dirs, 50.0 / (1 + (threads or 16) / 32))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    monkeypatch.setattr(contention_bench, "ContentionRig", Rig)
    m = Measurements()
    contention_bench.contention_benchmark(m, quick=False)
    assert copy_slowdown_curve(m.contention) == {20: 1.062, 40: 1.125, 80: 1.25, 120: 1.375, 160: 1.5}
    assert interference_curve(m.contention) == {20: 1.05, 40: 1.1, 80: 1.2, 120: 1.3, 160: 1.4}
