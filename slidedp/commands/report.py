"""``slidedp report``: figures and a one-page summary of a run directory or trace file."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from rich.console import Console

from slidedp.errors import SlideDPError
from slidedp.report.rundir import load_run
from slidedp.report.summary import build_report


def _read_table(path: str, what: str, required: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise SlideDPError(f"cannot read {what} {path!r}: {exc}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise SlideDPError(f"{what} {path!r} lacks column(s): {', '.join(missing)}")
    return df


def run_report(args: argparse.Namespace) -> int:
    run = load_run(args.run)
    sweep = _read_table(args.sweep, "sweep table", ("seq", "gpus", "batch", "policy", "tokens_per_s", "limiter")) \
        if args.sweep else None
    validation = _read_table(args.validation, "validation table", ("label", "predicted_s", "measured_s")) \
        if args.validation else None
    rep = build_report(run, Path(args.out), sweep, validation)
    Console().print(f"wrote {rep.markdown} and {rep.html} with {len(rep.figures)} figure(s) (PNG + SVG)")
    return 0
