"""``slidedp report``: figures and a one-page summary of a run directory or trace file."""

from __future__ import annotations

import argparse

from rich.console import Console

from slidedp.output_paths import check_output_dir
from slidedp.report.rundir import load_run
from slidedp.report.summary import build_report
from slidedp.report.tables import read_table


def run_report(args: argparse.Namespace) -> int:
    out = check_output_dir(args.out, "--out")
    run = load_run(args.run)
    sweep = read_table(args.sweep, "sweep table", ("seq", "gpus", "batch", "policy", "tokens_per_s", "limiter"),
                       positive=("seq", "gpus", "batch")) \
        if args.sweep else None
    validation = read_table(args.validation, "validation table", ("label", "predicted_s", "measured_s"),
                            positive=("predicted_s", "measured_s")) \
        if args.validation else None
    rep = build_report(run, out, sweep, validation)
    Console().print(f"wrote {rep.markdown} and {rep.html} with {len(rep.figures)} figure(s) (PNG + SVG)")
    return 0
