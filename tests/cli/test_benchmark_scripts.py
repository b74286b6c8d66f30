"""The GPU benchmark scripts on a tiny model on the CPU: they run, compare like with like, and write what
RESULTS.md is built from. Nothing here is timed; the figures come from the H200 runs."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.builders import TINY

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import peer_compare  # noqa: E402
import peer_systems  # noqa: E402


@pytest.fixture
def tiny_config(tmp_path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY["qwen3"]))
    return path


def test_peers_chunked_loss_equals_full_cross_entropy():
    """The peers' chunked loss (logits recomputed per chunk) has the plain loss's value and gradients."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 10, 16, generator=g, dtype=torch.float64).requires_grad_()
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, 50, (2, 10), generator=g)
    ref = F.cross_entropy((hidden.reshape(-1, 16) @ weight.T).float(), labels.reshape(-1))
    ref_grads = torch.autograd.grad(ref, [hidden, weight])

    loss = peer_systems.chunked_lm_loss(hidden, weight, labels, chunk=7, dtype=torch.float64)
    grads = torch.autograd.grad(loss, [hidden, weight])
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    for a, b in zip(grads, ref_grads, strict=True):
        assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-7)


def test_speedups_and_table_from_rows(tmp_path):
    rows = [{"system": s, "model": "m", "seq": 8, "batch": b, "status": "ok", "tokens_per_s": tps,
             "step_time_s": 8 * b / tps} for s, b, tps in [("slidedp", 1, 300.0), ("slidedp", 2, 800.0),
                                                           ("fsdp2-offload", 1, 100.0), ("fsdp2-offload", 2, 200.0),
                                                           ("resident", 1, 600.0)]]
    rows.append({"system": "resident", "model": "m", "seq": 8, "batch": 2, "status": "oom"})
    rows.append({"system": "slidedp-host", "model": "m", "seq": 8, "batch": 1, "status": "ok", "tokens_per_s": 200.0,
                 "step_time_s": 0.04})
    s = peer_compare.speedups(rows, "m")
    assert s["fsdp2-offload"]["geomean"] == pytest.approx(math.sqrt(3.0 * 4.0))
    assert peer_compare.speedups(rows, "m", "slidedp-host")["fsdp2-offload"]["per_batch"] == {1: 2.0}
    assert s["resident"]["per_batch"] == {1: 0.5}  # the OOM batch is not a ratio
    assert math.isnan(s["deepspeed-offload"]["geomean"])
    table = peer_compare.table_markdown(rows)
    assert "| m | 2 | resident | oom |" in table and "geometric mean 3.46x" in table
    paths = peer_compare.plot(rows, tmp_path)
    assert all(p.stat().st_size > 0 for p in paths)


def test_peer_compare_runs_every_cpu_capable_system(tmp_path, tiny_config):
    out = tmp_path / "peers"
    cmd = [sys.executable, str(BENCH / "peer_compare.py"), "--model", str(tiny_config), "--seq", "16",
           "--batches", "1", "2", "--steps", "2", "--device", "cpu", "--systems", "slidedp", "slidedp-host",
           "fsdp2-offload", "resident", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    rows = peer_compare.load_rows(out)
    assert {(r["system"], r["batch"], r["status"]) for r in rows} == {
        (s, b, "ok") for s in ("slidedp", "slidedp-host", "fsdp2-offload", "resident") for b in (1, 2)}
    held = {r["system"]: r["policy"]["gpu_state_units"] for r in rows if r["batch"] == 1 and "policy" in r}
    assert held["slidedp-host"] == 0 and held["slidedp"] > 0  # a tiny model: the tuner holds units on the GPU
    losses = {r["system"]: r["final_loss"] for r in rows if r["batch"] == 1}
    # Same model init, data and optimizer: after two steps every system reports a loss near ln(vocab).
    assert all(abs(v - math.log(97)) < 0.5 for v in losses.values()), losses
    assert (out / "table.md").exists() and (out / "peer_compare.png").exists()
    assert (out / "slidedp_runs.tar.gz").exists()


def test_peer_compare_with_two_ranks_per_system(tmp_path, tiny_config):
    """--gpus 2: SlideDP through slidedp train --nproc 2, FSDP2 offload under torchrun; a global batch that
    does not split over the ranks is a row saying so, not a failure."""
    out = tmp_path / "peers2"
    cmd = [sys.executable, str(BENCH / "peer_compare.py"), "--model", str(tiny_config), "--seq", "16",
           "--batches", "2", "3", "--steps", "2", "--device", "cpu", "--gpus", "2", "--systems", "slidedp",
           "fsdp2-offload", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    rows = {(r["system"], r["batch"]): r for r in peer_compare.load_rows(out)}
    assert rows[("slidedp", 2)]["status"] == "ok" and rows[("fsdp2-offload", 2)]["status"] == "ok"
    assert rows[("slidedp", 2)]["gpus"] == 2 and rows[("fsdp2-offload", 2)]["gpus"] == 2
    assert rows[("fsdp2-offload", 3)]["status"].startswith("skipped") and rows[("slidedp", 3)]["status"] != "ok"


def test_validation_and_long_sequence_scripts_write_run_directories(tmp_path, tiny_config):
    from slidedp.calibration.from_run import load_record

    val = tmp_path / "val"
    subprocess.run([sys.executable, str(BENCH / "validation_runs.py"), "--model", str(tiny_config), "--device", "cpu",
                    "--steps", "2", "--only", "s1024-b8-keep-c4", "--out", str(val)], check=True, capture_output=True,
                   timeout=300)
    record = load_record(val / "runs" / "tiny-s1024-b8-keep-c4")
    assert record.seq == 1024 and record.batch == 8 and record.policy.chunks_per_layer == 4
    subprocess.run([sys.executable, str(BENCH / "validation_runs.py"), "--model", str(tiny_config), "--device", "cpu",
                    "--steps", "2", "--set", "gpu_state", "--only", "s2048-b4-keep-c4-g8", "--out", str(val)],
                   check=True, capture_output=True, timeout=300)
    held = load_record(val / "runs" / "tiny-s2048-b4-keep-c4-g8")
    assert held.policy.gpu_state_units == 5  # all of the tiny model's units (3 layers + embedding + head)
    long_seq = tmp_path / "ls"
    subprocess.run([sys.executable, str(BENCH / "long_seq_runs.py"), "--base", str(tiny_config), "--layers", "2",
                    "--seqs", "32", "64", "--steps", "1", "--device", "cpu", "--out", str(long_seq)], check=True,
                   capture_output=True, timeout=300)
    rows = [json.loads(line) for line in (long_seq / "results.jsonl").read_text().splitlines()]
    assert [(r["seq"], r["status"]) for r in rows] == [(32, "ok"), (64, "ok")]
    assert all(r["model_spec"]["layers"] == 2 for r in rows)


def test_multi_gpu_correctness_part_compares_ranks_with_one_process(tmp_path, tiny_config):
    out = tmp_path / "mg"
    subprocess.run([sys.executable, str(BENCH / "multi_gpu.py"), "--model", str(tiny_config), "--gpus", "2",
                    "--seq", "16", "--check-steps", "2", "--device", "cpu", "--only", "correctness",
                    "--out", str(out)], check=True, capture_output=True, timeout=300)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    summary = next(r for r in rows if r["experiment"] == "correctness-summary")
    assert summary["status"] == "ok" and summary["max_loss_diff"] < 1e-5  # fp32 on the CPU: the same sums
    assert {r["label"] for r in rows if r["experiment"] == "correctness"} == {"correct-g1-b4", "correct-g2-b4"}
