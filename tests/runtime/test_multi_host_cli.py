"""`slidedp train --nnodes 2`: two emulated hosts on localhost (two launches, one rendezvous endpoint, one rank
each on the CPU, gloo), against one process at the same global batch; per-host checkpoint shares and resume;
a rank killed on one host ends both launches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slidedp.runtime.shared_dir import PREFIX
from tests.builders import TINY
from tests.runtime.helpers import checkpoint_master, run_cli_train, run_losses

COMMON = ("--device", "cpu", "--log", "none", "--max-grad-norm", "0.05", "--lr", "3e-3", "--total-steps", "3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _our_state_dirs() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob(f"{PREFIX}{os.getuid()}-*")}


def _two_hosts(tmp_path: Path, out: Path, *extra: str, env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Both hosts' launchers at once (host files as run_cli_train writes them); their results in node order."""
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))  # as run_cli_train
    (tmp_path / "data.txt").write_text("streaming layers through a shared host state " * 60)
    endpoint = f"127.0.0.1:{_free_port()}"
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "slidedp.cli", "train", "--model", str(tmp_path / "tiny.json"), "--data",
               str(tmp_path / "data.txt"), "--seq", "32", "--out", str(out), "--nnodes", "2", "--node-rank",
               str(node), "--rdzv-endpoint", endpoint, *COMMON, *extra]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, **(env or {})}))
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return results




@pytest.mark.slow
def test_two_sharded_hosts_match_one_process_and_resume_their_shares(tmp_path):
    before = _our_state_dirs()
    single = run_cli_train(tmp_path, tmp_path / "one", "--steps", "3", "--batch", "2", *COMMON)
    assert single.returncode == 0, single.stderr[-2000:]
    hosts = _two_hosts(tmp_path, tmp_path / "two", "--steps", "2", "--batch", "2", "--host-layout", "sharded")
    for r in hosts:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "host 0 of 2, sharded" in hosts[0].stderr + hosts[1].stderr
    ckpt = tmp_path / "two" / "checkpoint"
    assert sorted(p.name for p in ckpt.iterdir()) == ["host0-of-2", "host1-of-2"]
    resumed = _two_hosts(tmp_path, tmp_path / "two", "--steps", "1", "--batch", "2", "--host-layout", "sharded",
                         "--resume", str(ckpt))
    for r in resumed:
        assert r.returncode == 0, r.stderr[-3000:]
    # Losses of all three steps (two, then one after the resume) as one process had them, at fp32 tolerance.
    assert run_losses(tmp_path / "two") == pytest.approx(run_losses(tmp_path / "one"), rel=1e-4, abs=1e-5)
    # Each host's share holds half of the master weights; together they are one process's, exactly placed.
    shares = [json.loads((ckpt / f"host{h}-of-2" / "meta.json").read_text()) for h in (0, 1)]
    assert [m["host"] for m in shares] == [0, 1] and all(m["data_step"] == 3 for m in shares)
    parts = [checkpoint_master(ckpt / f"host{h}-of-2") for h in (0, 1)]
    full = checkpoint_master(tmp_path / "one" / "checkpoint")
    assert parts[0].numel() + parts[1].numel() == full.numel() and abs(parts[0].numel() - parts[1].numel()) < 100
    from slidedp.routes import Routes
    from slidedp.runtime.chunks import ChunkTable
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config

    adapter = ModelAdapter(load_hf_config(str(tmp_path / "tiny.json")))
    policy = __import__("slidedp.policy", fromlist=["Policy"]).Policy(host_layout="sharded")
    for h in (0, 1):
        pieces = ChunkTable(adapter.units, Routes.of(policy, 1, hosts=2), 0, host=h).share_pieces()
        kept = torch.cat([full[lo:hi] for lo, hi, _ in pieces])
        torch.testing.assert_close(parts[h], kept, rtol=1e-4, atol=1e-5)
    # Another host count: one line, exit code 2, nothing started.
    other = run_cli_train(tmp_path, tmp_path / "three", "--steps", "1", "--batch", "2", *COMMON, "--resume",
                          str(ckpt))
    assert other.returncode == 2
    assert other.stderr.strip().splitlines()[-1].startswith("slidedp: error: checkpoint") and \
        "written by 2 host(s), this run has 1" in other.stderr
    assert _our_state_dirs() <= before  # neither host left state in /dev/shm


def test_a_rank_killed_on_one_host_ends_both_hosts_without_leftovers(tmp_path):
    before = _our_state_dirs()
    t0 = time.monotonic()
    hosts = _two_hosts(tmp_path, tmp_path / "run", "--steps", "4", "--batch", "2",
                       env={"SLIDEDP_FAULT_RANK": "1", "SLIDEDP_FAULT_STEP": "2"})  # host 1's rank dies at step 2
    assert [r.returncode != 0 for r in hosts] == [True, True], [r.stderr[-1500:] for r in hosts]
    assert time.monotonic() - t0 < 200
    for r in hosts:
        assert "a rank failed" in r.stderr
    assert _our_state_dirs() <= before


@pytest.mark.parametrize("flags, message", [
    (("--nnodes", "2"), "needs --rdzv-endpoint HOST:PORT"),
    (("--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"), "must be below --nnodes 2"),
    (("--node-rank", "1"), "need --nnodes above 1"),
    (("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--keep", "2"), "--keep above 1"),
    (("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--host-layout", "sharded", "--state", "fp32+int8"),
     "with host_layout sharded across hosts is not supported"),
])
def test_hosts_flags_are_checked_in_one_line(tmp_path, capsys, flags, message):
    from slidedp.cli import main

    (tmp_path / "tiny.json").write_text(json.dumps(TINY["qwen3"]))
    (tmp_path / "data.txt").write_text("a few words " * 50)
    code = main(["train", "--model", str(tmp_path / "tiny.json"), "--data", str(tmp_path / "data.txt"), "--seq", "16",
                 "--out", str(tmp_path / "x"), "--steps", "1", "--device", "cpu", "--log", "none", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and err.count("\n") == 0, err
