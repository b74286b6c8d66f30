"""benchmarks.host_profile_spread: one measured row predicted from two host profiles, as the model it trained."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from benchmarks import host_profile_spread as spread
from benchmarks.peer_predictions import predict
from slidedp.errors import SlideDPError
from slidedp.hardware import load_hardware
from slidedp.model_spec import ModelSpec
from slidedp.peers.systems import DEEPSPEED_CPU_ADAM


def _slower_host(tmp_path, factor: float):
    """h200-x1 with every host rate the ZeRO-2 prediction uses divided by ``factor``, saved as a profile file."""
    hw = load_hardware("h200-x1")
    h = hw.host
    scaled = {impl: {t: v / factor for t, v in curve.items()} for impl, curve in h.peer_adam_gparams_per_s.items()}
    slow = replace(hw, host=replace(h, peer_adam_gparams_per_s=scaled,
                                    stream_gbps={t: v / factor for t, v in h.stream_gbps.items()},
                                    cast_gelems_per_s={t: v / factor for t, v in h.cast_gelems_per_s.items()}))
    path = tmp_path / f"slow{factor}.yaml"
    slow.save(path)
    return path


def test_rows_are_predicted_per_profile_as_the_model_they_trained(tmp_path, monkeypatch, capsys):
    # A row from a device call: its config path is not on this machine, so it resolves by stem in ARCHS; it ran
    # before the tied-head fix (no head_as_configured), so DeepSpeed trained the Qwen2.5-3B shape untied.
    row = {"system": "deepspeed-offload", "model": "/tmp/c45cfg/qwen25-3b.json", "seq": 4096, "batch": 1,
           "status": "ok", "step_time_s": 2.0}
    spec = spread.row_spec(row)
    assert spec.name == "qwen25-3b (head untied)" and not spec.tied_embeddings
    assert spread.row_spec({**row, "head_as_configured": True}).tied_embeddings
    expected = predict("zero2-offload", row["model"], load_hardware("h200-x1"), 4096, 1, spec)["step_s"]
    run = tmp_path / "c45" / "results.jsonl"
    run.parent.mkdir()
    run.write_text(json.dumps({**row, "step_time_s": expected / 1.05}) + "\n" + json.dumps({**row, "status": "oom"})
                   + "\n")
    slow = _slower_host(tmp_path, 2.0)
    monkeypatch.setattr(sys, "argv", ["host_profile_spread", "--profiles", "h200-x1", str(slow), "--runs", str(run)])
    assert spread.main() == 0
    out = capsys.readouterr().out
    blocks = out.split("### ")[1:]
    ds_rate = max(load_hardware("h200-x1").host.peer_adam_gparams_per_s[DEEPSPEED_CPU_ADAM].values())
    assert len(blocks) == 2 and f"DeepSpeedCPUAdam {ds_rate:.2f} G params/s" in blocks[0]
    assert "| +5.0% |" in blocks[0] and "deepspeed-offload: MAPE 5.0%, worst +5.0%, 1 of 1 within 10%" in blocks[0]
    slower = float(blocks[1].split("| qwen25-3b (head untied) | deepspeed-offload | 1 | ")[1].split(" |")[0])
    assert slower > expected * 1.2  # a host half as fast predicts the CPU-bound step much slower
    assert out.count("qwen25-3b (head untied)") == 2  # the out-of-memory row is not predicted


def test_an_unknown_config_and_a_missing_results_file_are_one_line(tmp_path, monkeypatch, capsys):
    with pytest.raises(SlideDPError, match="not on this machine"):
        spread.row_spec({"model": "/tmp/nowhere/not-an-arch.json", "system": "resident"})
    monkeypatch.setattr(sys, "argv", ["host_profile_spread", "--profiles", "h200-x1", "--runs",
                                      str(tmp_path / "none.jsonl")])
    assert spread.main() == 2
    assert capsys.readouterr().err.startswith("host_profile_spread: no such results file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"system": "resident", "status": "ok"}\n')
    for argv in (["--profiles", "no-such-profile", "--runs", str(bad)], ["--profiles", "h200-x1", "--runs", str(bad)]):
        monkeypatch.setattr(sys, "argv", ["host_profile_spread", *argv])
        assert spread.main() == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("host_profile_spread: ")
    assert isinstance(spread.row_spec({"model": "qwen3-0.6b", "system": "fsdp2-offload"}), ModelSpec)
