"""The shared state is private and never outlives its run; one run per run directory; ranks die with the launcher."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slidedp.cli import main
from slidedp.errors import SlideDPError
from slidedp.runtime.lifetime import RunLock
from slidedp.runtime.shared_dir import OWNER_FILE, PREFIX, SharedDir, stale_states, state_dir
from tests.builders import TINY


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_state_directory_and_files_are_owner_only(tmp_path):
    shared = SharedDir.create(tmp_path / "s", os.getpid(), tmp_path)
    with shared.create_file("master.bin", 64):
        pass
    assert _mode(shared.path) == 0o700 and _mode(shared.path / "master.bin") == 0o600
    assert _mode(shared.path / OWNER_FILE) == 0o600
    assert shared.check_file("master.bin", 64) == shared.path / "master.bin"
    assert SharedDir.attach(shared.path).path == shared.path


def test_planted_or_loose_state_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    with pytest.raises(SlideDPError, match="already exists"):
        SharedDir.create(loose, os.getpid(), tmp_path)  # someone created it first: never reuse
    with pytest.raises(SlideDPError, match="mode 700"):
        SharedDir.attach(loose)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(SlideDPError, match="symlink"):
        SharedDir.attach(link)
    shared = SharedDir.create(tmp_path / "s", os.getpid(), tmp_path)
    (tmp_path / "victim").write_bytes(b"x")
    (shared.path / "exp_avg.bin").symlink_to(tmp_path / "victim")  # a write redirected through a symlink
    with pytest.raises(FileExistsError):
        shared.create_file("exp_avg.bin", 64)
    with pytest.raises(SlideDPError, match="symlink"):
        shared.check_file("exp_avg.bin", 1)
    assert (tmp_path / "victim").read_bytes() == b"x"
    with shared.create_file("master.bin", 64):
        pass
    with pytest.raises(SlideDPError, match="holds 64 bytes"):
        shared.check_file("master.bin", 128)


def test_state_name_is_per_user_and_unpredictable():
    a, b = state_dir("00" * 8), state_dir("ff" * 8)
    assert a.name.startswith(f"{PREFIX}{os.getuid()}-") and a != b


def test_stale_state_is_listed_and_removed_only_when_its_launcher_is_gone(tmp_path, monkeypatch, capsys):
    import slidedp.runtime.shared_dir as sd

    monkeypatch.setattr(sd, "SHM_ROOT", tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = SharedDir.create(sd.state_dir("aa" * 8, tmp_path), dead.pid, tmp_path / "run-a")
    with stale.create_file("master.bin", 4096):
        pass
    live = SharedDir.create(sd.state_dir("bb" * 8, tmp_path), os.getpid(), tmp_path / "run-b")
    found = sd.stale_states(tmp_path)
    assert [s.path for s in found] == [stale.path] and found[0].bytes >= 4096
    monkeypatch.setattr(sd, "stale_states", lambda root=tmp_path: stale_states(root))
    assert main(["clean"]) == 0 and "clean --remove" in capsys.readouterr().out
    assert stale.path.exists()
    assert main(["clean", "--remove"]) == 0 and "removed 1 directory" in capsys.readouterr().out
    assert not stale.path.exists() and live.path.exists()


def test_one_live_run_per_run_directory(tmp_path):
    lock = RunLock(tmp_path / "run")
    with pytest.raises(SlideDPError, match=f"in use by another slidedp run \\(pid {os.getpid()}\\)"):
        RunLock(tmp_path / "run")
    lock.release()
    RunLock(tmp_path / "run").release()


def _train_cmd(tmp_path, out, *extra, nproc: int = 2) -> list[str]:
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "data.txt").write_text("streaming layers through a shared host state " * 60)
    return [sys.executable, "-m", "slidedp.cli", "train", "--model", str(tmp_path / "tiny.json"), "--data",
            str(tmp_path / "data.txt"), "--seq", "16", "--device", "cpu", "--nproc", str(nproc), "--batch", "2",
            "--out", str(out), *extra]


def _launch(tmp_path, out, *extra, env=None) -> subprocess.Popen:
    return subprocess.Popen(_train_cmd(tmp_path, out, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})}, start_new_session=True)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_a_one_process_run_ends_in_one_line_naming_the_last_checkpoint(tmp_path, sig):
    """SIGTERM stops a one-process run as Ctrl-C does (it was a silent exit 143): exit 128 + the signal, one line
    that names the checkpoint to resume from, no traceback, and the checkpoint loads."""
    out = tmp_path / "run"
    # The child starts with SIGINT at its default even where the suite runs with it ignored (a CI job in the
    # background: the run then keeps SIGINT ignored, as Python does).
    proc = subprocess.Popen(_train_cmd(tmp_path, out, "--steps", "100000", "--save-every", "2", nproc=1),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_steps(out, steps=3)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 128 + sig and "Traceback" not in err, err[-2000:]
    assert last.startswith(f"slidedp: interrupted ({sig.name}); the last complete checkpoint "), last
    assert last.endswith(" is intact") and str(out / "checkpoint") in last and err.count("slidedp: interrupted") == 1
    step = int(last.split("(step ")[1].split(")")[0])
    assert step >= 2 and step % 2 == 0
    assert json.loads((out / "checkpoint" / "meta.json").read_text())["data_step"] == step


def _ranks_of(launcher_pid: int) -> list[int]:
    """Every process whose environment names this launcher (torchrun and the ranks)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if f"SLIDEDP_LAUNCHER_PID={launcher_pid}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def _run_id_of(launcher_pid: int, deadline: float = 90.0) -> str:
    """The random run id the launcher handed its ranks (read from torchrun's environment)."""
    t0 = time.monotonic()
    while True:
        for pid in _ranks_of(launcher_pid):
            with contextlib.suppress(OSError):
                for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    if item.startswith(b"SLIDEDP_RUN_ID="):
                        return item.split(b"=", 1)[1].decode()
        assert time.monotonic() - t0 < deadline, "the launcher never started torchrun"
        time.sleep(0.2)


def _wait_for_steps(out: Path, steps: int = 1, deadline: float = 90.0) -> None:
    """Until the run has logged ``steps`` steps: every rank is set up and training."""
    t0 = time.monotonic()
    while not (out / "metrics.csv").exists() or len((out / "metrics.csv").read_text().splitlines()) <= steps:
        assert time.monotonic() - t0 < deadline, "the run never logged a step"
        time.sleep(0.2)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_stops_every_rank_and_leaves_no_state(tmp_path, sig):
    proc = _launch(tmp_path, tmp_path / "run", "--steps", "500")
    run_id = _run_id_of(proc.pid)
    _wait_for_steps(tmp_path / "run")
    # every rank has mapped the state and rank 0 has removed its names: nothing in /dev/shm while it trains
    assert not state_dir(run_id).exists()
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    # torchrun logs its own shutdown above; the launcher's one line closes the output
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 128 + sig and last.startswith(f"slidedp: interrupted ({sig.name})"), err[-2000:]
    assert last.endswith("no checkpoint was written"), last
    # and no Python traceback under it (torchrun's SignalException), nor a line of each rank's saying the same
    assert "Traceback" not in err and err.count("slidedp: interrupted") == 1, err
    time.sleep(0.5)
    assert not _ranks_of(proc.pid) and not state_dir(run_id).exists()


def test_a_second_run_on_the_same_run_directory_refuses(tmp_path):
    first = _launch(tmp_path, tmp_path / "run", "--steps", "500")
    try:
        _wait_for_steps(tmp_path / "run")
        second = _launch(tmp_path, tmp_path / "run", "--steps", "1")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2 and "in use by another slidedp run" in err
    finally:
        os.kill(first.pid, signal.SIGTERM)
        first.communicate(timeout=60)


def test_a_killed_launcher_takes_its_ranks_along_and_leaves_no_state(tmp_path):
    proc = _launch(tmp_path, tmp_path / "run", "--steps", "500")
    run_id = _run_id_of(proc.pid)
    _wait_for_steps(tmp_path / "run")
    os.kill(proc.pid, signal.SIGKILL)  # nothing can clean up after this: the ranks must still not live on
    # The pipes close when the last child exits: torch's elastic agent gives its ranks 30 s after SIGTERM before
    # SIGKILL, which on a loaded 2-core CI machine ran past a 60 s wait once (2026-12-07).
    proc.communicate(timeout=150)
    t0 = time.monotonic()
    while _ranks_of(proc.pid) and time.monotonic() - t0 < 60:
        time.sleep(0.5)
    assert not _ranks_of(proc.pid)
    assert not state_dir(run_id).exists() and not any(s.path == state_dir(run_id) for s in stale_states())


def test_a_killed_rank_leaves_no_state_behind(tmp_path):
    fault = {"SLIDEDP_FAULT_RANK": "1", "SLIDEDP_FAULT_STEP": "2"}  # rank 1 SIGKILLs itself at step 2
    proc = _launch(tmp_path, tmp_path / "run", "--steps", "4", env=fault)
    run_id = _run_id_of(proc.pid)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "a rank failed" in err
    assert not state_dir(run_id).exists() and not _ranks_of(proc.pid)


def test_a_stopped_runs_last_line_names_the_checkpoint_to_resume_from(tmp_path):
    """The latest checkpoint with its step; the newest kept one where a resume moved the latest aside; no step
    where meta.json cannot be read; and plainly none."""
    from slidedp.commands.train import checkpoint_state

    assert checkpoint_state(tmp_path) == "no checkpoint was written"
    for name, step in (("checkpoint-step2", 2), ("checkpoint-step4", 4)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(json.dumps({"data_step": step}))
    newest = tmp_path / "checkpoint-step4"
    assert checkpoint_state(tmp_path) == f"the last complete checkpoint {newest} (step 4) is intact"
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "meta.json").write_text("{broken")
    assert checkpoint_state(tmp_path) == f"the last complete checkpoint {tmp_path / 'checkpoint'} is intact"


def test_the_first_signal_stops_a_one_process_run_after_its_step_and_a_second_at_once(capsys):
    """slidedp.commands.train.stop_between_steps: the first SIGINT/SIGTERM only asks (the trainer raises
    Interrupted between steps), a second raises at once; the replaced handlers are handed back."""
    from types import SimpleNamespace

    from slidedp.commands.train import stop_between_steps
    from slidedp.errors import Interrupted

    trainer = SimpleNamespace(stop_requested=None)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # CI may start the suite with SIGINT ignored
    replaced = stop_between_steps(trainer)
    try:
        handler = signal.getsignal(signal.SIGTERM)
        assert trainer.stop_requested() is None
        handler(signal.SIGTERM, None)
        assert trainer.stop_requested() == signal.SIGTERM
        assert "SIGTERM: stopping after this step (again: at once)" in capsys.readouterr().err
        with pytest.raises(Interrupted) as caught:
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        assert caught.value.signum == signal.SIGINT and isinstance(caught.value, KeyboardInterrupt)
    finally:
        for sig, previous in replaced.items():
            signal.signal(sig, previous)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # an ignored signal stays ignored (a run started under nohup)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replaced = stop_between_steps(trainer)
    try:
        assert signal.SIGINT not in replaced and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for sig, previous in {**replaced, **before}.items():
            signal.signal(sig, previous)
