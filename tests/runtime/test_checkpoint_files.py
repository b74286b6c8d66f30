"""Checkpoints: verified before a resume allocates anything, every corruption one line and exit 2, interrupted
saves finished or undone, a full disk keeps the previous checkpoint."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil

import pytest
import torch

from slidedp.errors import SlideDPError
from slidedp.runtime import checkpoint_files as cf
from tests.runtime.helpers import run_cli_train, train_argv, train_in_process


def _tensors(n: int = 10) -> dict[str, torch.Tensor]:
    return {name: torch.arange(n, dtype=torch.float32) + i for i, name in enumerate(cf.TENSORS)}


def test_write_then_verify_and_leftovers_are_recovered(tmp_path):
    ckpt = tmp_path / "checkpoint"
    cf.write(ckpt, _tensors(), {"data_step": 3, "optimizer_step": 3})
    assert cf.verify(ckpt, 10)["data_step"] == 3
    # A save killed between its two renames: only the moved-aside old checkpoint is left.
    ckpt.rename(tmp_path / "checkpoint.old-123")
    (tmp_path / "checkpoint.tmp-456").mkdir()
    done = cf.recover(ckpt)
    assert ckpt.is_dir() and not list(tmp_path.glob("checkpoint.*-*")) and len(done) == 2
    with pytest.raises(SlideDPError, match="holds"):
        cf.verify(ckpt, 11)


def test_a_checkpoint_is_readable_by_its_owner_only(tmp_path):
    import stat

    old = os.umask(0o002)  # a permissive umask: the checkpoint must not follow it
    try:
        cf.write(tmp_path / "checkpoint", _tensors(), {"data_step": 1, "optimizer_step": 1})
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(tmp_path / "checkpoint") == 0o700 and mode(tmp_path / "checkpoint" / cf.STATE_FILE) == 0o600


@pytest.mark.parametrize("step", [-1, 10**30])
def test_a_step_out_of_range_is_refused(tmp_path, step):
    """Found by the fault census: a 30-digit step in meta.json overflowed an int64 later, as a traceback."""
    ckpt = tmp_path / "checkpoint"
    cf.write(ckpt, _tensors(), {"data_step": step, "optimizer_step": 3})
    with pytest.raises(SlideDPError, match="negative or beyond"):
        cf.verify(ckpt, 10)


def _os_full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _safetensors_full(*_args, **_kwargs):
    """What safetensors itself raises on a full disk (seen by the fault census on a 850 KiB tmpfs)."""
    from safetensors import SafetensorError

    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("full", [_os_full, _safetensors_full])
def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch, full):
    ckpt = tmp_path / "checkpoint"
    cf.write(ckpt, _tensors(), {"data_step": 1, "optimizer_step": 1})

    monkeypatch.setattr("safetensors.torch.save_file", full)
    with pytest.raises(SlideDPError, match="the disk is full; the previous checkpoint is kept"):
        cf.write(ckpt, _tensors(), {"data_step": 2, "optimizer_step": 2})
    assert cf.verify(ckpt, 10)["data_step"] == 1 and not list(tmp_path.glob("checkpoint.tmp-*"))


def _corrupt(ckpt, how: str, tmp_path) -> None:
    state, meta = ckpt / cf.STATE_FILE, ckpt / cf.META_FILE
    data = state.read_bytes()
    if how == "truncated":
        state.write_bytes(data[: len(data) // 2])
    elif how == "emptied":
        state.write_bytes(b"")
    elif how == "header":
        state.write_bytes(b"\xff" * 16 + data[16:])
    elif how == "flipped":
        state.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))
    elif how == "meta-broken":
        meta.write_text("{not json")
    elif how == "meta-missing-key":
        meta.write_text(json.dumps({"data_step": 1}))
    elif how == "nan":  # values replaced and the digest rewritten: only the finiteness check can catch it
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(state))
        tensors["master"][0] = float("nan")
        save_file(tensors, str(state))
        m = json.loads(meta.read_text())
        m["state_blake2b"] = cf.digest(state)
        meta.write_text(json.dumps(m))
    elif how == "other-model":  # a checkpoint of another architecture (here: another FFN width)
        m = json.loads(meta.read_text())
        m["model_spec"]["ffn"] = 72
        meta.write_text(json.dumps(m))


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory):
    """One short training run's checkpoint, trained once for every corruption case (each copies it)."""
    base = tmp_path_factory.mktemp("trained")
    ok = run_cli_train(base, base / "run", "--steps", "1", "--batch", "2", "--seq", "16")
    assert ok.returncode == 0, ok.stderr[-1500:]
    return base / "run" / "checkpoint"


@pytest.mark.parametrize("how", ["truncated", "emptied", "header", "flipped", "meta-broken", "meta-missing-key",
                                 "nan", "other-model"])
def test_a_corrupted_checkpoint_is_one_line_and_exit_2(tmp_path, how, trained_checkpoint, capsys):
    ckpt = tmp_path / "saved"
    shutil.copytree(trained_checkpoint, ckpt)
    _corrupt(ckpt, how, tmp_path)
    # In this process: an exception other than the one-line error would fail the test itself.
    code, stderr = train_in_process(tmp_path, tmp_path / "again", "--steps", "1", "--batch", "2", "--resume",
                                    str(ckpt), capsys=capsys)
    assert code == 2, stderr[-1500:]
    assert stderr.strip().splitlines()[-1].startswith("slidedp: error:")
    assert not (tmp_path / "again" / "metrics.csv").exists()


def test_resume_states_what_differs_from_the_checkpoints_run(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert train_in_process(tmp_path, out, "--steps", "1", "--batch", "2", capsys=capsys)[0] == 0
    code, stderr = train_in_process(tmp_path, tmp_path / "again", "--steps", "1", "--batch", "4", "--lr", "0.002",
                                    "--seed", "7", "--resume", str(out / "checkpoint"), capsys=capsys)
    assert code == 0, stderr[-1500:]
    err = " ".join(stderr.split())
    assert "resume: batch differs from the checkpoint's run: 2 then, 4 now" in err
    # a dict-valued setting by the fields that differ, whole; the schedule and the data too
    policy = next(line for line in stderr.splitlines() if line.startswith("resume: policy"))
    assert policy.endswith("accumulation 2 -> 4") or "micro_batch 2 -> 4" in policy, policy
    assert re.search(r"resume: schedule differs from the checkpoint.s run: lr \S+ -> 0.002", err)
    assert "resume: the training rows differ from the checkpoint's run" in err
    # the same settings, the data file written again with the same bytes (train_in_process rewrites it): quiet
    code, stderr = train_in_process(tmp_path, tmp_path / "same", "--steps", "1", "--batch", "2", "--resume",
                                    str(out / "checkpoint"), capsys=capsys)
    assert code == 0 and "resume:" not in stderr, stderr
    assert os.path.isdir(tmp_path / "again" / "checkpoint")
    # A rank past 0 under a launcher compares nothing, so it never hashes the rows only to compare them.
    _a_rank_past_0_hashes_no_rows(tmp_path, out / "checkpoint", monkeypatch)


def _a_rank_past_0_hashes_no_rows(tmp_path, checkpoint, monkeypatch) -> None:
    from slidedp.cli import build_parser
    from slidedp.commands.train_args import build_train_spec
    from slidedp.runtime import trainer as trainer_module

    hashed = []
    monkeypatch.setattr(trainer_module, "rows_digest", lambda rows, seed: hashed.append(seed) or "other")
    text = "streaming layers through a shared host state "  # the run's own data: only the rank differs
    args = build_parser().parse_args(train_argv(tmp_path, tmp_path / "ranks", text, [
        "--steps", "1", "--batch", "4", "--nproc", "2", "--device", "cpu", "--resume", str(checkpoint)]))
    spec = build_train_spec(args, log=lambda _line: None)
    for rank, hashes in ((1, 0), (0, 1)):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        hashed.clear()
        trainer_module.Trainer(spec, log=lambda _line: None)
        assert len(hashed) == hashes, (rank, hashed)


def test_resume_differences_name_each_changed_field_whole():
    from slidedp.runtime.trainer import resume_differences

    then = {"seq": 32, "policy": {"micro_batch": 2, "accumulation": 2, "param_route": "sharded" * 20}}
    now = {"seq": 32, "policy": {"micro_batch": 2, "accumulation": 4, "param_route": "sharded" * 20},
           "schedule": {"lr": 1.0}}  # a setting an older checkpoint lacks is not a difference
    assert resume_differences(then, now) == ["policy differs from the checkpoint's run: accumulation 2 -> 4"]
    assert resume_differences(then, then) == []


def test_every_reader_of_a_checkpoints_meta_json_gets_one_line_for_a_broken_one(tmp_path):
    """checkpoint_files.read_meta: unreadable, not JSON or not an object -> one SlideDPError naming where; the
    tolerant readers (checkpoint_history.checkpoint_step) turn that into "unknown"."""
    from slidedp.errors import SlideDPError
    from slidedp.runtime import checkpoint_files, checkpoint_history

    meta = tmp_path / checkpoint_files.META_FILE
    for text, why in (("{not json", "JSONDecodeError"), ("[1, 2]", "not a JSON object"), (b"\xff\xfe", "Unicode")):
        meta.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(SlideDPError, match=f"^--resume 'x': unreadable meta.json .*{why}"):
            checkpoint_files.read_meta(meta, "--resume 'x'")
        assert checkpoint_history.checkpoint_step(tmp_path) is None
    meta.write_text('{"data_step": 7}')
    assert checkpoint_files.read_meta(meta, "x") == {"data_step": 7}
    assert checkpoint_history.checkpoint_step(tmp_path) == 7
    with pytest.raises(SlideDPError, match="unreadable meta.json \\(FileNotFoundError\\)"):
        checkpoint_files.read_meta(tmp_path / "missing" / checkpoint_files.META_FILE, "x")
