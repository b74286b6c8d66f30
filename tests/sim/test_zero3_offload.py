"""ZeRO-3-Offload's structure as DeepSpeed 0.19.8's stage3.py runs it on one GPU: the bf16 gradient staged on the
host and back on the gradient chain, not behind the weight fetches; a decoder layer's pass no shorter than the host
floor its hooks and copy syncs set."""

from __future__ import annotations

import dataclasses

import pytest

from slidedp.peers import SYSTEMS, PeerStep, build_peer_plan, simulate_peer, system_workload
from slidedp.peers.systems import LayerHostFloor
from tests.builders import tiny_model
from tests.sim.test_peer_systems import machine

ZERO3 = SYSTEMS["zero3-offload"]


def _step(system, model, batch: int = 2, seq: int = 256):
    return PeerStep(system, system_workload(system, model, machine(1), seq, batch))


def test_the_gradient_round_trip_queues_behind_the_gradient_chain_not_the_fetches():
    plan = build_peer_plan(_step(ZERO3, tiny_model(layers=4)))
    grad_in = [op for op in plan.ops if op.op == "h2d_grad"]
    assert grad_in and all(op.stream == "d2h[0]" and op.resource == "h2d[0]" for op in grad_in)
    assert all(op.stream == "h2d[0]" for op in plan.ops if op.op == "h2d_param")


def test_backward_runs_layer_after_layer_while_the_copies_are_shorter_than_the_compute():
    """With the round trip behind the weight fetch (the bug c42 showed), each layer's backward waited for the
    previous layer's gradient to go out and back before its own weights could be fetched."""
    step = _step(ZERO3, tiny_model(layers=6), batch=8, seq=1024)
    trace = simulate_peer(step).trace
    bwd = trace[(trace.op == "bwd")].sort_values("start_s")
    layer = next(u for u in range(step.w.num_units) if step.w.units[u].kind == "layer")
    copies = step.grad_staging_bytes(layer) * 2 + step.h2d_fetch_bytes(layer, backward=True)
    assert copies / 20e9 < step.w.units[layer].bwd_s  # every copy of a layer is shorter than its backward
    gaps = (bwd.start_s.values[1:] - bwd.end_s.values[:-1])[1:-1]  # between decoder layers
    assert gaps.max() < 1e-9


def test_a_layer_host_floor_sets_each_decoder_layer_pass_where_it_exceeds_the_compute():
    model = tiny_model(layers=4)
    compute = _step(dataclasses.replace(ZERO3, layer_host_floor=None), model)
    floor = LayerHostFloor(forward_s=1e-3, forward_s_per_param=1e-9, backward_s=3e-3, backward_s_per_param=2e-9)
    floored = _step(dataclasses.replace(ZERO3, layer_host_floor=floor), model)
    for u, unit in enumerate(floored.w.units):
        if unit.kind == "layer":
            assert floored.forward_s(u) == pytest.approx(max(unit.fwd_s, 1e-3 + 1e-9 * unit.params))
            assert floored.backward_s(u)[0] == pytest.approx(max(unit.bwd_s, 3e-3 + 2e-9 * unit.params))
        else:  # the embedding and head run at their compute
            assert floored.forward_s(u) == unit.fwd_s and floored.backward_s(u)[0] == unit.bwd_s
        assert compute.forward_s(u) == unit.fwd_s and compute.backward_s(u)[0] == unit.bwd_s
    layer_passes = sum(floor.forward(u.params) + floor.backward(u.params) for u in floored.w.units
                       if u.kind == "layer")
    assert simulate_peer(floored).step_time_s > layer_passes > simulate_peer(compute).step_time_s
    free = LayerHostFloor(0.0, 0.0, 0.0, 0.0)
    assert simulate_peer(_step(dataclasses.replace(ZERO3, layer_host_floor=free), model)).step_time_s == \
        pytest.approx(simulate_peer(compute).step_time_s)
    assert ZERO3.layer_host_floor is not None  # the shipped spec carries the fitted DeepSpeed floor
