"""Limiting cases: with every resource but one made free, simulator and model equal the closed form."""

import pytest

from slidedp.model import estimate_step
from slidedp.policy import Policy
from slidedp.sim import simulate
from slidedp.workload import StepWorkload
from tests.builders import free_machine, tiny_model, with_gpu, with_host, with_link

SEQ = 256
GB = 1e9


def _params(model):
    total = model.total_params
    # With prefetch depth 2 the head and the last layer are still on the GPU when backward starts, and the
    # embedding's backward reads no weights: the other layers are fetched again.
    refetched = total - model.head_params - model.layer_params - model.embedding_params
    return total, total + refetched


def _check(w, expected):
    sim = simulate(w).step_time_s
    est = estimate_step(w).step_time_s
    assert sim == pytest.approx(expected, rel=0.01)
    assert est == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("schedule", ["next_forward", "as_ready", "after_backward"])
def test_h2d_bound(schedule):
    model = tiny_model()
    hw = with_gpu(free_machine(), h2d_gbps=10.0)
    w = StepWorkload(model, hw, Policy(chunks_per_layer=2, update_schedule=schedule), SEQ, 1)
    _, fetched = _params(model)
    _check(w, 2 * fetched / (10 * GB))


def test_d2h_bound():
    model = tiny_model()
    hw = with_gpu(free_machine(), d2h_gbps=5.0)
    w = StepWorkload(model, hw, Policy(chunks_per_layer=3), SEQ, 1)
    total, _ = _params(model)
    _check(w, 2 * total / (5 * GB))


@pytest.mark.parametrize("grad_dtype, grad_bytes", [("bf16", 2), ("fp32", 4)])
def test_host_memory_bound(grad_dtype, grad_bytes):
    model = tiny_model()
    hw = with_host(free_machine(), mem_bw_gbps=20.0)
    w = StepWorkload(model, hw, Policy(grad_dtype=grad_dtype), SEQ, 1)
    total, fetched = _params(model)
    # bf16 weights in, gradients out, AdamW reads/writes p, m, v and reads the gradient, cast reads fp32
    # and writes bf16.
    host_bytes = 2 * fetched + grad_bytes * total + (24 + grad_bytes) * total + 6 * total
    _check(w, host_bytes / (20 * GB))


def test_host_memory_bound_with_the_fused_cast_kernel():
    """The one-pass kernel writes the bf16 copy itself: 28 B/param for AdamW and no separate cast pass."""
    model = tiny_model()
    hw = with_host(free_machine(), mem_bw_gbps=20.0, fused_cast=True)
    w = StepWorkload(model, hw, Policy(), SEQ, 1)
    total, fetched = _params(model)
    _check(w, (2 * fetched + 2 * total + 28 * total) / (20 * GB))
    assert "cast" not in set(simulate(w).trace.op)


def test_cpu_adam_bound():
    model = tiny_model()
    hw = with_host(free_machine(), adam_gparams_per_s={1: 0.5})
    w = StepWorkload(model, hw, Policy(update_schedule="after_backward"), SEQ, 1)
    total, _ = _params(model)
    _check(w, total / 0.5e9)


def test_compute_bound():
    model = tiny_model()
    hw = with_gpu(free_machine(), matmul_tflops=100.0, attention_tflops=100.0)
    w = StepWorkload(model, hw, Policy(activation="recompute", micro_batch=2), SEQ, 2)
    tokens = 2 * SEQ
    layer = model.layer_linear_flops_per_token() + model.layer_attention_flops_per_token(SEQ)
    # fwd + (recompute + 2x bwd) per layer; the chunked loss recomputes the head's forward too.
    flops = 4 * tokens * (model.layers * layer + model.head_flops_per_token())
    _check(w, flops / 100e12)


def test_compute_bound_with_fitted_backward_ratios():
    model = tiny_model()
    hw = with_gpu(free_machine(), matmul_tflops=100.0, attention_tflops=50.0, backward_linear_ratio=2.2,
                  backward_attention_ratio=2.5)
    w = StepWorkload(model, hw, Policy(activation="recompute"), SEQ, 1)
    lin = model.layer_linear_flops_per_token() * SEQ
    att = model.layer_attention_flops_per_token(SEQ) * SEQ
    head = model.head_flops_per_token() * SEQ
    # Layers: fwd + recompute + backward; head: fwd + recomputed fwd + backward (linears only).
    layers = model.layers * ((2 + 2.2) * lin / 100e12 + (2 + 2.5) * att / 50e12)
    _check(w, layers + (2 + 2.2) * head / 100e12)


@pytest.mark.parametrize("ranks", [2, 4])
def test_gpu_link_bound(ranks):
    model = tiny_model()
    hw = with_link(free_machine(ranks), bw_gbps=10.0)
    w = StepWorkload(model, hw, Policy(param_route="sharded", grad_route="reduce_scatter"), SEQ, ranks)
    total, fetched = _params(model)
    per_rank = (ranks - 1) / ranks * (2 * fetched + 2 * total)
    _check(w, per_rank / (10 * GB))
