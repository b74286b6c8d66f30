"""A run directory: what a simulated or measured step leaves behind, in one layout for both.

    trace.parquet    the trace table (slidedp.trace schema); a data-parallel run's ranks also write
                     trace_rank<r>.parquet each, which load_run reads together (rank 0's is trace.parquet's)
    exposure.csv     per-rank compute and exposed seconds (optional: inferred from the trace otherwise)
    summary.json     problem, policy, predicted/measured step time, throughput, limiter, memory
    policy.yaml, hardware.yaml   what was run, on what

A benchmark results folder (benchmarks/results/<session>/) keeps its small tables and logs loose and its bulky
raw outputs (traces, the drivers' run directories) in one raw.tar.xz; `unpack_session` puts both back together.
"""

from __future__ import annotations

import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from slidedp.errors import SlideDPError
from slidedp.exposure import exposure_from_trace
from slidedp.report.tables import read_table
from slidedp.run_summary import RunSummary
from slidedp.trace import EXPOSURE_CATEGORIES, load_trace, save_trace

HARDWARE_FILE = "hardware.yaml"  # the profile the run was predicted with (its GPU count the run's)
RAW_ARCHIVE = "raw.tar.xz"  # a results folder's bulky raw outputs, packed once so git holds one binary per session


@dataclass
class RunDir:
    path: Path
    trace: pd.DataFrame
    exposure: pd.DataFrame
    summary: RunSummary  # empty (RunSummary().empty) for a bare trace file


def write_run_dir(path: str | Path, trace: pd.DataFrame, exposure: pd.DataFrame, summary: RunSummary,
                  policy=None, hardware=None) -> Path:
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SlideDPError(f"cannot create run directory {str(path)!r}: {exc.strerror}") from None
    save_trace(trace, path / "trace.parquet")
    exposure.to_csv(path / EXPOSURE_FILE, index=False)
    summary.save(path / SUMMARY_FILE)
    if policy is not None:
        policy.save(path / "policy.yaml")
    if hardware is not None:
        hardware.save(path / HARDWARE_FILE)
    return path


def load_run(path: str | Path) -> RunDir:
    """A run directory, or a bare trace file (exposure then inferred, summary empty)."""
    path = Path(path)
    if path.is_file():
        trace = load_trace(path)
        return RunDir(path, trace, exposure_from_trace(trace), RunSummary())
    if not path.is_dir():
        raise SlideDPError(f"no run directory or trace file at {str(path)!r}")
    traces = [path / name for name in TRACE_FILES if (path / name).exists()]
    if not traces:
        raise SlideDPError(f"run directory {str(path)!r} holds no trace.parquet, trace.csv or trace.json")
    trace = load_trace(traces[0])
    summary = RunSummary.load(path / SUMMARY_FILE) if (path / SUMMARY_FILE).exists() else RunSummary()
    step = summary.step_time_s
    per_rank = rank_traces(path)
    if len(per_rank) > 1:  # every rank's last step; exposure.csv holds rank 0's row only
        trace = pd.concat([load_trace(p) for p in per_rank], ignore_index=True)
        exposure = exposure_from_trace(trace, step)
    elif (path / EXPOSURE_FILE).exists():
        exposure = load_exposure(path / EXPOSURE_FILE)
    else:
        exposure = exposure_from_trace(trace, step)
    return RunDir(path, trace, exposure, summary)


def load_exposure(path: Path) -> pd.DataFrame:
    """A run's exposure.csv as :func:`write_run_dir` writes it: a rank column and numeric compute and exposed
    seconds per category (delete the file to have the exposure inferred from the trace)."""
    return read_table(path, "exposure table", ("rank", "compute", *EXPOSURE_CATEGORIES),
                      numeric=("rank", "compute", *EXPOSURE_CATEGORIES))


TRACE_FILES = ("trace.parquet", "trace.csv", "trace.json")
EXPOSURE_FILE = "exposure.csv"
SUMMARY_FILE = "summary.json"


def measurement_files(path: Path) -> list[Path]:
    """The files of ``path`` that one run's step writes (traces, rank traces, exposure, summary), those that
    exist: what a new run in the same directory must not leave mixed with its own. The policy and hardware
    files are left out: a user may keep the policy a run reads there."""
    named = [path / n for n in (*TRACE_FILES, EXPOSURE_FILE, SUMMARY_FILE)]
    return [p for p in named if p.is_file()] + rank_traces(path)


def rank_traces(path: Path) -> list[Path]:
    """The per-rank traces of a data-parallel run directory, by rank (each rank's clock starts at its own step
    start; the ranks begin a step together, so their tracks line up to a barrier's skew)."""
    found = []
    for p in path.glob("trace_rank*.parquet"):
        digits = p.stem[len("trace_rank"):]
        if digits.isdigit():
            found.append((int(digits), p))
    return [p for _, p in sorted(found)]


def unpack_session(folder: str | Path, dest: str | Path) -> Path:
    """A results folder as its benchmark runs left it: the loose files copied to ``dest``, then the folder's
    raw.tar.xz (trace parquet files, run directories) unpacked over them at their original relative paths,
    so readers open ``dest / "run64k"`` or ``dest / "peers" / "slidedp_runs"`` as if nothing had been packed.
    A folder without an archive is just copied. Returns ``dest``."""
    folder, dest = Path(folder), Path(dest)
    if not folder.is_dir():
        raise SlideDPError(f"no results folder at {str(folder)!r}")
    shutil.copytree(folder, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(RAW_ARCHIVE))
    archive = folder / RAW_ARCHIVE
    if archive.exists():
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(dest, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise SlideDPError(f"cannot unpack {str(archive)!r}: {exc}") from None
    return dest
