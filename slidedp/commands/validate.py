"""``slidedp validate``: predicted vs measured step time of run directories under one hardware profile."""

from __future__ import annotations

import argparse

from rich.console import Console

from slidedp.commands.validation_table import (
    cpu_runs_warning,
    load_records,
    more_ranks_warning,
    print_warning,
    validation_table,
)
from slidedp.hardware import load_hardware
from slidedp.output_paths import check_output_file


def run_validate(args: argparse.Namespace) -> int:
    from slidedp.calibration.from_run import mape, validate

    if args.out:
        check_output_file(args.out, "--out", (".csv",))
    records = load_records(args.runs)
    hw = load_hardware(args.hardware)
    table = validate(records, hw)
    console = Console()
    for warning in (cpu_runs_warning(records, hw), more_ranks_warning(records, hw)):
        if warning:
            print_warning(warning)
    console.print(validation_table(f"{args.hardware}: MAPE {mape(table):.1f}%, limiter matches "
                                   f"{int(table.limiter_match.sum())}/{len(table)}", table))
    if args.out:
        table.to_csv(args.out, index=False)
        console.print(f"wrote {args.out} (plot it: slidedp report RUN --validation {args.out})")
    return 0
