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


# Faster compute or more DRAM bandwidth never hurts. A faster PCIe link, CPU or GPU link can: under
# processor sharing the faster flow takes a larger share of host DRAM from a flow on the critical path
# (a scheduling anomaly real hosts show too). Across the 60-config sweep such anomalies stay below 0.6%;
# the bound below allows 1% and still catches any real inversion.
STRICT = {"gpu", "hostmem"}


@pytest.mark.parametrize("resource", sorted(FASTER))
@pytest.mark.parametrize("case", range(0, 60, 3))
def test_faster_resources_never_slow_the_step(resource, case):
    w = SWEEP[case]
    base = simulate(w).step_time_s
    faster_hw = FASTER[resource](w.hw)
    faster = simulate(StepWorkload(w.model, faster_hw, w.policy, w.seq, w.global_batch)).step_time_s
    assert faster <= base * (1 + (1e-9 if resource in STRICT else 1e-2))


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
    # capped flow takes 1/s; the other two split the remaining 9/s until "small" is done.
    assert finished["capped"] == pytest.approx(2.0)
    # Until t=2 the uncapped pair splits 9/s; "small" then has 1 unit left at 5/s of 10/s... precisely:
    # at t=2 each uncapped flow has moved 9 units; "small" finishes its last unit at 10/s shared by two.
    assert finished["small"] == pytest.approx(2.0 + 1.0 / 5.0)
    # Work conservation: 42 units through a 10/s link finish at 4.2 s.
    assert finished["big"] == pytest.approx(4.2)


def test_fluid_multi_resource_bottleneck():
    env = simpy.Environment()
    net = FluidNetwork(env, {"a": 10.0, "b": 4.0})
    times = {}

    def flow(name, usage):
        yield net.transfer(8.0, usage)
        times[name] = env.now

    env.process(flow("ab", {"a": 1.0, "b": 1.0}))  # limited by b: 4/s
    env.process(flow("a", {"a": 1.0}))  # max-min fair: gets the 6/s b's flow leaves on a
    env.run()
    assert times["ab"] == pytest.approx(2.0)
    assert times["a"] == pytest.approx(8.0 / 6.0)


def test_simulation_is_deterministic():
    a = simulate(SWEEP[3])
    b = simulate(SWEEP[3])
    assert a.step_time_s == b.step_time_s and a.trace.equals(b.trace)
