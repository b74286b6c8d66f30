"""`slidedp train` as a subprocess, the way the benchmark scripts launch measured runs (synthetic tokens, no
checkpoint), returning the exit code and the run directory's summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from slidedp.run_summary import RunSummary


def train_run(model: str, seq: int, policy_path: Path, steps: int, out: Path, *, batch: int | None = None,
              nproc: int = 1, hardware: str = "h200-x1", device: str = "auto",
              extra: tuple[str, ...] = ()) -> tuple[int, RunSummary | None]:
    """Exit code and summary.json of one run (None where the run wrote no summary)."""
    cmd = [sys.executable, "-m", "slidedp.cli", "train", "--model", str(model), "--data", "synthetic", "--seq",
           str(seq), "--policy", str(policy_path), "--steps", str(steps), "--nproc", str(nproc), "--hardware",
           hardware, "--device", device, "--no-checkpoint", "--out", str(out), *extra]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    print(f"=== {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.run(cmd, check=False)
    summary = Path(out) / "summary.json"
    return proc.returncode, RunSummary.load(summary) if summary.exists() else None
