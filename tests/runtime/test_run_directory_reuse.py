"""A new run in an --out that holds an earlier one: refused with one line naming --resume and --overwrite;
with --overwrite the earlier run's checkpoints, metrics and events go first, so nothing of the two mixes."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from slidedp.cli import main
from slidedp.runtime import checkpoint_files
from tests.builders import TINY


def _train(tmp_path, out, *extra: str) -> int:
    return main(["train", "--model", str(tmp_path / "tiny.json"), "--data", str(tmp_path / "d.txt"), "--seq", "32",
                 "--device", "cpu", "--log", "none", "--out", str(out), *extra])


def test_an_earlier_run_is_refused_then_overwritten_only_when_asked(tmp_path, capsys):
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "d.txt").write_text("some text to train on " * 200)
    out = tmp_path / "run"
    assert _train(tmp_path, out, "--steps", "3", "--save-every", "1", "--keep", "2") == 0
    kept_before = sorted(p.name for p in out.glob("checkpoint-step*"))
    assert kept_before and len(pd.read_csv(out / "metrics.csv")) == 3
    (out / "notes.txt").write_text("mine")  # not the run's: --overwrite leaves it
    capsys.readouterr()

    assert _train(tmp_path, out, "--steps", "1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds an earlier run" in err[0] and "--resume" in err[0] and "--overwrite" in err[0]
    metrics_only = tmp_path / "killed-before-its-first-save"
    metrics_only.mkdir()
    (metrics_only / "metrics.csv").write_text("step,loss\n")
    assert _train(tmp_path, metrics_only, "--steps", "1") == 2
    err = capsys.readouterr().err
    assert "holds an earlier run (metrics.csv)" in err and "--resume" not in err
    assert len(pd.read_csv(out / "metrics.csv")) == 3  # untouched

    (out / "trace_rank3.parquet").write_bytes(b"a rank of a wider earlier run")
    for mine in ("checkpoint.md", "checkpoint-step50-good"):  # the user's, named alike: not the run's
        (out / mine).write_text("mine")
    assert _train(tmp_path, out, "--steps", "1", "--resume", str(out / "checkpoint"), "--overwrite") == 2
    assert _train(tmp_path, out, "--steps", "1", "--overwrite") == 0
    assert len(pd.read_csv(out / "metrics.csv")) == 1
    assert not [p for p in out.glob("checkpoint-step*") if p.name != "checkpoint-step50-good"]
    assert not (out / "trace_rank3.parquet").exists()
    assert (out / "checkpoint.md").read_text() == (out / "checkpoint-step50-good").read_text() == "mine"
    assert "overwrite" not in (out / "config.yaml").read_text()  # `train --config` of it must not delete unasked
    meta = json.loads((out / "checkpoint" / checkpoint_files.META_FILE).read_text())
    assert meta["data_step"] == 1
    assert (out / "notes.txt").read_text() == "mine"

    # Resuming the run in its own directory is what --resume is for: no --overwrite needed.
    assert _train(tmp_path, out, "--steps", "1", "--resume", str(out / "checkpoint")) == 0
    assert len(pd.read_csv(out / "metrics.csv")) == 2


def test_resuming_another_models_checkpoint_is_one_line(tmp_path, capsys):
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "d.txt").write_text("some text to train on " * 200)
    assert _train(tmp_path, tmp_path / "a", "--steps", "1") == 0
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=320)))  # another model
    capsys.readouterr()
    assert _train(tmp_path, tmp_path / "b", "--steps", "1", "--resume", str(tmp_path / "a" / "checkpoint")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parameters per tensor, this model has" in err[0] and "{" not in err[0], err


def test_keep_with_no_checkpoint_written_is_refused(tmp_path, capsys):
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "d.txt").write_text("some text to train on " * 200)
    assert _train(tmp_path, tmp_path / "a", "--steps", "1", "--no-checkpoint", "--keep", "3") == 2
    assert "writes none" in capsys.readouterr().err
    assert _train(tmp_path, tmp_path / "b", "--steps", "2", "--no-checkpoint", "--save-every", "1", "--keep", "2") == 0


def test_a_host_of_a_multi_host_run_is_not_refused_for_the_other_hosts_locks(tmp_path):
    """Over several hosts each launcher locks the shared run directory for its node (RunLock): a launcher that
    validates while another host's launcher holds its own lock must go on."""
    from slidedp.cli import build_parser
    from slidedp.commands.train_args import build_train_spec
    from slidedp.errors import SlideDPError
    from slidedp.runtime.lifetime import RunLock
    from slidedp.runtime.trainer import Trainer

    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "d.txt").write_text("some text to train on " * 200)
    out = tmp_path / "shared-run"
    base = ["train", "--model", str(tmp_path / "tiny.json"), "--data", str(tmp_path / "d.txt"), "--seq", "32",
            "--device", "cpu", "--log", "none", "--steps", "1", "--out", str(out)]
    other_host = RunLock(out, node=1)
    try:
        two_hosts = build_parser().parse_args([*base, "--nnodes", "2", "--node-rank", "0",
                                               "--rdzv-endpoint", "127.0.0.1:1"])
        Trainer(build_train_spec(two_hosts, log=lambda _m: None), log=lambda _m: None)  # validates, no refusal
        one_host = build_parser().parse_args(base)
        with pytest.raises(SlideDPError, match="in use by another slidedp run"):
            Trainer(build_train_spec(one_host, log=lambda _m: None), log=lambda _m: None)
    finally:
        other_host.release()


def test_a_resume_from_an_earlier_checkpoint_sets_the_later_ones_aside(tmp_path, capsys):
    """Resumed from checkpoint-step2 of a run that went on to step 6: the step-4 and step-6 checkpoints of that
    run are moved aside whole, so --keep prunes and names only this run's checkpoints and keeps the one it
    resumed from."""
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "d.txt").write_text("some text to train on " * 200)
    out = tmp_path / "run"
    assert _train(tmp_path, out, "--steps", "6", "--save-every", "2", "--keep", "3") == 0
    assert sorted(p.name for p in out.glob("checkpoint-step*")) == ["checkpoint-step2", "checkpoint-step4"]
    first_step4 = (out / "checkpoint-step4" / checkpoint_files.STATE_FILE).read_bytes()
    capsys.readouterr()
    assert _train(tmp_path, out, "--steps", "2", "--save-every", "2", "--keep", "3", "--seed", "1",
                  "--resume", str(out / "checkpoint-step2")) == 0
    err = "".join(capsys.readouterr().err.split())  # rich wraps a long path anywhere
    aside = out / "superseded-after-step2"
    said = f"resume: from step 2; the earlier run's checkpoints past it, and its metrics rows, are moved to {aside}"
    assert "".join(said.split()) in err
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint", "checkpoint-step4", "metrics.csv"]
    assert pd.read_csv(aside / "metrics.csv").step.tolist() == [3, 4, 5, 6]
    assert (aside / "checkpoint-step4" / checkpoint_files.STATE_FILE).read_bytes() == first_step4
    assert json.loads((aside / "checkpoint" / "meta.json").read_text())["data_step"] == 6
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint", "checkpoint-step2"]
    assert json.loads((out / "checkpoint" / "meta.json").read_text())["data_step"] == 4
    assert pd.read_csv(out / "metrics.csv").step.tolist() == [1, 2, 3, 4]  # one history in the log too
    # A history set aside, or another directory's checkpoint, does not continue this directory's: refused
    capsys.readouterr()
    assert _train(tmp_path, out, "--steps", "1", "--resume", str(aside / "checkpoint")) == 2
    assert "holds another run" in capsys.readouterr().err
    other = tmp_path / "other"
    assert _train(tmp_path, other, "--steps", "2", "--save-every", "1") == 0
    assert _train(tmp_path, out, "--steps", "1", "--resume", str(other / "checkpoint")) == 2
    assert "choose another --out" in capsys.readouterr().err
    assert _train(tmp_path, tmp_path / "fresh", "--steps", "1", "--resume", str(aside / "checkpoint")) == 0
    capsys.readouterr()
    assert _train(tmp_path, out, "--steps", "1", "--resume", str(out / "checkpoint-step6")) == 2
    assert "moved later checkpoints into superseded-after-step2" in " ".join(capsys.readouterr().err.split())
    # --overwrite clears the set-aside history with the rest of the earlier run
    assert _train(tmp_path, out, "--steps", "1", "--overwrite", "--no-checkpoint") == 0
    assert not aside.exists()
