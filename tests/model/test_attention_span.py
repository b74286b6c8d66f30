"""Packed rows through the varlen kernel are priced by their examples (slidedp.units.attention_span): the
attention FLOPs are those of the examples' causal blocks, everything else is unchanged, and a span equal to the
sequence is the unpacked pricing exactly."""

from __future__ import annotations

import pytest

from slidedp import compute as c
from slidedp.errors import SlideDPError
from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.units import attention_span, unit_work
from slidedp.workload import StepWorkload


def test_span_is_the_token_weighted_mean_length():
    assert attention_span([4, 4]) == 4
    assert attention_span([2, 6]) == pytest.approx((4 + 36) / 8)
    with pytest.raises(SlideDPError):
        attention_span([3, 0])


def _layer_ops(span, micro_batch=2, seq=2048):
    m = load_model_spec("qwen3-0.6b")
    layer = unit_work(m, "recompute", micro_batch, 1, seq, attention_span=span)[1]
    return m, layer


def test_attention_flops_are_the_examples_blocks():
    lengths = [300, 900, 600, 248] * 2  # two rows of 2048 tokens
    span = attention_span(lengths)
    m, packed = _layer_ops(span)
    _, whole = _layer_ops(None)
    (att,) = [op for op in packed.fwd_ops if isinstance(op, c.Attention)]
    # causal attention over an example of L tokens: 2 products x 2 FLOPs x q_dim x L^2 / 2
    closed = sum(2.0 * 2.0 * m.q_dim * n * n / 2.0 for n in lengths)
    assert att.flops == pytest.approx(closed)
    assert packed.attention_flops == pytest.approx(closed)
    assert packed.linear_flops == whole.linear_flops
    others = [op for op in packed.fwd_ops if not isinstance(op, c.Attention)]
    assert others == [op for op in whole.fwd_ops if not isinstance(op, c.Attention)]
    # a span equal to the sequence is the unpacked pricing
    _, same = _layer_ops(2048.0)
    assert same.fwd_ops == whole.fwd_ops


def test_a_shorter_span_is_cheaper_and_checked():
    hw = load_hardware("h200-x1")
    m = load_model_spec("qwen3-0.6b")
    policy = Policy(micro_batch=16, accumulation=1, gpu_state_units=30)
    whole = StepWorkload(m, hw, policy, 2048, 16)
    packed = StepWorkload(m, hw, policy, 2048, 16, attention_span=400.0)
    assert packed.model_flops_per_step() < whole.model_flops_per_step()
    assert sum(u.fwd_s + u.bwd_s for u in packed.units) < sum(u.fwd_s + u.bwd_s for u in whole.units)
    with pytest.raises(SlideDPError, match="attention span"):
        StepWorkload(m, hw, policy, 2048, 16, attention_span=4096.0)


def test_simulate_and_tune_take_the_span_of_packed_data(tmp_path, capsys):
    import json

    from slidedp.cli import main

    def sim(*extra):
        assert main(["simulate", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--seq", "2048", "--batch", "16",
                     "--policy", str(policy), "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    policy = tmp_path / "p.yaml"
    Policy(micro_batch=16, accumulation=1, gpu_state_units=30, activation="keep").save(policy)
    whole, packed = sim(), sim("--attention-span", "334")
    assert packed["attention_span"] == 334 and whole.get("attention_span") is None
    assert packed["step_time_s"] < whole["step_time_s"]  # every unit's state on the GPU: compute-bound
    assert main(["simulate", "--model", "qwen3-0.6b", "--seq", "2048", "--attention-span", "4096"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exceeds --seq 2048" in err
    assert main(["tune", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--seq", "2048", "--batch", "16",
                 "--attention-span", "334", "--out", str(tmp_path / "t.yaml")]) == 0
    assert (tmp_path / "t.yaml").exists()
