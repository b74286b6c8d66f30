"""benchmarks.zero2_heldout: the configs it writes are the architectures it predicts, and measured rows from
peer_compare join its predictions by model name, sequence and batch."""

from __future__ import annotations

import json
import sys

from benchmarks import zero2_heldout as z
from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec


def test_written_configs_load_as_the_predicted_architectures(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["zero2_heldout", "--write-configs", str(tmp_path)])
    assert z.main() == 0
    names = {name for name, _, _ in z.CASES if name in z.ARCHS}
    assert {p.stem for p in tmp_path.glob("*.json")} == names
    for name in names:
        assert load_model_spec(str(tmp_path / f"{name}.json")).total_params == z.model_spec(name).total_params


def test_measured_rows_join_the_predictions_and_errors_are_signed(tmp_path):
    hw = load_hardware("h200-x1")
    pred = z.predict("qwen3-0.6b", 4096, 1, hw)
    assert pred["overlapped_step_s"] < pred["step_s"]  # the serial offload only adds time
    assert pred["backward_s"] > pred["serial_offload_s"] > 0
    folder = tmp_path / "run"
    folder.mkdir()
    rows = [{"system": "deepspeed-offload", "model": "/tmp/cfg/qwen3-0.6b.json", "seq": 4096, "batch": 1,
             "status": "ok", "step_time_s": pred["step_s"] / 1.25},
            {"system": "fsdp2-offload", "model": "qwen3-0.6b", "seq": 4096, "batch": 1, "status": "ok",
             "step_time_s": 1.0}]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    measured = z.measured_rows([folder])
    assert set(measured) == {("qwen3-0.6b", 4096, 1)}
    line = z.table([pred], hw, measured).splitlines()[-1]
    assert "+25.0%" in line
    assert line.split("|")[-2].strip().startswith("+25.0%")


def test_a_model_that_does_not_fit_the_host_is_marked():
    hw = load_hardware("h200-x1")
    pred = z.predict("qwen3-8b", 4096, 1, hw)
    assert not pred["fits_host"] and pred["host_gib"] > hw.host.memory_gib
    assert "host OOM" in z.table([pred], hw)

