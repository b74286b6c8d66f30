"""Several hosts in the models: cross-host collectives as flows on one host's NICs (simulator and analytical
model agree and conserve bytes), host memory per host under each layout, the tuner's choice of layout, and the
inputs that cannot describe several hosts."""

from dataclasses import replace

import pytest

from slidedp.cli import main
from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, NetworkSpec, load_hardware
from slidedp.model import estimate_memory, estimate_step, lower_bound
from slidedp.model.demands import op_totals
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.problem import Budget
from slidedp.sim import simulate
from slidedp.tune import TuneSpace, enumerate_policies, tune
from slidedp.workload import StepWorkload
from tests.sim.sweep import assert_trace_conserves_op_totals

HW = load_hardware("h100-sxm-x8-ib").with_gpus(4)
MODEL = load_model_spec("qwen3-8b")


def _workload(layout: str, grad: str, hosts: int, hw=HW, schedule: str = "next_forward") -> StepWorkload:
    policy = Policy(grad_route=grad, host_layout=layout, micro_batch=1, accumulation=2, chunks_per_layer=2,
                    update_schedule=schedule)
    return StepWorkload(MODEL, hw, policy, 1024, hosts * hw.num_gpus * 2, hosts=hosts)


CASES = [(layout, grad, hosts) for layout in ("replicated", "sharded") for grad in ("reduce_scatter", "per_rank")
         for hosts in (2, 4)]


@pytest.mark.parametrize("layout, grad, hosts", CASES)
def test_simulator_conserves_cross_host_bytes_and_the_model_agrees(layout, grad, hosts):
    w = _workload(layout, grad, hosts)
    sim = simulate(w)
    assert_trace_conserves_op_totals(sim.trace, w)
    expected = op_totals(w)
    nic_ops = {"host_allreduce", "host_reduce_scatter", "weight_allgather"} & set(expected)
    assert nic_ops == ({"host_allreduce"} if layout == "replicated" else {"host_reduce_scatter", "weight_allgather"})
    assert sim.step_time_s >= lower_bound(w) * (1 - 1e-9)
    assert estimate_step(w, with_memory=False).step_time_s == pytest.approx(sim.step_time_s, rel=0.10)


def test_a_slow_network_becomes_the_limit_and_sharding_halves_the_gradient_bytes():
    slow = replace(HW, network=NetworkSpec(nic_gbps=0.5, nics=1))
    rep, sha = _workload("replicated", "reduce_scatter", 2, slow), _workload("sharded", "reduce_scatter", 2, slow)
    for w in (rep, sha):
        sim = simulate(w)
        assert sim.limiter == "collective" and estimate_step(w, with_memory=False).bottleneck == "nic"
    # Ring all-reduce sends 2 (H-1)/H of the gradient, reduce-scatter + all-gather of bf16 weights the same.
    nic = lambda w: sum(v["bytes"] for k, v in op_totals(w).items() if k.startswith(("host_", "weight_")))  # noqa: E731
    assert nic(sha) == pytest.approx(nic(rep))


def test_sharding_spreads_the_cpu_update_and_the_host_state_over_hosts():
    one, rep, sha = (_workload("replicated", "reduce_scatter", 1), _workload("replicated", "reduce_scatter", 4),
                     _workload("sharded", "reduce_scatter", 4))
    mem = {name: estimate_memory(w) for name, w in (("one", one), ("rep", rep), ("sha", sha))}
    assert mem["rep"].host_state == mem["one"].host_state
    assert mem["sha"].host_state == pytest.approx(mem["one"].host_state * (12 / 4 + 2) / 14)
    cpu = {name: estimate_step(w, with_memory=False).demands["cpu[0]"] for name, w in
           (("one", one), ("rep", rep), ("sha", sha))}
    assert cpu["rep"] == pytest.approx(cpu["one"]) and cpu["sha"] == pytest.approx(cpu["one"] / 4)


def test_tuner_chooses_the_host_layout():
    space = TuneSpace(param_routes=("sharded",), grad_routes=("reduce_scatter",), chunks_per_layer=(2,),
                      prefetch_depths=(2,), activations=("recompute",), update_schedules=("next_forward",),
                      thread_fractions=(1.0,), gpu_state=False)
    policies = enumerate_policies(space, HW, 16, hosts=2)
    assert {p.host_layout for p in policies} == {"replicated", "sharded"}
    assert {p.host_layout for p in enumerate_policies(space, HW, 8)} == {"replicated"}
    budget = Budget(80 * GIB, 2000 * GIB)
    best = tune(MODEL, HW, 1024, 16, budget, space, refine_top=2, hosts=2).best
    assert best.policy.host_layout == "sharded"  # the CPU update is the limit at this batch: sharding halves it
    # A host too small for the whole state leaves only the sharded layout.
    small = Budget(80 * GIB, estimate_memory(_workload("sharded", "reduce_scatter", 2)).host_total * 1.01)
    result = tune(MODEL, HW, 1024, 16, small, space, refine_top=1, hosts=2)
    assert {c.policy.host_layout for c in result.candidates} == {"sharded"}


def test_hosts_need_a_network_section(capsys):
    with pytest.raises(SlideDPError, match="no network section"):
        _workload("sharded", "reduce_scatter", 2, hw=load_hardware("h100-sxm-x4"))
    assert main(["simulate", "--model", "qwen3-8b", "--hardware", "h100-sxm-x4", "--hosts", "2", "--batch", "8",
                 "--seq", "1024"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slidedp: error:") and "no network section" in err and err.count("\n") == 0
