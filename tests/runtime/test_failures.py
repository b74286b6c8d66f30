"""Failure handling: killed checkpoint writes, non-finite gradients, preflight refusals (loader fuzzing: specs/)."""

import json

import pandas as pd
import torch

from slidedp.cli import main
from slidedp.policy import Policy
from tests.builders import TINY, write_config
from tests.runtime.helpers import batches, make_engine, run_cli_train


def _cli_train(tmp_path, out, *extra, env=None):
    return run_cli_train(tmp_path, out, "--batch", "2", "--lr", "1e-2", "--total-steps", "6", *extra, env=env,
                         text="a checkpoint must survive a crash in the middle of its write ")


def test_killed_checkpoint_write_keeps_the_previous_one_and_resume_matches(tmp_path):
    straight = _cli_train(tmp_path, tmp_path / "straight", "--steps", "4")
    assert straight.returncode == 0, straight.stderr[-1500:]
    crashed = _cli_train(tmp_path, tmp_path / "run", "--steps", "4", "--save-every", "1",
                         env={"SLIDEDP_FAULT_KILL_IN_SAVE": "2"})
    assert crashed.returncode != 0
    meta = json.loads((tmp_path / "run" / "checkpoint" / "meta.json").read_text())
    assert meta["data_step"] == 1  # the step-2 write died half-way; step 1 is intact
    assert any(p.name.startswith("checkpoint.tmp-") for p in (tmp_path / "run").iterdir())
    resumed = _cli_train(tmp_path, tmp_path / "run", "--steps", "3", "--resume", str(tmp_path / "run" / "checkpoint"))
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    assert not any(p.name.startswith("checkpoint.tmp-") for p in (tmp_path / "run").iterdir())
    expected = pd.read_csv(tmp_path / "straight" / "metrics.csv").loss.tolist()
    got = pd.read_csv(tmp_path / "run" / "metrics.csv").loss.tolist()
    assert got[-3:] == expected[1:]


def test_non_finite_gradient_skips_the_step_and_leaves_the_state_untouched(tmp_path):
    engine, _, host = make_engine(write_config(tmp_path, "qwen3"), Policy(micro_batch=2, accumulation=1), 16)
    data = batches(97, 16, 2, 3, seed=4)
    engine.step(data[0])
    engine.flush()
    before = [t.clone() for t in (host.master, host.exp_avg, host.exp_avg_sq, host.slot)]
    engine.poison_next_gradient = True
    stats = engine.step(data[1])
    engine.flush()
    assert stats.skipped and host.step == 1
    for t, ref in zip((host.master, host.exp_avg, host.exp_avg_sq, host.slot), before, strict=True):
        assert torch.equal(t, ref)
    after = engine.step(data[2])
    assert not after.skipped and torch.isfinite(torch.tensor(after.loss))
    engine.flush()
    assert torch.isfinite(host.master).all() and host.step == 2


def test_as_ready_skips_non_finite_chunks_without_corrupting_state(tmp_path):
    from slidedp.runtime.optim import OptimConfig

    optim = OptimConfig(lr=1e-3, max_grad_norm=None)
    engine, _, host = make_engine(write_config(tmp_path, "qwen3"), Policy(update_schedule="as_ready"), 16, optim)
    engine.poison_next_gradient = True
    engine.step(batches(97, 16, 1, 1)[0])
    assert engine.nonfinite_chunks > 0
    assert torch.isfinite(host.master).all() and torch.isfinite(host.slot).all()


def test_cli_stop_on_non_finite(tmp_path):
    out = tmp_path / "stop"
    proc = _cli_train(tmp_path, out, "--steps", "3", "--on-nonfinite", "stop", env={"SLIDEDP_FAULT_NAN_STEP": "2"})
    assert proc.returncode == 3
    assert "non-finite gradient norm at step 2" in proc.stderr and "Traceback" not in proc.stderr
    skip = _cli_train(tmp_path, tmp_path / "skip", "--steps", "3", env={"SLIDEDP_FAULT_NAN_STEP": "2"})
    assert skip.returncode == 0
    assert pd.read_csv(tmp_path / "skip" / "metrics.csv").skipped.tolist() == [0, 1, 0]


def test_preflight_names_what_is_short(tmp_path, capsys):
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "d.txt").write_text("x" * 500)
    for extra, message in ((["--host-limit", "0.0001"], "host memory"), (["--gpu-budget", "0.01"], "GPU peak")):
        code = main(["train", "--model", str(tmp_path / "tiny.json"), "--data", str(tmp_path / "d.txt"), "--seq", "32",
                     "--steps", "1", "--out", str(tmp_path / "never"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and "preflight:" in err and message in err
        assert not (tmp_path / "never").exists()


def test_as_ready_with_skip_is_refused_and_stop_says_what_it_changed(tmp_path):
    """as_ready updates chunks before the norm is known: skipping a non-finite step cleanly is impossible."""
    policy = tmp_path / "as_ready.yaml"
    Policy(update_schedule="as_ready", micro_batch=2).save(policy)
    refused = _cli_train(tmp_path, tmp_path / "r", "--steps", "2", "--policy", str(policy), "--max-grad-norm", "0")
    assert refused.returncode == 2 and "--on-nonfinite stop" in refused.stderr
    stopped = _cli_train(tmp_path, tmp_path / "s", "--steps", "3", "--policy", str(policy), "--max-grad-norm", "0",
                         "--on-nonfinite", "stop", env={"SLIDEDP_FAULT_NAN_STEP": "2"})
    assert stopped.returncode == 3 and "keep their update" in stopped.stderr
