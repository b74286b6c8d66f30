"""``slidedp train``: the streaming runtime behind a progress bar."""

from __future__ import annotations

import argparse
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
    if args.policy:
        policy = Policy.load(args.policy)
        if args.batch is not None and args.batch != policy.sequences_per_rank():
            raise SlideDPError(f"--batch {args.batch} disagrees with the policy's micro_batch x accumulation = "
                               f"{policy.sequences_per_rank()}")
    else:
        policy = default_policy(args.batch or 1, 1)
    if hw.num_gpus != 1:
        hw = hw.with_gpus(1)
    optim = OptimConfig(lr=args.lr, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm or None,
                        warmup_steps=args.warmup, total_steps=args.total_steps or args.steps,
                        min_lr_ratio=args.min_lr_ratio)
    return TrainSpec(model=args.model, data=args.data, policy=policy, steps=args.steps, seq=args.seq,
                     out=Path(args.out), hardware=hw, optim=optim, tokenizer=args.tokenizer, device=args.device,
                     dtype=args.dtype, seed=args.seed, resume=args.resume, save_every=args.save_every,
                     export_hf=args.export_hf, gpu_budget_gib=args.gpu_budget, host_limit_gib=args.host_limit,
                     final_checkpoint=not args.no_checkpoint)


def run_train(args: argparse.Namespace) -> int:
    from slidedp.runtime.trainer import Trainer

    console = Console(stderr=True)
    spec = build_train_spec(args)
    progress = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), console=console, disable=not console.is_terminal)

    def on_step(done: int, stats, seconds: float) -> None:
        info = f"loss {stats.loss:.4f}  {stats.tokens / seconds:,.0f} tok/s  {seconds:.2f} s/step"
        progress.update(task, completed=done, info=info)
        if not console.is_terminal:
            console.print(f"step {done}/{spec.steps} {info}")

    trainer = Trainer(spec, on_step=on_step, log=console.print)
    with progress:
        task = progress.add_task("train", total=spec.steps, info="")
        summary = trainer.run()
    console.print(f"done: {summary['steps']} steps, median {summary['step_time_s']:.3f} s/step, "
                  f"{summary['tokens_per_s']:,.0f} tokens/s, final loss {summary['final_loss']:.4f}; "
                  f"run directory {spec.out}")
    return 0
