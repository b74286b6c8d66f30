"""``slidedp tune``: search policies for a problem and write the winner as a policy YAML."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from slidedp.commands.progress import progress_callback
from slidedp.errors import SlideDPError
from slidedp.model_spec import load_model_spec
from slidedp.output_paths import check_output_file
from slidedp.problem import checked_span, resolve_budget, resolve_hardware
from slidedp.state_choice import state_options
from slidedp.tune import TuneSpace, tune

DEFAULT_TUNE_BATCH = 32


def global_batch_from(args: argparse.Namespace, num_gpus: int) -> int:
    """--batch in sequences (default 32), or --tokens-per-step rounded up to whole sequences on every GPU; both
    given is an error rather than --batch silently dropped."""
    if args.tokens_per_step is None:
        return DEFAULT_TUNE_BATCH if args.batch is None else args.batch
    if args.batch is not None:
        raise SlideDPError("give --batch or --tokens-per-step, not both")
    per_rank = -(-args.tokens_per_step // (args.seq * num_gpus))
    return per_rank * num_gpus


def run_tune(args: argparse.Namespace) -> int:
    out = check_output_file(args.out, "--out")
    ranked_path = check_output_file(args.table, "--table") if args.table else \
        check_output_file(out.with_name(out.stem + "_ranked.csv"), "the ranked table beside --out")
    if ranked_path.resolve() == out.resolve():
        raise SlideDPError(f"--table {str(args.table)!r} is the --out policy file: give the ranked table another name")
    spec = load_model_spec(args.model)
    hw = resolve_hardware(args.hardware, args.gpus)
    budget = resolve_budget(hw, args.gpu_budget, args.host_limit)
    hosts = getattr(args, "hosts", 1)
    batch = global_batch_from(args, hw.num_gpus * hosts)
    if args.tokens_per_step is not None and batch * args.seq != args.tokens_per_step:
        Console().print(f"--tokens-per-step {args.tokens_per_step:,} is batch {batch} on {hw.num_gpus * hosts} GPU(s) "
                        f"at seq {args.seq} ({batch * args.seq:,} tokens: whole sequences on every GPU)",
                        highlight=False)
    space = TuneSpace(clipping=not args.no_clip, gpu_state=not args.no_gpu_state,
                      kept_layers=not getattr(args, "no_kept_layers", False),
                      states=state_options(getattr(args, "state", "fp32")))
    if args.chunks:
        space = replace(space, chunks_per_layer=tuple(args.chunks))
    if args.seq_tiles:
        space = replace(space, seq_tiles=tuple(t for t in args.seq_tiles if t > 0))
    with progress_callback("tuning") as progress:
        result = tune(spec, hw, args.seq, batch, budget, space, refine_top=args.top_k, progress=progress, hosts=hosts,
                      attention_span=checked_span(args.attention_span, args.seq))
    table = result.table()
    result.best.policy.save(out)
    ranked_path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(ranked_path, index=False)
    _print(table, result, spec.name, hw.name, args.seq, batch, out, ranked_path, args.show)
    return 0


# Short spellings that keep the ranked table within 80 columns; the legend printed under it spells them out.
_ROUTE = {"replicated": "R", "sharded": "S", "per_rank": "PR", "reduce_scatter": "RS"}
_ACTIVATION = {"keep": "keep", "recompute": "rec", "offload": "off"}
_SCHEDULE = {"next_forward": "next", "as_ready": "ready", "after_backward": "after"}
_LEGEND = ("step s: simulated; * = analytical model only.  GiB: GPU peak.  held: units\n"
           "whose optimizer state stays on the GPU.  route: params/grads (R replicated,\n"
           "S sharded / PR per-rank, RS reduce-scatter).  ch/pf: chunks per layer /\n"
           "prefetch depth.  act: keep, rec(ompute), off(load).  mb×acc: micro-batch x\n"
           "accumulation.  upd: CPU update during the next forward, as ready, after\n"
           "backward.  thr: CPU threads per rank.")
_TILE_LEGEND = "tile: tokens per sequence tile of a layer's MLP (- untiled)."
_STATE_LEGEND = "state: host optimizer state, master+moments (fp32: exact AdamW)."
_KEPT_LEGEND = "rec+N: recompute, but the last N decoder layers keep their graphs."


def _print(table, result, model: str, hardware: str, seq: int, batch: int, out: Path, ranked: Path, show: int):
    console = Console()
    refined = sum(c.sim is not None for c in result.candidates)
    console.print(f"tuned [bold]{model}[/] on [bold]{hardware}[/], seq {seq}, batch {batch}: "
                  f"{result.enumerated} policies enumerated; with the GPU-held and kept-layer variants tried for "
                  f"each, {len(result.candidates)} candidates fit; top {refined} refined with the simulator, "
                  f"{result.elapsed_s:.1f} s")
    console.print(ranked_view(table.head(show)))
    shown = table.head(show)
    console.print(_LEGEND + ("\n" + _TILE_LEGEND if shown["seq_tile_tokens"].any() else "")
                  + ("\n" + _STATE_LEGEND if (shown["state"] != "fp32").any() else "")
                  + ("\n" + _KEPT_LEGEND if shown["kept_layers"].any() else ""), style="dim")
    best = result.workloads[id(result.best.policy)]
    choice = result.state_choice
    console.print(f"host state {best.state.name}: {result.best.memory.host_bytes_per_param:.2f} B/param, "
                  f"host {result.best.memory.host_total_gib():.1f} GiB"
                  + (f"; chosen by --state auto: {choice.reason}" if choice else ""))
    if best.state_update_rate_needs_saying:
        console.print(best.state_update_rate_note)
    console.print(f"wrote policy {out} and ranked table {ranked}")


def ranked_view(rows: pd.DataFrame) -> Table:
    """The ranked candidates as a table of at most 80 columns (the CSV holds every field in full); the tile and
    host-state columns only where some row tiles its layers or keeps compact state."""
    tiled = bool(rows["seq_tile_tokens"].any())
    compact = bool((rows["state"] != "fp32").any())
    view = Table(title="Best policies", box=box.SIMPLE_HEAD, pad_edge=False, padding=0)
    for col in ("#", "step s", "ktok/s", "limit", "GiB", "held", "route", "ch/pf", "act", *(("tile",) if tiled else ()),
                *(("state",) if compact else ()), "mb×acc", "upd", "thr"):
        view.add_column(col, justify="left" if col in ("limit", "route", "act", "upd") else "right", no_wrap=True)
    for row in rows.itertuples():
        step = f"{_seconds(row.model_step_s)}*" if pd.isna(row.sim_step_s) else f"{_seconds(row.sim_step_s)} "
        tile = (_tokens(row.seq_tile_tokens) if row.seq_tile_tokens else "-",) if tiled else ()
        state = (row.state,) if compact else ()
        view.add_row(str(row.rank), step, f"{row.tokens_per_s / 1e3:,.1f}", row.limiter, f"{row.gpu_peak_gib:.1f}",
                     str(row.gpu_state_units), f"{_ROUTE[row.param_route]}/{_ROUTE[row.grad_route]}",
                     f"{row.chunks_per_layer}/{row.prefetch_depth}", _activation(row), *tile, *state,
                     f"{row.micro_batch}×{row.accumulation}", _SCHEDULE[row.update_schedule], str(row.adam_threads))
    return view


def _activation(row) -> str:
    """The activation column: its short name, with the kept layers of a recompute policy (``rec+22``)."""
    return _ACTIVATION[row.activation] + (f"+{row.kept_layers}" if row.kept_layers else "")


def _seconds(s: float) -> str:
    """Four significant digits: 8.187, 25.17, 251.7."""
    return f"{s:.1f}" if s >= 100 else f"{s:.2f}" if s >= 10 else f"{s:.3f}"


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)
