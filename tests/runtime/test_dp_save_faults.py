"""Data parallel (2 gloo ranks on CPU): a kill during a checkpoint save keeps the previous checkpoint, a resume
from it matches the uninterrupted computation, nothing stays in /dev/shm or running; --on-nonfinite stop
exits 3 with its reason once.

"During the save" is made exact with the SLIDEDP_FAULT_PAUSE_IN_SAVE hook (runtime.host_state): rank 0 stops
after writing the new state file, before meta.json, and marks that with a file in its temporary checkpoint
directory; the signal is sent only once that marker exists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from slidedp.runtime import checkpoint_files
from slidedp.runtime.host_state import FAULT_PAUSE_IN_SAVE, PAUSE_MARKER
from slidedp.runtime.shared_dir import state_dir
from tests.builders import TINY
from tests.runtime.helpers import run_cli_train
from tests.runtime.test_run_lifetime import _ranks_of, _run_id_of

ARGS = ("--nproc", "2", "--device", "cpu", "--batch", "2", "--lr", "1e-2", "--total-steps", "6")


def _popen(tmp_path: Path, out: Path, *extra: str, env: dict) -> subprocess.Popen:
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "data.txt").write_text("streaming layers through a shared host state " * 60)
    cmd = [sys.executable, "-m", "slidedp.cli", "train", "--model", str(tmp_path / "tiny.json"), "--data",
           str(tmp_path / "data.txt"), "--seq", "32", "--out", str(out), *ARGS, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env}, start_new_session=True)


def _paused_saver(out: Path, deadline: float = 120.0) -> tuple[Path, int]:
    """The temporary checkpoint directory of the paused save and the pid of the process saving it."""
    t0 = time.monotonic()
    while True:
        for marker in out.glob(f"checkpoint.tmp-*/{PAUSE_MARKER}"):
            text = marker.read_text()
            if text:
                return marker.parent, int(text)
        assert time.monotonic() - t0 < deadline, "the save never reached its pause point"
        time.sleep(0.1)


def _wait_gone(launcher_pid: int, deadline: float = 60.0) -> None:
    t0 = time.monotonic()
    while _ranks_of(launcher_pid) and time.monotonic() - t0 < deadline:
        time.sleep(0.2)
    assert not _ranks_of(launcher_pid), "a rank or torchrun outlived the run"


@pytest.mark.parametrize("target, sig, code", [
    pytest.param("rank0", signal.SIGKILL, 1, marks=pytest.mark.slow),
    pytest.param("rank0", signal.SIGTERM, 1, marks=pytest.mark.slow),
    ("launcher", signal.SIGKILL, -9), pytest.param("launcher", signal.SIGTERM, 143, marks=pytest.mark.slow)])
def test_a_kill_during_a_save_keeps_the_previous_checkpoint(tmp_path, target, sig, code):
    out = tmp_path / "run"
    proc = _popen(tmp_path, out, "--steps", "3", "--save-every", "1", env={FAULT_PAUSE_IN_SAVE: "2"})
    run_id = _run_id_of(proc.pid)
    tmp, saver = _paused_saver(out)
    os.kill(proc.pid if target == "launcher" else saver, sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-1500:]
    if target == "rank0":
        assert "a rank failed" in err and "is intact" in err
    _wait_gone(proc.pid)
    assert not state_dir(run_id).exists()
    meta = checkpoint_files.verify(out / "checkpoint", _numel(tmp_path))  # digest, header and sizes of the step-1 save
    assert meta["data_step"] == 1 and meta["world"] == 2
    assert pd.read_csv(out / "metrics.csv").step.tolist() == [1, 2]  # step 2 ran in full; its save was cut
    if (target, sig) != ("rank0", signal.SIGKILL):
        return
    # Resume: step 2 again from the step-1 checkpoint, into another run directory, must give the loss the
    # interrupted run logged and exactly the state its cut save had already written (master, m and v).
    uncut = tmp_path / "uncut.safetensors"
    (tmp / checkpoint_files.STATE_FILE).rename(uncut)
    resumed = run_cli_train(tmp_path, tmp_path / "resumed", *ARGS, "--steps", "1", "--resume", str(out / "checkpoint"))
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    assert pd.read_csv(tmp_path / "resumed" / "metrics.csv").loss.tolist() == \
        pd.read_csv(out / "metrics.csv").loss.tolist()[1:]
    from safetensors.torch import load_file

    got, want = load_file(tmp_path / "resumed" / "checkpoint" / checkpoint_files.STATE_FILE), load_file(uncut)
    for name in checkpoint_files.TENSORS:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-7)


def _numel(tmp_path: Path) -> int:
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config

    return ModelAdapter(load_hf_config(str(tmp_path / "tiny.json"))).total_params


def test_stop_on_non_finite_under_data_parallel_exits_3_with_its_reason_once(tmp_path):
    proc = run_cli_train(tmp_path, tmp_path / "run", *ARGS, "--steps", "3", "--on-nonfinite", "stop",
                         env={"SLIDEDP_FAULT_NAN_STEP": "2"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("slidedp: error:")]
    assert proc.returncode == 3, proc.stderr[-1500:]
    assert errors == ["slidedp: error: non-finite gradient norm at step 2: stopped (--on-nonfinite stop); the host "
                      "state was not updated by that step"]
    assert not list((tmp_path / "run").glob(".slidedp-exit-*"))


def test_out_of_gpu_memory_under_data_parallel_exits_4_with_its_reason_once(tmp_path):
    """torchrun turns a failed rank into exit code 1; the ranks' record keeps OutOfGpuMemory's code, which
    peer_compare's driver reads to plan again for less, and the launcher prints the reason once."""
    proc = run_cli_train(tmp_path, tmp_path / "run", *ARGS, "--steps", "3", env={"SLIDEDP_FAULT_OOM_STEP": "2"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("slidedp: error:")]
    assert proc.returncode == 4, proc.stderr[-1500:]
    assert len(errors) == 1 and "out of GPU memory: the plan's predicted peak" in errors[0]
    assert "fault injection at step 2" in errors[0]
    assert "Traceback" not in proc.stderr  # neither ours nor torchrun's (slidedp.commands.rank_launcher)
    assert not list((tmp_path / "run").glob(".slidedp-exit-*"))
