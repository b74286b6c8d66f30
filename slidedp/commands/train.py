"""``slidedp train``: the streaming runtime behind a progress bar."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from slidedp.errors import SlideDPError
from slidedp.policy import Policy, default_policy
from slidedp.problem import resolve_hardware


def build_train_spec(args: argparse.Namespace):
    from slidedp.runtime.optim import OptimConfig
    from slidedp.runtime.trainer import TrainSpec

    hw = resolve_hardware(args.hardware, None)
    ranks = args.nproc
    if args.policy:
        policy = Policy.load(args.policy)
        if args.batch is not None and args.batch != policy.sequences_per_rank() * ranks:
            raise SlideDPError(f"--batch {args.batch} disagrees with the policy's micro_batch x accumulation x ranks "
                               f"= {policy.sequences_per_rank() * ranks}")
    else:
        policy = default_policy(args.batch or ranks, ranks)
    if hw.num_gpus != ranks:
        hw = hw.with_gpus(ranks)
    optim = OptimConfig(lr=args.lr, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm or None,
                        warmup_steps=args.warmup, total_steps=args.total_steps or args.steps,
                        min_lr_ratio=args.min_lr_ratio)
    world = int(os.environ.get("WORLD_SIZE", args.nproc))
    if world != args.nproc:
        raise SlideDPError(f"launched with WORLD_SIZE={world} but --nproc {args.nproc}")
    return TrainSpec(model=args.model, data=args.data, policy=policy, steps=args.steps, seq=args.seq,
                     out=Path(args.out), hardware=hw, optim=optim, tokenizer=args.tokenizer, device=args.device,
                     dtype=args.dtype, seed=args.seed, resume=args.resume, save_every=args.save_every,
                     export_hf=args.export_hf, gpu_budget_gib=args.gpu_budget, host_limit_gib=args.host_limit,
                     final_checkpoint=not args.no_checkpoint, world=world, on_nonfinite=args.on_nonfinite)


RANK_ARGV_ENV = "SLIDEDP_RANK_ARGV"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_ranks(args: argparse.Namespace, spec) -> int:
    """Re-run this command under torchrun, one process per rank; any rank's failure ends them all."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(_free_port()), "--max_restarts", "0", "-m", "slidedp.cli"]
    # The rank processes get this command line through the environment: torchrun's own parser would
    # otherwise try to read options such as --nproc.
    proc = subprocess.run(cmd, env={**os.environ, RANK_ARGV_ENV: json.dumps(args.argv)})
    if proc.returncode != 0:
        ckpt = spec.out / "checkpoint"
        state = f"the last complete checkpoint {ckpt} is intact" if ckpt.exists() else "no checkpoint was written"
        print(f"slidedp: error: a rank failed (exit code {proc.returncode}); all ranks stopped; {state}",
              file=sys.stderr)
        return 1
    return 0


def run_train(args: argparse.Namespace) -> int:
    from slidedp.runtime.trainer import Trainer

    console = Console(stderr=True)
    spec = build_train_spec(args)
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        Trainer(spec, log=console.print)  # validate every input here, before any rank starts
        return launch_ranks(args, spec)
    progress = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), console=console, disable=not console.is_terminal)

    def on_step(done: int, stats, seconds: float) -> None:
        info = f"loss {stats.loss:.4f}  {stats.tokens * spec.world / seconds:,.0f} tok/s  {seconds:.2f} s/step"
        progress.update(task, completed=done, info=info)
        if not console.is_terminal:
            console.print(f"step {done}/{spec.steps} {info}")

    trainer = Trainer(spec, on_step=on_step, log=console.print)
    with progress:
        task = progress.add_task("train", total=spec.steps, info="")
        summary = trainer.run()
    if spec.world > 1 and int(os.environ.get("RANK", "0")) != 0:
        return 0
    console.print(f"done: {summary.steps} steps, median {summary.step_time_s:.3f} s/step, "
                  f"{summary.tokens_per_s:,.0f} tokens/s, final loss {summary.final_loss:.4f}; "
                  f"run directory {spec.out}")
    return 0
