"""`python -m benchmarks.peer_predictions` reads the committed peer rows and prints predicted against measured."""

from __future__ import annotations

import subprocess
import sys

from tests.builders import REPO


def test_peer_predictions_script_compares_every_measured_peer(tmp_path):
    out = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.peer_predictions", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    for expected in ("| qwen3-4b | 1 | fsdp2-offload | fsdp2-offload |", "| qwen3-8b | 8 | resident | ddp-resident |",
                     "| qwen3-4b (head untied) | 8 | resident |",  # DeepSpeed and one-GPU resident rows, as trained
                     "| qwen3-4b (head untied) | 8 | deepspeed-offload | zero2-offload |",
                     "measured s h200-2026-12-03b",
                     "| qwen3-8b | resident | ddp-resident | "):  # its OOM batches: tests/model/test_peer_memory.py
        assert expected in text
    assert "stand-in" not in text  # h200-x1 carries every measured peer's rates now
