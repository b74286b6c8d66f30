"""Policy.kept_layers in the models and the tuner: which layers recompute is decided once (unit_work), each kept
layer adds exactly kept_layer_bytes to the GPU peak and drops one forward from its backward, the analytical
model and the simulator both see the saving, and the tuner keeps as many layers as the budget leaves room for."""

from __future__ import annotations

import pytest

from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, load_hardware
from slidedp.model import estimate_memory, estimate_step
from slidedp.model.memory import kept_layer_bytes
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.problem import Budget
from slidedp.sim import simulate
from slidedp.tune import TuneSpace, tune
from slidedp.units import unit_work
from slidedp.workload import StepWorkload
from tests.builders import tiny_model

SPACE = TuneSpace(chunks_per_layer=(4,), prefetch_depths=(2,), micro_batches=(4,), update_schedules=("next_forward",),
                  thread_fractions=(1.0,), gpu_state=False, activations=("recompute",))


def test_the_last_k_layers_keep_their_graphs_and_skip_the_rerun():
    m = tiny_model(layers=6)
    works = unit_work(m, "recompute", 2, 1, 512, kept_layers=2)
    layers = [w for w in works if w.kind == "layer"]
    assert [w.recompute for w in layers] == [True] * 4 + [False] * 2
    assert all(w.recompute_ops for w in layers[:4]) and not any(w.recompute_ops for w in layers[4:])
    assert layers[5].bwd_flops == pytest.approx(2 * layers[5].fwd_flops)
    assert layers[0].bwd_flops == pytest.approx(3 * layers[0].fwd_flops)
    assert works[-1].recompute  # the chunked loss head always recomputes its logits
    with pytest.raises(SlideDPError, match="exceeds the model's 6 decoder layers"):
        unit_work(m, "recompute", 2, 1, 512, kept_layers=7)


@pytest.mark.parametrize("bad", [{"kept_layers": -1}, {"kept_layers": 2, "activation": "keep"},
                                 {"kept_layers": 1, "activation": "offload"}, {"kept_layers": True}])
def test_kept_layers_is_a_count_for_recompute_only(bad):
    with pytest.raises(SlideDPError, match="kept_layers"):
        Policy(**bad)
    with pytest.raises(SlideDPError, match="policy.activation must be one of"):  # the activation's own error first
        Policy(activation="bogus", kept_layers=1)


def test_each_kept_layer_adds_its_graph_less_its_checkpoint_and_saves_a_forward():
    m, hw = load_model_spec("qwen3-4b"), load_hardware("h200-x1")
    base = Policy(param_route="replicated", grad_route="per_rank", activation="recompute", micro_batch=4)
    w0 = StepWorkload(m, hw, base, 4096, 4)
    per_layer = kept_layer_bytes(w0)
    # Its graph is the full activations of 4 x 4096 tokens, several times the checkpoint it replaces.
    assert per_layer == pytest.approx((m.full_activation_bytes_per_token() - m.checkpoint_bytes_per_token())
                                      * 4 * 4096)
    peaks, analytical, simulated = [], [], []
    for kept in (0, 8, 16, 36):
        w = StepWorkload(m, hw, base.with_(kept_layers=kept), 4096, 4)
        peaks.append(estimate_memory(w).gpu_peak)
        analytical.append(estimate_step(w, with_memory=False).compute_s)
        simulated.append(simulate(w).step_time_s)
    assert [p - peaks[0] for p in peaks] == pytest.approx([k * per_layer for k in (0, 8, 16, 36)])
    assert analytical == sorted(analytical, reverse=True) and analytical[-1] < 0.85 * analytical[0]
    assert simulated == sorted(simulated, reverse=True) and simulated[-1] < simulated[0]
    # A layer's rerun is about a quarter of its compute (forward, rerun, backward at twice the forward).
    assert (analytical[0] - analytical[1]) / 8 == pytest.approx((analytical[0] - analytical[3]) / 36, rel=1e-6)


def test_the_tuner_keeps_as_many_layers_as_the_budget_leaves_room_for():
    m, hw = load_model_spec("qwen3-4b"), load_hardware("h200-x1")
    budget = Budget(48 * GIB, 120 * GIB)
    best = tune(m, hw, 4096, 4, budget, SPACE, refine_top=2).best
    kept = best.policy.kept_layers
    assert 0 < kept < m.layers and best.memory.gpu_peak <= budget.gpu_bytes
    one_more = StepWorkload(m, hw, best.policy.with_(kept_layers=kept + 1), 4096, 4)
    assert estimate_memory(one_more).gpu_peak > budget.gpu_bytes
    none = StepWorkload(m, hw, best.policy.with_(kept_layers=0), 4096, 4)
    assert best.sim_step_s < simulate(none).step_time_s
    without = tune(m, hw, 4096, 4, budget, TuneSpace(**{**SPACE.__dict__, "kept_layers": False}), refine_top=2)
    assert all(c.policy.kept_layers == 0 for c in without.candidates)
    assert without.best.sim_step_s > best.sim_step_s


def test_tune_cli_shows_kept_layers_and_can_leave_them_out(tmp_path, capsys):
    from slidedp.cli import main

    args = ["tune", "--model", "qwen3-4b", "--hardware", "h200-x1", "--seq", "4096", "--batch", "4",
            "--gpu-budget", "48", "--no-gpu-state", "--chunks", "4", "--top-k", "2"]
    assert main([*args, "--out", str(tmp_path / "kept.yaml")]) == 0
    shown = capsys.readouterr().out
    kept = Policy.load(tmp_path / "kept.yaml").kept_layers
    assert kept > 0 and f"rec+{kept}" in shown and "the last N decoder layers keep their graphs" in shown
    assert main([*args, "--no-kept-layers", "--out", str(tmp_path / "none.yaml")]) == 0
    assert Policy.load(tmp_path / "none.yaml").kept_layers == 0 and "rec+" not in capsys.readouterr().out


def test_simulate_reads_kept_layers_from_a_policy_file_and_refuses_more_than_the_model_has(tmp_path, capsys):
    from slidedp.cli import main

    policy = tmp_path / "policy.yaml"
    Policy(param_route="replicated", grad_route="per_rank", micro_batch=4, kept_layers=12).save(policy)
    args = ["simulate", "--model", "qwen3-4b", "--hardware", "h200-x1", "--seq", "4096", "--batch", "4"]
    assert main([*args, "--policy", str(policy)]) == 0
    assert "(last 12 layers kept)" in " ".join(capsys.readouterr().out.split())
    Policy(micro_batch=4, kept_layers=37).save(policy)
    assert main([*args, "--policy", str(policy)]) == 2
    assert "kept_layers 37 exceeds the model's 36 decoder layers" in capsys.readouterr().err


def test_relabelled_layers_are_the_objects_dataclasses_replace_builds():
    """slidedp.units.relabelled skips __init__ for speed; it stays equal to replace only while neither class
    checks or derives anything when built."""
    from dataclasses import replace

    from slidedp.hardware import load_hardware
    from slidedp.model_spec import load_model_spec
    from slidedp.units import Unit, UnitWork, relabelled, time_units, unit_work

    for cls in (Unit, UnitWork):
        assert not hasattr(cls, "__post_init__"), cls
    works = unit_work(load_model_spec("qwen3-0.6b"), "recompute", 1, 2, 1024, kept_layers=3)
    units = time_units(works, load_hardware("h200-x1").gpu)
    for proto in (works[1], works[-2], units[1], units[-2]):
        copy = relabelled(proto, 99, "layer98")
        assert copy == replace(proto, index=99, name="layer98") and type(copy) is type(proto)
        assert (proto.index, proto.name) != (99, "layer98")  # the original is untouched
    layers = [w for w in works if w.kind == "layer"]
    assert [w.index for w in layers] == list(range(1, len(layers) + 1))
    assert [w.name for w in layers] == [f"layer{i}" for i in range(len(layers))]
    assert [w.recompute for w in layers] == [True] * (len(layers) - 3) + [False] * 3
    assert all(not w.recompute_ops or w.recompute_ops[0] is layers[0].fwd_ops[0] for w in layers)
