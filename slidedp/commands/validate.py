"""``slidedp validate``: predicted vs measured step time of run directories under one hardware profile."""

from __future__ import annotations

import argparse

from rich.console import Console

from slidedp.commands.validation_table import load_records, validation_table
from slidedp.hardware import load_hardware


def run_validate(args: argparse.Namespace) -> int:
    from slidedp.calibration.from_run import mape, validate

    records = load_records(args.runs)
    table = validate(records, load_hardware(args.hardware))
    console = Console()
    console.print(validation_table(f"{args.hardware}: MAPE {mape(table):.1f}%, limiter matches "
                                   f"{int(table.limiter_match.sum())}/{len(table)}", table))
    if args.out:
        table.to_csv(args.out, index=False)
        console.print(f"wrote {args.out} (plot it: slidedp report RUN --validation {args.out})")
    return 0
