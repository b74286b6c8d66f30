"""``slidedp tune``: search policies for a problem and write the winner as a policy YAML."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from slidedp.commands.progress import progress_callback
from slidedp.errors import SlideDPError
from slidedp.model_spec import load_model_spec
from slidedp.problem import resolve_budget, resolve_hardware
from slidedp.tune import TuneSpace, tune


def global_batch_from(args: argparse.Namespace, num_gpus: int) -> int:
    """--batch in sequences, or --tokens-per-step rounded up to whole sequences on every GPU."""
    if args.tokens_per_step is None:
        return args.batch
    per_rank = -(-args.tokens_per_step // (args.seq * num_gpus))
    return per_rank * num_gpus


def run_tune(args: argparse.Namespace) -> int:
    spec = load_model_spec(args.model)
    hw = resolve_hardware(args.hardware, args.gpus)
    budget = resolve_budget(hw, args.gpu_budget, args.host_limit)
    hosts = getattr(args, "hosts", 1)
    batch = global_batch_from(args, hw.num_gpus * hosts)
    space = TuneSpace(clipping=not args.no_clip, gpu_state=not args.no_gpu_state)
    if args.chunks:
        space = replace(space, chunks_per_layer=tuple(args.chunks))
    with progress_callback("tuning") as progress:
        result = tune(spec, hw, args.seq, batch, budget, space, refine_top=args.top_k, progress=progress, hosts=hosts)
    table = result.table()
    out = Path(args.out)
    result.best.policy.save(out)
    ranked_path = Path(args.table) if args.table else out.with_name(out.stem + "_ranked.csv")
    try:
        table.to_csv(ranked_path, index=False)
    except OSError as exc:
        raise SlideDPError(f"cannot write {str(ranked_path)!r}: {exc.strerror}") from None
    _print(table, result, spec.name, hw.name, args.seq, batch, out, ranked_path, args.show)
    return 0


def _print(table, result, model: str, hardware: str, seq: int, batch: int, out: Path, ranked: Path, show: int):
    console = Console()
    console.print(f"tuned [bold]{model}[/] on [bold]{hardware}[/], seq {seq}, batch {batch}: "
                  f"{result.enumerated} candidates, {len(result.candidates)} fit, "
                  f"top {sum(c.sim is not None for c in result.candidates)} refined with the simulator, "
                  f"{result.elapsed_s:.1f} s")
    view = Table(title="Best policies (simulated where refined, else analytical)")
    for col in ("#", "step s", "tok/s", "limit", "GPU GiB", "routes", "chunks/depth", "act", "mb x acc", "update",
                "thr"):
        view.add_column(col, justify="right" if col in ("#", "step s", "tok/s", "GPU GiB") else "left")
    short = {"replicated": "rep", "sharded": "shard", "per_rank": "rank", "reduce_scatter": "RS"}
    for row in table.head(show).itertuples():
        step = row.model_step_s if pd.isna(row.sim_step_s) else row.sim_step_s
        view.add_row(str(row.rank), f"{step:.3f}", f"{row.tokens_per_s:,.0f}", row.limiter, f"{row.gpu_peak_gib:.1f}",
                     f"{short[row.param_route]}/{short[row.grad_route]}",
                     f"{row.chunks_per_layer}/{row.prefetch_depth}", row.activation,
                     f"{row.micro_batch}x{row.accumulation}", row.update_schedule, str(row.adam_threads))
    console.print(view)
    console.print(f"wrote policy {out} and ranked table {ranked}")
