"""``slidedp sweep``: simulate a grid of batch, sequence length, GPU count and policy into a tidy table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from slidedp.commands.progress import progress_callback
from slidedp.errors import SlideDPError
from slidedp.model_spec import load_model_spec
from slidedp.problem import resolve_hardware
from slidedp.sweep import resolve_named_policy, run_sweep


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
                          simulate_points=not args.analytical, progress=progress,
                          systems=getattr(args, "systems", None) or ["slidedp"],
                          states=tuple(dict.fromkeys(getattr(args, "state", None) or ["fp32"])),
                          hosts=getattr(args, "hosts", 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out, index=False) if out.suffix == ".parquet" else table.to_csv(out, index=False)
    Console().print(f"{len(table)} points written to {out}")
    Console().print(table[["gpus", "seq", "batch", "system", "policy", "state", "step_s", "tokens_per_s", "limiter",
                           "host_gib", "fits"]].to_string(index=False))
    derived = sorted(set(table.state[table.update_rate == "derived from DRAM bytes"])) \
        if "update_rate" in table else []
    if derived:
        Console().print(f"CPU update rates of {', '.join(derived)} state are DERIVED from the measured fp32 rate by "
                        f"DRAM bytes, not measured on {hw.name}")
    return 0
