"""A new run in an --out that holds an earlier one: refused with one line naming --resume and --overwrite;
with --overwrite the earlier run's checkpoints, metrics and events go first, so nothing of the two mixes."""

from __future__ import annotations

import json

import pandas as pd

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
    assert len(pd.read_csv(out / "metrics.csv")) == 3  # untouched

    assert _train(tmp_path, out, "--steps", "1", "--overwrite") == 0
    assert len(pd.read_csv(out / "metrics.csv")) == 1
    assert not list(out.glob("checkpoint-step*"))
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
