"""What several benchmark scripts share: progress lines, the synthetic tokens every measured system trains on,
host RSS, results rows as JSONL, the one archive of raw outputs an invocation writes, and `slidedp train` as a
subprocess the way the drivers launch measured runs.

The scripts run from the repository root as modules (`python -m benchmarks.<name>`), so they import this as
`benchmarks.common`. Heavy imports (torch, slidedp's runtime) stay inside the functions that need them: the
drivers import this module before deciding which worker process to start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from slidedp.run_summary import RunSummary
from slidedp.runtime.lifetime import die_with_parent


def log(msg: str) -> None:
    """One progress line, flushed at once: the drivers' output interleaves with their subprocesses'."""
    print(msg, flush=True)


def require_cuda(script: str) -> None:
    """Scripts that measure a GPU run: one line and exit 2 on a machine without CUDA, before anything is done
    (on a CPU they would calibrate the CPU as if it were the GPU host and time runs that cannot start)."""
    import torch

    if not torch.cuda.is_available():
        print(f"{script}: needs a CUDA GPU (it measures GPU runs; the figures it made are in benchmarks/RESULTS.md)",
              file=sys.stderr)
        raise SystemExit(2)


def synthetic_tokens(vocab: int, batch: int, seq: int):
    """The tokens every benchmarked system trains on for a (batch, seq): seeded by the shape, so SlideDP,
    its resident reference and the peers see the same data."""
    import torch

    return torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(batch * 7919 + seq))


# What torch's CUDA out-of-memory message says, in GiB: the request, the card, what the process had in use,
# and how much of that PyTorch had allocated and held reserved but unallocated (fragmentation, at that moment).
_OOM_FIELDS = {"request_gib": r"Tried to allocate ([\d.]+) ([KMG]iB|bytes)",
               "capacity_gib": r"total capacity of ([\d.]+) ([KMG]iB|bytes)",
               "in_use_gib": r"this process has ([\d.]+) ([KMG]iB|bytes) memory in use",
               "allocated_gib": r"([\d.]+) ([KMG]iB|bytes) is allocated by PyTorch",
               "reserved_unallocated_gib": r"([\d.]+) ([KMG]iB|bytes) is reserved by PyTorch but unallocated"}
_UNIT_GIB = {"bytes": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1.0}


def oom_fields(message: str) -> dict[str, float]:
    """The figures of a CUDA out-of-memory message (those it states), so a row keeps them beyond its first line."""
    found = {}
    for key, pattern in _OOM_FIELDS.items():
        m = re.search(pattern, message)
        if m:
            found[key] = round(float(m.group(1)) * _UNIT_GIB[m.group(2)], 3)
    return found


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


@contextlib.contextmanager
def sigterm_raises_exit():
    """While inside: a SIGTERM to this process raises SystemExit(128 + SIGTERM) instead of ending it at once, so
    that ``finally`` clauses end the processes it started first (a process group in a session of its own is out
    of reach of a signal sent to this one's group). Only the main thread may set handlers; elsewhere nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_exit(signum, frame) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_in_own_session(cmd: list[str], timeout: float, grace_s: float = 10.0) -> int | None:
    """Run ``cmd`` in a session (process group) of its own and wait at most ``timeout`` seconds: its exit code,
    or None where it was stopped at the limit. Then whatever it started and left running (a `slidedp train`
    under a worker, a peer's helper processes) is ended with it: SIGTERM to the whole group, SIGKILL after
    ``grace_s``. So nothing of one measured system runs on beside the next, and a pinned host state is not
    still resident when the next system allocates its own. Killing the direct child alone leaves its children
    running: a single-rank `slidedp train` has nothing that ends it with its parent.

    Outside signals reach the group through this process: a SIGTERM to it (the device scripts' `timeout`, which
    signals only its own process group, and the group here is not in it) or Ctrl-C ends the group, then this
    process; a SIGKILL to it ends the group's leader through the kernel (parent-death signal)."""
    with sigterm_raises_exit():
        proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            end_process_group(proc, grace_s)


def end_process_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL to whatever is left of it after ``grace_s``; ``proc`` reaped."""
    pgid = proc.pid  # start_new_session: the leader's pid names the group, even after the leader has exited
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:  # nothing left in the group
        proc.wait()
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, so that a finished group reads as gone
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait()


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
    # SIGTERM (the trainer's orderly stop) when the driver that started it dies, however it dies.
    proc = subprocess.run(cmd, check=False, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    summary = Path(out) / "summary.json"
    return proc.returncode, RunSummary.load(summary) if summary.exists() else None


def exit_code(rows: list[dict], name: str) -> int:
    """A driver's exit code from its rows (``rc`` per run, ``name`` the key naming the run): 1 and one line
    listing the failed runs where any failed, else 0."""
    failed = [str(r[name]) for r in rows if r["rc"] != 0]
    if failed:
        log(f"failed: {', '.join(failed)}")
    return 1 if failed else 0
