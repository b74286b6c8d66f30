"""Policy.kept_layers in the runtime: under ``recompute`` the last k decoder layers keep their forward graphs for
backward and the others rerun their forward, and the step computes what recomputing every layer (or keeping
every layer) computes: the same loss and gradients (fp32, CPU), with micro-batches and with layers that leave
the GPU between forward and backward. The trace prices each kept layer's backward without the rerun."""

from __future__ import annotations

import pytest
import torch

from slidedp.policy import Policy
from tests.builders import TINY, write_config
from tests.runtime.helpers import batches, make_engine

SEQ = 16


def step(tmp_path, name: str, policy: Policy, rows):
    """Loss, the step's gradient (next_forward: the slot still holds it), the step's trace and how many times a
    decoder layer's forward ran (once per micro-batch, again in backward where it recomputes)."""
    engine, _, host = make_engine(write_config(tmp_path, name), policy, SEQ)
    runs = []
    layer = engine._layer
    engine._layer = lambda *args: runs.append(1) or layer(*args)
    try:
        result = engine.step(rows)
        return result.loss, host.grad_buffer.clone(), result.trace, len(runs)
    finally:
        engine.close()


@pytest.mark.parametrize(("name", "kept", "micro_batch", "prefetch"), [
    ("qwen3", 1, 2, 1), ("qwen3", 2, 1, 2), ("qwen3", 3, 2, 1), ("llama", 1, 1, 1)])
def test_kept_layers_give_the_loss_and_gradients_of_recomputing_every_layer(tmp_path, name, kept, micro_batch,
                                                                            prefetch):
    data = batches(TINY[name]["vocab_size"], SEQ, 2, 1, seed=5)[0]
    base = Policy(activation="recompute", micro_batch=micro_batch, accumulation=2 // micro_batch,
                  prefetch_depth=prefetch)
    layers = TINY[name]["num_hidden_layers"]
    loss_r, grad_r, trace_r, runs_r = step(tmp_path, name, base, data)
    loss_k, grad_k, trace_k, runs_k = step(tmp_path, name, base.with_(kept_layers=kept), data)
    loss_all, grad_all, _, runs_all = step(tmp_path, name, base.with_(activation="keep"), data)
    micro_batches = 2 // micro_batch
    assert (runs_r, runs_k, runs_all) == (2 * layers * micro_batches, (2 * layers - kept) * micro_batches,
                                          layers * micro_batches)
    assert float(grad_r.abs().sum()) > 0
    for loss, grad in ((loss_k, grad_k), (loss_all, grad_all)):
        assert abs(loss - loss_r) < 1e-6 * max(1.0, abs(loss_r))
        torch.testing.assert_close(grad, grad_r, rtol=1e-5, atol=1e-7)
    # Backward FLOPs per layer: 3x forward where it reruns the forward, 2x for the kept (last) layers.
    for trace, first_kept in ((trace_r, layers), (trace_k, layers - kept)):
        spans = trace[trace.unit.between(1, layers)]
        fwd = spans[spans.op == "fwd"].groupby("unit").flops.sum()
        bwd = spans[spans.op == "bwd"].groupby("unit").flops.sum()
        for unit in range(1, layers + 1):
            ratio = 2.0 if unit - 1 >= first_kept else 3.0
            assert bwd[unit] == pytest.approx(ratio * fwd[unit]), (unit, first_kept)
