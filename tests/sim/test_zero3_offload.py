"""ZeRO-3-Offload's structure as DeepSpeed 0.19.8's stage3.py runs it on one GPU: the bf16 gradient staged on the
host and back on the gradient chain (not behind the weight fetches), and the hooks' host time per module call as
the floor of a pass."""

from __future__ import annotations

import dataclasses

import pytest

from slidedp.model_spec import load_model_spec
from slidedp.peers import SYSTEMS, PeerStep, build_peer_plan, peer_workload, simulate_peer
from slidedp.peers.step import module_calls
from slidedp.peers.systems import ModuleHookCost
from tests.builders import tiny_model
from tests.sim.test_peer_systems import machine

ZERO3 = SYSTEMS["zero3-offload"]


def _step(system, model, batch: int = 2, seq: int = 256):
    return PeerStep(system, peer_workload(model, machine(1), seq, batch, system.attention))


def test_module_calls_follow_the_transformers_layer():
    assert module_calls(load_model_spec("qwen3-4b"), "layer") == 15  # 7 projections, 2 norms, q/k norms, 4 more
    assert module_calls(load_model_spec("llama-3-8b"), "layer") == 13
    assert module_calls(load_model_spec("qwen2.5-72b"), "layer") == 13  # qkv bias adds no module
    qwen = load_model_spec("qwen3-4b")
    assert qwen.layers * module_calls(qwen, "layer") + module_calls(qwen, "embed") + module_calls(qwen, "head") == 545


def test_the_gradient_round_trip_queues_behind_the_gradient_chain_not_the_fetches():
    plan = build_peer_plan(_step(ZERO3, tiny_model(layers=4)))
    grad_in = [op for op in plan.ops if op.op == "h2d_grad"]
    assert grad_in and all(op.stream == "d2h[0]" and op.resource == "h2d[0]" for op in grad_in)
    assert all(op.stream == "h2d[0]" for op in plan.ops if op.op == "h2d_param")


def test_a_hook_floor_sets_each_pass_where_it_exceeds_the_compute():
    model = tiny_model(layers=4)
    compute = _step(dataclasses.replace(ZERO3, module_hooks=None), model)
    slow = dataclasses.replace(ZERO3, module_hooks=ModuleHookCost(forward_s=1e-3, backward_s=3e-3))
    floored = _step(slow, model)
    for u, unit in enumerate(floored.w.units):
        calls = module_calls(model, unit.kind)
        assert floored.forward_s(u) == pytest.approx(max(unit.fwd_s, 1e-3 * calls))
        assert floored.backward_s(u)[0] == pytest.approx(max(unit.bwd_s, 3e-3 * calls))
        assert compute.forward_s(u) == unit.fwd_s and compute.backward_s(u)[0] == unit.bwd_s
    passes = sum(1e-3 * module_calls(model, u.kind) + 3e-3 * module_calls(model, u.kind) for u in floored.w.units)
    assert simulate_peer(floored).step_time_s >= passes > simulate_peer(compute).step_time_s
    free = dataclasses.replace(ZERO3, module_hooks=ModuleHookCost(forward_s=0.0, backward_s=0.0))
    assert simulate_peer(_step(free, model)).step_time_s == pytest.approx(simulate_peer(compute).step_time_s)
