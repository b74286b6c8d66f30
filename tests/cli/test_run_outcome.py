"""The closing lines of `slidedp train`: the prediction beside the measurement only where the two describe the same
machine (2026-12-06 on the H100: three ranks sharing the GPU printed "predicted 0.505 s/step for h200-x1@3,
measured 5.978 s/step (-92%)", an error of the comparison, not of the simulator)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from slidedp.commands.train import run_outcome


def _summary(device: str) -> SimpleNamespace:
    return SimpleNamespace(steps=3, global_step=3, step_time_s=5.978, tokens_per_s=1028.0, device=device,
                           final_loss=12.1361, eval_loss=None, predicted_step_time_s=0.505, tuner_step_time_s=None)


def _spec(ranks_per_gpu: int) -> SimpleNamespace:
    return SimpleNamespace(hardware=SimpleNamespace(name="h200-x1@3"), out=Path("runs/x"), ranks_per_gpu=ranks_per_gpu)


def test_one_rank_per_gpu_gets_the_error_of_the_prediction_and_how_to_refit():
    text = run_outcome(_summary("cuda:0"), _spec(1))
    assert "measured 5.978 s/step (-92%)" in text
    out = Path("runs/x")
    assert (f"slidedp calibrate --from-run {out} --base {out / 'hardware.yaml'} --out {out / 'refit.yaml'}"
            in text)
    close = SimpleNamespace(**{**vars(_summary("cuda:0")), "predicted_step_time_s": 5.5})
    assert "--from-run" not in run_outcome(close, _spec(1))  # -8%: no hint
    assert "--host-only" not in text  # the limiter is not known to be the CPU
    cpu_bound = SimpleNamespace(**{**vars(_summary("cuda:0")), "limiter": "cpu"})
    assert f"slidedp calibrate --host-only --base {out / 'hardware.yaml'} --out host.yaml" in run_outcome(
        cpu_bound, _spec(1))


def test_ranks_sharing_a_gpu_get_no_error_figure_and_the_reason():
    text = run_outcome(_summary("cuda:0"), _spec(3))
    assert "%" not in text
    assert "3 ranks share each GPU" in text and "not comparable" in text


def test_a_cpu_run_is_not_compared_with_a_gpu_profile():
    text = run_outcome(_summary("cpu"), _spec(1))
    assert "%" not in text and "on the CPU" in text


def test_a_run_whose_cpu_update_was_slow_is_predicted_again_at_its_own_rate(tmp_path):
    """The CPU update ran at half the profile's rate and nothing else differed: the closing lines say at what rate
    it ran and that at that rate the simulator predicts the measured step (a miss that is the host CPU's)."""
    from dataclasses import replace

    from slidedp.hardware import load_hardware
    from slidedp.model_spec import load_model_spec
    from slidedp.policy import Policy
    from slidedp.sim import simulate
    from slidedp.workload import StepWorkload
    from tests.builders import simulated_run

    base = load_hardware("h200-x1")
    truth = replace(base, host=replace(base.host, step_update_factor=base.host.step_update_factor * 2))
    spec, policy = load_model_spec("qwen3-4b"), Policy(activation="keep", param_route="replicated",
                                                       grad_route="per_rank")
    out, sim = simulated_run(tmp_path / "run", spec, policy, truth, 4096, 1, profile=base)
    predicted = simulate(StepWorkload(spec, base, policy, 4096, 1)).step_time_s
    closing = SimpleNamespace(**{**vars(_summary("cuda:0")), "step_time_s": sim.step_time_s,
                                 "predicted_step_time_s": predicted})
    text = run_outcome(closing, SimpleNamespace(hardware=base, out=out, ranks_per_gpu=1))
    rate = StepWorkload(spec, base, policy, 4096, 1).state_update_params_per_s / 1e9
    (line,) = [x for x in text.splitlines() if x.startswith("the CPU update ran at")]
    ran, profile, error = re.fullmatch(r"the CPU update ran at ([\d.]+) G params/s in these steps \(the profile: "
                                       r"([\d.]+)\); at that rate the simulator predicts [\d.]+ s/step \(([-+]\d+)%\)",
                                       line).groups()
    assert float(profile) == round(rate, 2)
    # From busy seconds, which hold some copy contention too: close to half the rate, not exact.
    assert float(ran) == pytest.approx(rate / 2, rel=0.03) and abs(int(error)) <= 2
