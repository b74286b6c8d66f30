"""``slidedp sweep`` and ``slidedp report``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from rich.console import Console

from slidedp.commands.progress import progress_callback
from slidedp.errors import SlideDPError
from slidedp.model_spec import load_model_spec
from slidedp.problem import resolve_hardware
from slidedp.report.rundir import load_run
from slidedp.report.summary import build_report
from slidedp.sweep import resolve_named_policy, run_sweep


def _read_table(path: str, what: str, required: tuple[str, ...]) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise SlideDPError(f"cannot read {what} {path!r}: {exc}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise SlideDPError(f"{what} {path!r} lacks column(s): {', '.join(missing)}")
    return df


def run_sweep_command(args: argparse.Namespace) -> int:
    spec = load_model_spec(args.model)
    hw = resolve_hardware(args.hardware, args.gpus)
    gpu_counts = args.gpu_counts or sorted({g for g in (1, 2, 4, 8) if g <= hw.num_gpus} | {hw.num_gpus})
    policies = [resolve_named_policy(p) for p in args.policies]
    out = Path(args.out)
    if out.suffix not in (".csv", ".parquet"):
        raise SlideDPError(f"sweep output {args.out!r}: use a .csv or .parquet suffix")
    with progress_callback("sweeping") as progress:
        table = run_sweep(spec, hw, args.seqs or [args.seq], args.batches, gpu_counts, policies, args.gpu_budget,
                          simulate_points=not args.analytical, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out, index=False) if out.suffix == ".parquet" else table.to_csv(out, index=False)
    Console().print(f"{len(table)} points written to {out}")
    Console().print(table[["gpus", "seq", "batch", "policy", "step_s", "tokens_per_s", "limiter", "fits"]]
                    .to_string(index=False))
    return 0


def run_report(args: argparse.Namespace) -> int:
    run = load_run(args.run)
    sweep = _read_table(args.sweep, "sweep table", ("seq", "gpus", "batch", "policy", "tokens_per_s", "limiter")) \
        if args.sweep else None
    validation = _read_table(args.validation, "validation table", ("label", "predicted_s", "measured_s")) \
        if args.validation else None
    rep = build_report(run, Path(args.out), sweep, validation)
    Console().print(f"wrote {rep.markdown} and {rep.html} with {len(rep.figures)} figure(s) (PNG + SVG)")
    return 0
