"""``slidedp calibrate`` (micro-benchmarks or refit from runs) and ``slidedp validate``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slidedp.commands.progress import progress_callback
from slidedp.errors import SlideDPError
from slidedp.hardware import load_hardware


def _records(paths: list[str]):
    from slidedp.calibration.from_run import load_record

    return [load_record(p) for p in paths]


def _table(title: str, table) -> Table:
    view = Table(title=title)
    for col in ("run", "measured s", "predicted s", "error %", "limiter (measured / predicted)"):
        view.add_column(col)
    for r in table.itertuples():
        view.add_row(r.label, f"{r.measured_s:.3f}", f"{r.predicted_s:.3f}", f"{r.error_percent:+.1f}",
                     f"{r.measured_limiter} / {r.predicted_limiter}")
    return view


def run_calibrate(args: argparse.Namespace) -> int:
    from slidedp.calibration.from_run import mape, refit_profile, validate
    from slidedp.calibration.gpu_bench import gpu_benchmarks, layer_benchmarks
    from slidedp.calibration.host_bench import host_benchmarks
    from slidedp.calibration.profile_fit import profile_from

    console = Console()
    base = load_hardware(args.base)
    if args.from_run:
        records = _records(args.from_run)
        before = validate(records, base)
        profile, report = refit_profile(base, records)
        after = validate(records, profile)
        console.print(_table(f"before: {base.name} (MAPE {mape(before):.1f}%)", before))
        console.print(_table(f"after: {profile.name} (MAPE {mape(after):.1f}%)", after))
    else:
        with progress_callback("micro-benchmarks") as progress:
            measured = host_benchmarks(args.quick, progress)
            gpu_benchmarks(measured, args.quick, progress)
            for model in args.model or []:
                layer_benchmarks(measured, model, args.quick, progress)
        profile, report = profile_from(base, measured)
    for key, value in report.items():
        console.print(f"  {key}: {value}")
    try:
        profile.save(Path(args.out))
    except OSError as exc:
        raise SlideDPError(f"cannot write {args.out!r}: {exc.strerror}") from None
    console.print(f"wrote {args.out}")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from slidedp.calibration.from_run import mape, validate

    records = _records(args.runs)
    table = validate(records, load_hardware(args.hardware))
    console = Console()
    console.print(_table(f"{args.hardware}: MAPE {mape(table):.1f}%, limiter matches "
                         f"{int(table.limiter_match.sum())}/{len(table)}", table))
    if args.out:
        table.to_csv(args.out, index=False)
        console.print(f"wrote {args.out} (plot it: slidedp report RUN --validation {args.out})")
    return 0
