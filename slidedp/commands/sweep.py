"""``slidedp sweep``: simulate a grid of batch, sequence length, GPU count and policy into a tidy table."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from slidedp.commands.progress import progress_callback
from slidedp.errors import SlideDPError
from slidedp.model_spec import load_model_spec
from slidedp.output_paths import check_output_file
from slidedp.problem import resolve_hardware
from slidedp.sweep import resolve_named_policy, run_sweep

# Printed columns: (table column, header, format). Those with one value in every row move to the caption, so
# the table fits an 80-column terminal; the file keeps every column.
_SHOWN = (("gpus", "GPUs", "{}"), ("seq", "seq", "{}"), ("batch", "batch", "{}"), ("system", "system", "{}"),
          ("policy", "policy", "{}"), ("state", "state", "{}"), ("step_s", "step s", "{:#.3g}"),
          ("tokens_per_s", "tok/s", "{:,.0f}"), ("limiter", "limiter", "{}"), ("host_gib", "host GiB", "{:.1f}"),
          ("fits", "fits", "{}"))


def sweep_table(table: pd.DataFrame) -> tuple[Table, str]:
    """The sweep's points as a terminal table: the varying columns, the constant ones in the caption; a mode that
    ``--state auto`` chose reads ``auto: <mode>`` (its reason is in the file's state_reason)."""
    if "state_reason" in table:
        chosen = table.state_reason.fillna("").astype(str) != ""
        table = table.assign(state=[f"auto: {st}" if c else st for st, c in zip(table.state, chosen, strict=True)])
    constant = [c for c, _, _ in _SHOWN if c in table and table[c].nunique(dropna=False) == 1
                and c not in ("step_s", "tokens_per_s")]
    shown = [(c, h, f) for c, h, f in _SHOWN if c in table and c not in constant]
    caption = ", ".join(f"{h} {_cell(f, table[c].iloc[0])}" for c, h, f in _SHOWN if c in constant)
    out = Table(box=box.SIMPLE, pad_edge=False)
    for c, h, _ in shown:
        numeric = pd.api.types.is_numeric_dtype(table[c]) and not pd.api.types.is_bool_dtype(table[c])
        out.add_column(h, justify="right" if numeric else "left", overflow="fold")
    for row in table.itertuples(index=False):
        out.add_row(*(_cell(f, getattr(row, c)) for c, _, f in shown))
    return out, f"{'every row' if len(table) > 1 else 'the point'}: {caption}" if caption else ""


def _cell(fmt: str, value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


DEFAULT_BATCHES = (4, 8, 16, 32, 64)


def sweep_axis(many: list[int] | None, one: int | None, default: tuple[int, ...], flags: tuple[str, str]) -> list[int]:
    """One axis of the grid: ``--seqs`` / ``--batches`` as given, else the single ``--seq`` / ``--batch``, else
    the default; both given is an error rather than one of them silently dropped."""
    if many and one is not None:
        raise SlideDPError(f"give {flags[0]} or {flags[1]}, not both")
    return list(many or ([one] if one is not None else default))


def run_sweep_command(args: argparse.Namespace) -> int:
    out = check_output_file(args.out, "--out", (".csv", ".parquet"))
    seqs = sweep_axis(args.seqs, args.seq, (4096,), ("--seqs", "--seq"))
    batches = sweep_axis(args.batches, args.batch, DEFAULT_BATCHES, ("--batches", "--batch"))
    spec = load_model_spec(args.model)
    hw = resolve_hardware(args.hardware, args.gpus)
    gpu_counts = args.gpu_counts or sorted({g for g in (1, 2, 4, 8) if g <= hw.num_gpus} | {hw.num_gpus})
    policies = [resolve_named_policy(p) for p in args.policies]
    with progress_callback("sweeping") as progress:
        table = run_sweep(spec, hw, seqs, batches, gpu_counts, policies, args.gpu_budget,
                          simulate_points=not args.analytical, progress=progress,
                          systems=getattr(args, "systems", None) or ["slidedp"],
                          states=tuple(dict.fromkeys(getattr(args, "state", None) or ["fp32"])),
                          hosts=getattr(args, "hosts", 1), host_limit_gib=args.host_limit)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out, index=False) if out.suffix == ".parquet" else table.to_csv(out, index=False)
    console = Console()
    console.print(f"{len(table)} point{'s' if len(table) != 1 else ''} written to {out}")
    hosts = getattr(args, "hosts", 1)  # the table's GPU counts are per host, as gpu_counts are
    dropped = [g * hosts for g in sorted(set(gpu_counts) - set(table.gpus))] if len(table) else []
    if dropped:
        console.print(f"left out: {', '.join(map(str, dropped))} GPU(s), which no batch of {batches} divides",
                      highlight=False)
    shown, caption = sweep_table(table)
    console.print(shown)
    if caption:
        console.print(caption, highlight=False)
    derived = sorted(set(table.state[table.update_rate == "derived from DRAM bytes"])) \
        if "update_rate" in table else []
    if derived:
        Console().print(f"CPU update rates of {', '.join(derived)} state are DERIVED from the measured fp32 rate by "
                        f"DRAM bytes, not measured on {hw.name}")
    return 0
