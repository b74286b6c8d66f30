"""The embedding's backward reads no weights, so it is not copied to the GPU again for backward (#16): the same
rule (slidedp.units.refetched_in_backward) in the workload, the analytical model and the simulator."""

import pytest

from slidedp.hardware import load_hardware
from slidedp.model.demands import op_totals
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.sim import simulate
from slidedp.units import unit_work
from slidedp.workload import StepWorkload
from tests.builders import tiny_model


def test_only_the_embedding_skips_its_backward_fetch():
    works = unit_work(tiny_model(layers=4), "recompute", 1, 1, 256)
    assert [w.backward_needs_weights for w in works] == [False, True, True, True, True, True]


def test_h2d_bytes_drop_by_the_embeddings_bf16_bytes_for_qwen3_8b():
    """Forward fetches every unit once; backward re-fetches the units that left the GPU except the embedding:
    1.24 GB less per step for Qwen3-8B (151936 x 4096 bf16)."""
    model, hw = load_model_spec("qwen3-8b"), load_hardware("h200-x1")
    w = StepWorkload(model, hw, Policy(chunks_per_layer=2, prefetch_depth=2), 4096, 1)
    assert not model.tied_embeddings and not w.refetched_in_backward(0) and not w.resident_in_backward(0)
    left = [u for u in range(w.num_units) if not w.resident_in_backward(u)]
    every_unit_twice = 2 * (sum(u.params for u in w.units) + sum(w.units[u].params for u in left))
    saved = every_unit_twice - op_totals(w)["h2d_param"]["bytes"]
    assert saved == 2 * model.embedding_params == pytest.approx(1.245e9, rel=1e-3)


@pytest.mark.parametrize("tied", [False, True])
def test_simulator_fetches_the_embedding_once(tied):
    """One H2D per chunk of the embedding (in forward) whether it is streamed (untied) or pinned (tied, where the
    head reads it); a streamed layer is fetched twice."""
    w = StepWorkload(tiny_model(layers=4, tied=tied), load_hardware("h200-x1"), Policy(chunks_per_layer=3), 512, 1)
    h2d = simulate(w).trace.query("op == 'h2d_param'")
    assert (h2d.unit == 0).sum() == 3
    assert (h2d.unit == 1).sum() == 6
    assert h2d.bytes.sum() == pytest.approx(op_totals(w)["h2d_param"]["bytes"], rel=1e-9)
