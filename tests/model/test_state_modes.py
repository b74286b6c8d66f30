"""The host state's precision in the model (#16): update bytes and rates, host memory, and how --state auto chooses."""

from dataclasses import replace

import pytest

from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, load_hardware
from slidedp.model import estimate_memory, memory_shortfalls
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.problem import resolve_budget
from slidedp.state_choice import COMPACT_MARGIN, choose_state, state_options
from slidedp.state_precision import STATE_CHOICES, StatePrecision
from slidedp.tune import TuneSpace, tune
from slidedp.workload import StepWorkload
from tests.builders import tiny_model

H200 = load_hardware("h200-x1")


def _host(fused: bool, rates: dict | None = None):
    return replace(H200, host=replace(H200.host, fused_cast=fused, state_update_gparams_per_s=rates or {}))


def _workload(state: str, fused: bool = True, grad: str = "bf16", rates: dict | None = None, model=None,
              **policy) -> StepWorkload:
    return StepWorkload(model or tiny_model(), _host(fused, rates), Policy(state=state, grad_dtype=grad, **policy),
                        512, 1)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("grad, grad_bytes", [("bf16", 2), ("fp32", 4)])
def test_exact_state_moves_and_prices_what_it_did_before(fused, grad, grad_bytes):
    """fp32 state: 24 B of p, m, v + the gradient + the bf16 write in the one-pass kernel, else a 6 B cast pass;
    at the host's measured AdamW rate."""
    w = _workload("fp32", fused, grad)
    assert w.adam_bytes_per_param == 24 + grad_bytes + (2 if fused else 0)
    assert w.cast_host_bytes(1.0) == (0 if fused else 6)
    assert w.state_update_rate_measured
    in_step = H200.host.adam_rate(w.adam_threads) / H200.host.step_update_factor
    assert w.adam_cap() == pytest.approx(in_step * w.adam_bytes_per_param)


@pytest.mark.parametrize("state", [s.name for s in STATE_CHOICES[1:]])
@pytest.mark.parametrize("fused", [True, False])
def test_compact_update_bytes_come_from_state_precision(state, fused):
    """A bf16 master is the streamed weight: no cast pass even without the one-pass kernel; an fp32 master
    without it leaves the bf16 write to a separate cast pass."""
    sp = StatePrecision.parse(state)
    w = _workload(state, fused)
    full = sp.update_dram_bytes_per_param(2)
    if fused or sp.master == "bf16":
        assert (w.adam_bytes_per_param, w.cast_host_bytes(1.0)) == (full, 0)
    else:
        assert (w.adam_bytes_per_param, w.cast_host_bytes(1.0)) == (full - 2, 6)
    assert w.adam_bytes_per_param < _workload("fp32", fused).adam_bytes_per_param


def test_compact_rate_is_derived_from_dram_bytes_until_measured():
    derived = _workload("fp32+int8")
    fp32 = _workload("fp32")
    assert not derived.state_update_rate_measured and "DERIVED" in derived.state_update_rate_note
    # The derived pass moves DRAM bytes exactly as fast as the measured fp32 pass.
    assert derived.adam_cap() == pytest.approx(fp32.adam_cap())
    assert derived.state_update_params_per_s == pytest.approx(fp32.state_update_params_per_s * 28 / (16 + 1 / 16))
    measured = _workload("fp32+int8", rates={"fp32+int8": {1: 1.0, 16: 7.0}})
    assert measured.state_update_rate_measured and "measured" in measured.state_update_rate_note
    in_step = 7e9 / H200.host.step_update_factor
    assert measured.state_update_params_per_s == pytest.approx(in_step)
    assert measured.adam_cap() == pytest.approx(in_step * measured.adam_bytes_per_param)


def test_the_step_update_factor_divides_every_modes_rate_and_is_said():
    """host.step_update_factor prices what a training step adds beside the update pass timed alone: every mode's
    rate (measured or derived) is divided by it, and the note says so; 1 leaves the rate as measured."""
    for state, rates in (("fp32", None), ("fp32+int8", None), ("bf16+int8", {"bf16+int8": {16: 3.0}})):
        plain = StepWorkload(tiny_model(), replace(H200, host=replace(H200.host, step_update_factor=1.0,
                                                                        update_call_us={},
                                                                        state_update_gparams_per_s=rates or {})),
                             Policy(state=state), 512, 1)
        slow = StepWorkload(tiny_model(), replace(H200, host=replace(H200.host, step_update_factor=1.25,
                                                                       state_update_gparams_per_s=rates or {})),
                            Policy(state=state), 512, 1)
        assert slow.state_update_params_per_s == pytest.approx(plain.state_update_params_per_s / 1.25)
        assert "step_update_factor" in slow.state_update_rate_note and slow.state_update_rate_needs_saying
        assert "step_update_factor" not in plain.state_update_rate_note
        assert plain.state_update_rate_needs_saying == (not plain.state_update_rate_measured)
    with pytest.raises(SlideDPError, match="step_update_factor"):
        replace(H200.host, step_update_factor=0.0)
    called = StepWorkload(tiny_model(), replace(H200, host=replace(H200.host, step_update_factor=1.0,
                                                                     update_call_us={"fp32": 500.0})), Policy(), 512, 1)
    assert "500 us a call" in called.state_update_rate_note and called.state_update_rate_needs_saying


def test_qwen3_14b_host_fits_only_in_compact_modes_on_the_h200_host():
    """14 B/param: 192 GiB of state, over the 113 GiB budget (90% of 125.8); 8-bit moments bring it to 8.03 B/param
    (110.5 GiB), a bf16 master too to 6.03 (83 GiB); bf16 moments alone (10 B/param) do not fit."""
    model = load_model_spec("qwen3-14b")
    budget = resolve_budget(H200, None, None)
    fits = {}
    for sp in STATE_CHOICES:
        mem = estimate_memory(StepWorkload(model, H200, Policy(state=sp.name), 4096, 1))
        assert mem.host_bytes_per_param == pytest.approx(sp.host_bytes_per_param(2))
        problems = memory_shortfalls(mem, budget.gpu_bytes, budget.host_bytes)
        assert all("host memory" in p for p in problems)
        fits[sp.name] = not problems
    assert fits == {"fp32": False, "fp32+bf16": False, "fp32+int8": True, "bf16+bf16": True, "bf16+int8": True}
    exact = estimate_memory(StepWorkload(model, H200, Policy(), 4096, 1))
    assert exact.host_bytes_per_param == 14 and exact.host_state / GIB == pytest.approx(192.6, abs=0.1)


def test_gpu_held_units_keep_fp32_state_on_the_gpu():
    model = tiny_model()
    exact, compact = (estimate_memory(_workload(s, model=model, gpu_state_units=3)) for s in ("fp32", "bf16+int8"))
    assert compact.gpu_optimizer == exact.gpu_optimizer == 16 * sum(u.params for u in _workload("fp32").units[:3])
    assert compact.host_state < exact.host_state


def test_state_choice_rule():
    assert state_options("auto") == tuple(s.name for s in STATE_CHOICES)
    assert state_options("fp32+fp32") == ("fp32",)
    with pytest.raises(SlideDPError):
        state_options("int4")
    # Exact wins unless a compact mode is more than the margin faster.
    near = 1.0 / (1 + COMPACT_MARGIN) + 1e-6
    assert choose_state({"fp32": 1.0, "fp32+int8": near, "bf16+int8": near}).state == "fp32"
    faster = choose_state({"fp32": 1.0, "fp32+int8": 0.8, "bf16+int8": 0.75})
    assert faster.state == "fp32+int8" and "faster than fp32" in faster.reason  # the most precise within the margin
    misfit = choose_state({"fp32": None, "fp32+bf16": None, "fp32+int8": 1.0, "bf16+int8": 0.95})
    assert misfit.state == "fp32+int8" and "do not fit" in misfit.reason
    with pytest.raises(SlideDPError, match="no host-state precision fits"):
        choose_state({"fp32": None, "bf16+int8": None})


SMALL_SPACE = TuneSpace(chunks_per_layer=(2,), prefetch_depths=(2,), activations=("recompute",),
                        update_schedules=("next_forward",), thread_fractions=(1.0,), gpu_state=False)


def test_tuner_stays_exact_by_default_and_chooses_a_mode_when_allowed():
    """Qwen3-4B with every optimizer state on the host at batch 1 is CPU-bound: exact by default, and with every
    mode allowed the tuner takes the compact mode the rule picks, saying why."""
    model = load_model_spec("qwen3-4b")
    budget = resolve_budget(H200, None, None)
    exact = tune(model, H200, 4096, 1, budget, SMALL_SPACE, refine_top=1)
    assert exact.best.policy.state == "fp32" and exact.state_choice is None
    assert {c.policy.state for c in exact.candidates} == {"fp32"}
    no_rates = replace(H200, host=replace(H200.host, state_update_gparams_per_s={}))
    unmeasured = tune(model, no_rates, 4096, 1, budget, replace(SMALL_SPACE, states=state_options("auto")),
                      refine_top=1)
    # No measured compact rate: the derived ones may not buy a mode for speed.
    assert unmeasured.best.policy.state == "fp32" and "not chosen for speed" in unmeasured.state_choice.reason
    # Compact rates measured slower than fp32 (kernel v4 on the H200 host, 2026-12-04): the rule keeps fp32.
    slower = {s.name: {t: 0.7 * r for t, r in H200.host.adam_gparams_per_s.items()}
              for s in STATE_CHOICES if not s.is_exact}
    v4 = replace(H200, host=replace(H200.host, state_update_gparams_per_s=slower))
    kept = tune(model, v4, 4096, 1, budget, replace(SMALL_SPACE, states=state_options("auto")), refine_top=1)
    assert kept.best.policy.state == "fp32"
    assert all(t > kept.state_choice.step_s["fp32"] for s, t in kept.state_choice.step_s.items() if s != "fp32")
    # The shipped profile (kernel v5, 2026-12-06: the compact modes 2.3-3.1x fp32's rate at 16 threads) takes a
    # compact mode at this CPU-bound batch, as the H100 run showed (bf16+int8 0.897 s against fp32's 1.135 s).
    shipped = tune(model, H200, 4096, 1, budget, replace(SMALL_SPACE, states=state_options("auto")), refine_top=1)
    picked = shipped.state_choice
    assert shipped.best.policy.state == picked.state != "fp32"
    assert picked.step_s[picked.state] < picked.step_s["fp32"] / (1 + COMPACT_MARGIN)
    # With every compact rate measured (here: equal to the bytes-derived rates), the rule may take one.
    curves = {s.name: {t: r * 28 / s.update_dram_bytes_per_param(2) for t, r in H200.host.adam_gparams_per_s.items()}
              for s in STATE_CHOICES if not s.is_exact}
    measured = replace(H200, host=replace(H200.host, state_update_gparams_per_s=curves))
    auto = tune(model, measured, 4096, 1, budget, replace(SMALL_SPACE, states=state_options("auto")), refine_top=1)
    choice = auto.state_choice
    assert set(choice.step_s) == set(state_options("auto")) and all(t is not None for t in choice.step_s.values())
    assert auto.best.policy.state == choice.state != "fp32"
    assert auto.best.sim_step_s == pytest.approx(choice.step_s[choice.state])
    assert choice.step_s[choice.state] < choice.step_s["fp32"] / (1 + COMPACT_MARGIN)


def test_tuner_with_exact_state_only_names_the_way_out_of_a_host_shortfall():
    budget = replace(resolve_budget(H200, None, None), host_bytes=50 * GIB)
    model = load_model_spec("qwen3-4b")
    with pytest.raises(SlideDPError, match="--state auto"):
        tune(model, H200, 4096, 1, budget, SMALL_SPACE, refine_top=1)
    result = tune(model, H200, 4096, 1, budget, replace(SMALL_SPACE, states=state_options("auto")), refine_top=1)
    assert result.best.memory.host_total <= 50 * GIB and result.best.policy.state != "fp32"
    assert "fp32" in result.state_choice.reason


def test_a_mode_with_an_unmeasured_rate_is_chosen_for_fit_never_for_speed():
    from slidedp.state_choice import measured_states

    times = {"fp32": 1.0, "fp32+int8": 0.5, "bf16+int8": 0.4}
    assert choose_state(times, measured={"fp32"}).state == "fp32"
    assert "not chosen for speed" in choose_state(times, measured={"fp32"}).reason
    assert choose_state(times, measured={"fp32", "bf16+int8"}).state == "bf16+int8"
    # For fit it is still taken: exact state does not fit, the most precise fitting mode is chosen.
    assert choose_state({"fp32": None, "fp32+int8": 0.9, "bf16+int8": 0.5}, measured={"fp32"}).state == "fp32+int8"
    assert measured_states(load_hardware("h200-x1").host) >= {"fp32"}
