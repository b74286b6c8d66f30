"""What several benchmark scripts share: progress lines, the synthetic tokens every measured system trains on,
host RSS, results rows as JSONL, the one archive of raw outputs an invocation writes, and `slidedp train` as a
subprocess the way the drivers launch measured runs.

The scripts run from the repository root as modules (`python -m benchmarks.<name>`), so they import this as
`benchmarks.common`. Heavy imports (torch, slidedp's runtime) stay inside the functions that need them: the
drivers import this module before deciding which worker process to start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

from slidedp.run_summary import RunSummary


def log(msg: str) -> None:
    """One progress line, flushed at once: the drivers' output interleaves with their subprocesses'."""
    print(msg, flush=True)


def synthetic_tokens(vocab: int, batch: int, seq: int):
    """The tokens every benchmarked system trains on for a (batch, seq): seeded by the shape, so SlideDP,
    its resident reference and the peers see the same data."""
    import torch

    return torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(batch * 7919 + seq))


def rss_gib(field: str = "VmRSS") -> float:
    """This process's resident set (VmRSS) or its peak (VmHWM) in GiB, as the runtime's trainer reads it."""
    from slidedp.runtime.trainer import rss_bytes

    return rss_bytes(field) / 2**30


def model_label(model: str) -> str:
    """A model's name in tables and run directories: a preset as given, a config file by its stem
    (``Path("qwen3-0.6b").stem`` would cut a preset's dotted version)."""
    path = Path(model)
    return path.stem if path.suffix == ".json" else path.name


def append_jsonl(path: Path, row: dict) -> None:
    """Append one results row: rows land as runs finish, so a run cut short still leaves the earlier ones."""
    with Path(path).open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """Every row of a results.jsonl (none if it does not exist yet), blank lines skipped."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pack(archive: Path, members: Iterable[tuple[Path, str]]) -> Path:
    """The invocation's one archive of raw outputs (run directories, traces): (path, name in the archive) pairs
    into a gzip tarball, so a session's bulky files travel and get committed as one file."""
    with tarfile.open(archive, "w:gz") as tar:
        for path, arcname in members:
            tar.add(path, arcname=arcname)
    return Path(archive)


def train_run(model: str, seq: int, policy_path: Path, steps: int, out: Path, *, batch: int | None = None,
              nproc: int = 1, hardware: str = "h200-x1", device: str = "auto",
              extra: tuple[str, ...] = ()) -> tuple[int, RunSummary | None]:
    """`slidedp train` in a subprocess (synthetic tokens, no checkpoint): its exit code and the run directory's
    summary (None where the run wrote no summary)."""
    cmd = [sys.executable, "-m", "slidedp.cli", "train", "--model", str(model), "--data", "synthetic", "--seq",
           str(seq), "--policy", str(policy_path), "--steps", str(steps), "--nproc", str(nproc), "--hardware",
           hardware, "--device", device, "--no-checkpoint", "--out", str(out), *extra]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    print(f"=== {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.run(cmd, check=False)
    summary = Path(out) / "summary.json"
    return proc.returncode, RunSummary.load(summary) if summary.exists() else None


def exit_code(rows: list[dict], name: str) -> int:
    """A driver's exit code from its rows (``rc`` per run, ``name`` the key naming the run): 1 and one line
    listing the failed runs where any failed, else 0."""
    failed = [str(r[name]) for r in rows if r["rc"] != 0]
    if failed:
        log(f"failed: {', '.join(failed)}")
    return 1 if failed else 0
