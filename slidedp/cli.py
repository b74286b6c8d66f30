"""Command-line entry point: simulate, tune, sweep, report, train, calibrate and validate.

Each command lives in its own module under ``slidedp.commands``, imported only when it runs.

Every user mistake ends as one ``slidedp: error: ...`` line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence

from slidedp.arg_types import non_negative_int, positive_float, positive_int
from slidedp.errors import SlideDPError
from slidedp.runtime.shared_dir import LAUNCHER_PID_ENV
from slidedp.state_choice import state_arg


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise SlideDPError(message)


def add_problem_args(p: argparse.ArgumentParser, batch_default: int | None = 32) -> None:
    """Arguments that define the training problem, shared by simulate, tune, sweep and train."""
    p.add_argument("--model", default="qwen3-14b", help="preset name or path to a HF config.json (default qwen3-14b)")
    p.add_argument("--hardware", default="h100-sxm-x4",
                   help="preset name or profile YAML/JSON (default h100-sxm-x4)")
    p.add_argument("--gpus", type=positive_int, help="use this many of the profile's GPUs")
    p.add_argument("--hosts", type=positive_int, default=1,
                   help="identical hosts of the profile running data parallel (needs its network section, e.g. "
                        "h100-sxm-x8-ib); --batch counts every host's sequences (default 1)")
    p.add_argument("--seq", type=positive_int, default=4096, help="sequence length in tokens (default 4096)")
    p.add_argument("--batch", type=positive_int, default=batch_default,
                   help="global batch in sequences per optimizer step")
    p.add_argument("--gpu-budget", type=positive_float, metavar="GIB",
                   help="GPU memory budget per GPU in GiB (default: 92%% of the GPU's memory to plan slidedp; all "
                        "of it for a peer's or a sweep's fit)")
    p.add_argument("--host-limit", type=positive_float, metavar="GIB",
                   help="host memory limit in GiB (default: 90%% of the host's memory to plan slidedp; all of it for "
                        "a peer's or a sweep's fit)")


def add_span_arg(p: argparse.ArgumentParser) -> None:
    """Packed instruction data through the varlen kernel: its attention is priced by the examples' lengths."""
    p.add_argument("--attention-span", type=positive_float, metavar="TOKENS",
                   help="packed rows (chat/instruction data): price attention for examples of this token-weighted "
                        "mean length, sum(L^2)/sum(L); slidedp train prints it for its data (default: whole rows)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="slidedp", description="Simulate, tune and run host-resident layer-streaming training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sim = sub.add_parser("simulate", help="predict step time, throughput, bottleneck and exposure of one policy")
    add_problem_args(sim)
    sim.add_argument("--policy", help="policy YAML (default: sharded routes, recompute, micro-batch 1)")
    sim.add_argument("--system", default="slidedp", metavar="NAME",
                     help="slidedp (default) or a peer: " + ", ".join(_peer_names()))
    sim.add_argument("--state", type=state_arg, metavar="MODE",
                     help="host optimizer state precision: fp32 (exact), a compact mode (" + _state_names()
                     + ") or auto: simulate each and pick by the rule in slidedp.state_choice (default: the "
                     "policy's, fp32 unless it says otherwise)")
    sim.add_argument("--peers", action="store_true",
                     help="also print the host bytes per parameter each peer system needs for this model")
    sim.add_argument("--trace", help="write the simulated trace (.json for Perfetto, .csv or .parquet)")
    add_span_arg(sim)
    sim.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")
    sim.add_argument("--out", help="write a run directory (trace, exposure, summary, policy, hardware) here")
    sim.set_defaults(func=_command("simulate", "run_simulate"))

    tune = sub.add_parser("tune", help="search policies under a memory budget and write the best as YAML")
    add_problem_args(tune, batch_default=None)  # so that --batch beside --tokens-per-step is seen (default: 32)
    tune.add_argument("--tokens-per-step", type=positive_int,
                      help="target tokens per optimizer step, instead of --batch (default batch 32)")
    tune.add_argument("--chunks", type=positive_int, nargs="+", help="chunks per layer to try (default 1 2 4 8 16)")
    tune.add_argument("--no-clip", action="store_true",
                      help="training will not clip the global gradient norm (allows the as_ready schedule)")
    tune.add_argument("--no-gpu-state", action="store_true",
                      help="keep all optimizer state on the host (do not try policy.gpu_state_units)")
    tune.add_argument("--no-kept-layers", action="store_true",
                      help="recompute every layer under activation recompute (do not try policy.kept_layers)")
    tune.add_argument("--seq-tiles", type=non_negative_int, nargs="+", metavar="TOKENS",
                      help="sequence tiles (policy.seq_tile_tokens) to try when no untiled policy fits "
                           "(default 4096, 8192, ... below a micro-batch's tokens; 0: never tile)")
    tune.add_argument("--state", type=state_arg, default="fp32", metavar="MODE",
                      help="host optimizer state precision: fp32 (exact, default), a compact mode (" + _state_names()
                      + ") or auto: let the tuner choose (exact unless it does not fit or a compact mode is "
                      "predicted >10%% faster; see slidedp.state_choice)")
    add_span_arg(tune)
    tune.add_argument("--top-k", type=positive_int, default=6, help="candidates refined with the simulator (default 6)")
    tune.add_argument("--out", default="policy.yaml", help="where to write the winning policy (default policy.yaml)")
    tune.add_argument("--table", help="ranked table CSV (default: <out>_ranked.csv)")
    tune.add_argument("--show", type=positive_int, default=12, help="rows of the ranked table to print")
    tune.set_defaults(func=_command("tune", "run_tune"))

    sweep = sub.add_parser("sweep", help="simulate a grid of batch, sequence length, GPU count and policy")
    add_problem_args(sweep, batch_default=None)
    sweep.set_defaults(seq=None)  # so that --seq beside --seqs is seen, not silently dropped
    sweep.add_argument("--seqs", type=positive_int, nargs="+", help="sequence lengths (default: --seq)")
    sweep.add_argument("--batches", type=positive_int, nargs="+",
                       help="global batches in sequences (default: --batch, else 4 8 16 32 64)")
    sweep.add_argument("--gpu-counts", type=positive_int, nargs="+", help="GPU counts (default: 1, 2, 4... up "
                       "to the profile's)")
    sweep.add_argument("--policies", nargs="+", default=["sharded", "replicated"],
                       help="policy presets (sharded, replicated, sharded-as-ready, zero-offload-like) or YAML files")
    sweep.add_argument("--systems", nargs="+", default=["slidedp"], metavar="NAME",
                       help="systems to sweep: slidedp (with each of --policies) and/or peers: "
                       + ", ".join(_peer_names()))
    sweep.add_argument("--state", type=state_arg, nargs="+", default=["fp32"], metavar="MODE",
                       help="host optimizer state precisions, one row each: fp32 (exact, default), compact modes ("
                       + _state_names() + ") and/or auto (per point, the mode slidedp.state_choice picks)")
    sweep.add_argument("--analytical", action="store_true", help="use the analytical model only (fast; slidedp only)")
    sweep.add_argument("--out", default="sweep.csv", help="tidy table (.csv or .parquet; default sweep.csv)")
    sweep.set_defaults(func=_command("sweep", "run_sweep_command"))

    report = sub.add_parser("report", help="plots and a one-page summary of a run directory or trace file")
    report.add_argument("run", help="run directory (slidedp simulate --out) or a trace file")
    report.add_argument("--sweep", help="sweep table from slidedp sweep, for the throughput plot")
    report.add_argument("--validation", help="CSV with label, predicted_s, measured_s for the y=x plot")
    report.add_argument("--out", default="report", help="output directory (default ./report)")
    report.set_defaults(func=_command("report", "run_report"))

    train = sub.add_parser("train", help="full-parameter training with host-resident layer streaming")
    from slidedp.commands.train_args import add_train_args

    add_train_args(train)
    train.set_defaults(func=_command("train", "run_train"))

    cal = sub.add_parser("calibrate", help="measure this machine (or refit from runs) into a hardware profile")
    cal.add_argument("--quick", action="store_true",
                     help="small sizes: about 15 s on a 2-core machine; --model adds about a minute "
                          "there for an 8B-wide layer")
    cal.add_argument("--base", default="h200-x1", help="profile whose unmeasured fields are kept (default h200-x1)")
    cal.add_argument("--from-run", nargs="+", metavar="RUN", help="refit from these run directories instead")
    cal.add_argument("--model", nargs="+", help="time one decoder layer (forward and backward) of each model (preset "
                     "or config.json) vs tokens and sequence length, and fit the GPU compute model to all of them")
    cal.add_argument("--host-only", action="store_true",
                     help="measure only this host's CPU (update rates of every host-state mode, the peers' CPU "
                          "AdamW where installed, copy and cast) and keep the GPU, PCIe and contention fields of "
                          "--base: about a minute, on the machine that will train, before tuning")
    cal.add_argument("--out", default="profile.yaml", help="profile to write (default profile.yaml)")
    cal.set_defaults(func=_command("calibrate", "run_calibrate"))

    clean = sub.add_parser("clean", help="list (and remove) shared host state that killed runs left in /dev/shm")
    clean.add_argument("--remove", action="store_true", help="delete the listed directories")
    clean.set_defaults(func=_command("clean", "run_clean"))

    val = sub.add_parser("validate", help="predicted vs measured step time of run directories")
    val.add_argument("runs", nargs="+", help="run directories")
    val.add_argument("--hardware", default="h200-x1", help="profile to predict with (default h200-x1)")
    val.add_argument("--out", help="write the table as CSV (for slidedp report --validation)")
    val.set_defaults(func=_command("validate", "run_validate"))
    return parser


def _state_names() -> str:
    from slidedp.state_precision import STATE_CHOICES

    return ", ".join(s.name for s in STATE_CHOICES[1:])


def _peer_names() -> list[str]:
    from slidedp.peers.systems import SYSTEMS

    return list(SYSTEMS)


def _command(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """Import a command's module only when it runs, so `slidedp --help` and errors stay fast."""

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"slidedp.commands.{module}"), function)(args)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and "WORLD_SIZE" in os.environ and "SLIDEDP_RANK_ARGV" in os.environ:
        argv = json.loads(os.environ["SLIDEDP_RANK_ARGV"])  # a data-parallel rank started by slidedp train
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        return args.func(args)
    except SlideDPError as exc:
        print(f"slidedp: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if LAUNCHER_PID_ENV not in os.environ:  # a rank: its launcher says it once for every rank
            print("slidedp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
