"""The run directory's checkpoint layout (runtime/checkpoint_history.py) on directories the test writes: no
training, only the files each rule reads."""

import json
import os

from slidedp.runtime import checkpoint_files
from slidedp.runtime import checkpoint_history as ch


def _checkpoint(directory, step):
    directory.mkdir(parents=True)
    (directory / checkpoint_files.META_FILE).write_text(json.dumps({"data_step": step}))
    (directory / checkpoint_files.STATE_FILE).write_bytes(b"state%d" % step)
    return directory


def test_kept_lists_step_directories_oldest_first_and_nothing_else(tmp_path):
    for step in (20, 3, 100):
        _checkpoint(tmp_path / f"checkpoint-step{step}", step)
    (tmp_path / "checkpoint-stepX").mkdir()
    (tmp_path / "checkpoint-step7").write_text("a file, not a checkpoint")
    _checkpoint(tmp_path / "checkpoint-step5.tmp", 5)
    assert [step for step, _ in ch.kept(tmp_path)] == [3, 20, 100]


def test_checkpoint_step_reads_meta_and_is_none_when_unreadable(tmp_path):
    assert ch.checkpoint_step(_checkpoint(tmp_path / "a", 42)) == 42
    assert ch.checkpoint_step(tmp_path / "missing") is None
    for i, meta in enumerate(("{not json", '{"step": 3}', "[3]", '{"data_step": "x"}')):
        bad = tmp_path / f"bad{i}"
        bad.mkdir()
        (bad / checkpoint_files.META_FILE).write_text(meta)
        assert ch.checkpoint_step(bad) is None, meta


def test_continues_history_only_from_inside_and_not_from_a_set_aside_history(tmp_path):
    out = tmp_path / "run"
    assert ch.continues_history(out, out / "checkpoint")
    assert ch.continues_history(out, out / "checkpoint-step10")
    assert not ch.continues_history(out, out / "superseded-after-step10" / "checkpoint")
    assert not ch.continues_history(out, tmp_path / "other" / "checkpoint")


def test_set_aside_moves_only_later_checkpoints_and_never_reuses_a_directory(tmp_path):
    _checkpoint(tmp_path / "checkpoint-step10", 10)
    _checkpoint(tmp_path / "checkpoint-step20", 20)
    _checkpoint(tmp_path / "checkpoint", 30)
    dest = ch.set_aside_later_checkpoints(tmp_path, 10)
    assert dest == tmp_path / "superseded-after-step10"
    assert sorted(p.name for p in dest.iterdir()) == ["checkpoint", "checkpoint-step20"]
    assert [step for step, _ in ch.kept(tmp_path)] == [10]
    assert not ch.latest(tmp_path).exists()
    assert ch.set_aside_later_checkpoints(tmp_path, 10) is None  # nothing later is left
    _checkpoint(tmp_path / "checkpoint", 15)
    assert ch.set_aside_later_checkpoints(tmp_path, 10) == tmp_path / "superseded-after-step10-2"
    (tmp_path / "superseded-after-step3").write_text("a file, not a history")
    assert ch.superseded(tmp_path) == [tmp_path / "superseded-after-step10", tmp_path / "superseded-after-step10-2"]
    assert all(oct(p.stat().st_mode & 0o777) == oct(0o700) for p in ch.superseded(tmp_path))


def test_set_aside_leaves_the_checkpoint_resumed_from(tmp_path):
    _checkpoint(tmp_path / "checkpoint", 10)  # --resume <out>/checkpoint itself: nothing is later
    assert ch.set_aside_later_checkpoints(tmp_path, 10) is None
    assert ch.checkpoint_step(ch.latest(tmp_path)) == 10


def test_keep_aside_hard_links_the_latest_and_prune_keeps_the_newest(tmp_path):
    latest = _checkpoint(ch.latest(tmp_path), 10)
    ch.keep_aside(tmp_path, 20)
    aside = tmp_path / "checkpoint-step10"
    assert os.stat(aside / checkpoint_files.STATE_FILE).st_ino == os.stat(latest / checkpoint_files.STATE_FILE).st_ino
    assert oct(aside.stat().st_mode & 0o777) == oct(0o700)
    ch.keep_aside(tmp_path, 20)  # already kept: the earlier copy stays
    assert [step for step, _ in ch.kept(tmp_path)] == [10]
    for step in (30, 40):
        _checkpoint(tmp_path / f"checkpoint-step{step}", step)
    ch.prune(tmp_path, 2)
    assert [step for step, _ in ch.kept(tmp_path)] == [30, 40]
    ch.prune(tmp_path, 0)
    assert ch.kept(tmp_path) == []


def test_keep_aside_skips_the_step_being_saved_and_replaces_a_leftover_partial_copy(tmp_path):
    old_umask = os.umask(0)  # a permissive umask: the kept copy is still the owner's only
    try:
        _checkpoint(ch.latest(tmp_path), 10)
        ch.keep_aside(tmp_path, 10)  # the latest saved again at its own step is not kept as an older one
        assert ch.kept(tmp_path) == []
        partial = tmp_path / "checkpoint-step10.tmp"
        partial.mkdir()
        (partial / "junk").write_text("a killed keep-aside")
        ch.keep_aside(tmp_path, 20)
    finally:
        os.umask(old_umask)
    aside = tmp_path / "checkpoint-step10"
    assert sorted(p.name for p in aside.iterdir()) == [checkpoint_files.META_FILE, checkpoint_files.STATE_FILE]
    assert not partial.exists() and oct(aside.stat().st_mode & 0o777) == oct(0o700)
