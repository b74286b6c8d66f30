"""``slidedp report``: figures and a one-page summary of a run directory or trace file."""

from __future__ import annotations

import argparse
import math

import pandas as pd
from rich.console import Console

from slidedp.config_io import quote
from slidedp.errors import SlideDPError
from slidedp.output_paths import check_output_dir
from slidedp.report.rundir import load_run
from slidedp.report.summary import build_report


def _read_table(path: str, what: str, required: tuple[str, ...], positive: tuple[str, ...] = ()) -> pd.DataFrame:
    """A table a plot reads: its required columns present, and ``positive`` ones numbers > 0 in every row."""
    try:
        df = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise SlideDPError(f"cannot read {what} {path!r}: {' '.join(str(exc).split())[:200]}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise SlideDPError(f"{what} {path!r} lacks column(s): {', '.join(missing)}")
    if df.empty:
        raise SlideDPError(f"{what} {path!r} has no rows")
    for column in positive:
        values = pd.to_numeric(df[column], errors="coerce")
        bad = df[~(values > 0) | ~values.map(math.isfinite)]
        if not bad.empty:
            raise SlideDPError(f"{what} {path!r}: {column} must be a positive number in every row, got "
                               f"{quote(bad[column].iloc[0])} in row {int(bad.index[0]) + 1}")
        df[column] = values
    return df


def run_report(args: argparse.Namespace) -> int:
    out = check_output_dir(args.out, "--out")
    run = load_run(args.run)
    sweep = _read_table(args.sweep, "sweep table", ("seq", "gpus", "batch", "policy", "tokens_per_s", "limiter"),
                        positive=("seq", "gpus", "batch")) \
        if args.sweep else None
    validation = _read_table(args.validation, "validation table", ("label", "predicted_s", "measured_s"),
                             positive=("predicted_s", "measured_s")) \
        if args.validation else None
    rep = build_report(run, out, sweep, validation)
    Console().print(f"wrote {rep.markdown} and {rep.html} with {len(rep.figures)} figure(s) (PNG + SVG)")
    return 0
