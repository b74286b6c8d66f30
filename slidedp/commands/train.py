"""``slidedp train``: the streaming runtime behind a progress bar."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from slidedp.commands.train_args import build_train_spec

RANK_ARGV_ENV = "SLIDEDP_RANK_ARGV"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_SECONDS = 20  # after forwarding a signal: how long the ranks get to stop before they are killed


def launch_ranks(args: argparse.Namespace, spec) -> int:
    """Re-run this command under torchrun, one process per rank; any rank's failure ends them all.

    The launcher owns the run's lifetime: it holds the run directory's lock, names the shared state (a random
    run id the ranks inherit), runs torchrun in its own session so that a signal meant for the run reaches
    every rank through it (SIGINT and SIGTERM are forwarded, stragglers killed after a grace period), makes
    torchrun die with it, and removes the shared state however the ranks ended."""
    from slidedp.runtime.lifetime import RunLock, die_with_parent
    from slidedp.runtime.shared_dir import LAUNCHER_PID_ENV, RUN_ID_ENV, SharedDir, new_run_id, stale_states, state_dir

    lock = RunLock(spec.out)
    stale = stale_states()
    if stale:
        print(f"slidedp: note: {len(stale)} state director{'y' if len(stale) == 1 else 'ies'} of killed runs in "
              f"/dev/shm ({sum(s.bytes for s in stale) / 2**30:.1f} GiB): `slidedp clean --remove` frees them",
              file=sys.stderr)
    run_id = new_run_id()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(_free_port()), "--max_restarts", "0", "-m", "slidedp.cli"]
    # The rank processes get this command line through the environment: torchrun's own parser would
    # otherwise try to read options such as --nproc.
    env = {**os.environ, RANK_ARGV_ENV: json.dumps(args.argv), RUN_ID_ENV: run_id, LAUNCHER_PID_ENV: str(os.getpid())}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    received: list[int] = []

    def forward(signum, _frame) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=GRACE_SECONDS)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # any rank still alive: torchrun's session, all of it
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        SharedDir(state_dir(run_id)).remove()
        lock.release()
    if received:
        print(f"slidedp: interrupted ({signal.Signals(received[0]).name}); every rank stopped and the shared state "
              f"was removed", file=sys.stderr)
        return 130
    if code != 0:
        ckpt = spec.out / "checkpoint"
        state = f"the last complete checkpoint {ckpt} is intact" if ckpt.exists() else "no checkpoint was written"
        stopped = 3 if code == 3 else 1  # --on-nonfinite stop ends every rank with 3: keep the documented code
        print(f"slidedp: error: a rank failed (exit code {code}); all ranks stopped; {state}", file=sys.stderr)
        return stopped
    return 0


def run_train(args: argparse.Namespace) -> int:
    from slidedp.runtime.trainer import Trainer

    console = Console(stderr=True)
    spec = build_train_spec(args, log=console.print)
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        Trainer(spec, log=console.print)  # validate every input here, before any rank starts
        return launch_ranks(args, spec)
    if "WORLD_SIZE" in os.environ:  # a rank: it must not outlive torchrun (and so the launcher)
        from slidedp.runtime.lifetime import die_with_parent

        die_with_parent()
    trainer = Trainer(spec, log=console.print)  # every input checked; nothing written yet
    start, target = trainer.start_step, trainer.start_step + spec.steps
    progress = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                        disable=not console.is_terminal)
    task = progress.add_task("train", total=target, completed=start, info="")
    trainer.on_step = step_reporter(progress, task, console, spec.world, target)
    lock = None
    if "WORLD_SIZE" not in os.environ:  # one process: it holds the run directory (a launcher holds it for ranks)
        from slidedp.runtime.lifetime import RunLock

        lock = RunLock(spec.out)
    try:
        with progress:
            summary = trainer.run()
    finally:
        if lock is not None:
            lock.release()
    if spec.world > 1 and int(os.environ.get("RANK", "0")) != 0:
        return 0
    console.print(run_outcome(summary, spec))
    return 0


def step_reporter(progress: Progress, task, console: Console, world: int, target: int):
    """The per-step callback: global step, loss, tokens/s, the step's exposed (GPU-idle) share and, through
    the bar's columns, elapsed time and ETA; one plain line per step when stderr is not a terminal."""
    from slidedp.exposure import exposure_from_trace
    from slidedp.trace import EXPOSURE_CATEGORIES

    def on_step(global_step: int, stats, seconds: float) -> None:
        exposure = exposure_from_trace(stats.trace)
        exposed = float(exposure[list(EXPOSURE_CATEGORIES)].sum(axis=1).mean()) if len(exposure) else 0.0
        info = (f"loss {stats.loss:.4f}  {stats.tokens * world / seconds:,.0f} tok/s  {seconds:.2f} s/step  "
                f"exposed {min(1.0, exposed / seconds):.0%}")
        progress.update(task, completed=global_step, info=info)
        if not console.is_terminal:
            console.print(f"step {global_step}/{target} {info}")

    return on_step


def run_outcome(summary, spec) -> str:
    """The closing lines: throughput, loss, eval, and the simulator's prediction beside the measurement."""
    lines = [f"done: {summary.steps} steps (global step {summary.global_step}), median {summary.step_time_s:.3f} "
             f"s/step, {summary.tokens_per_s:,.0f} tokens/s on {summary.device}, final loss {summary.final_loss:.4f}"]
    if summary.eval_loss is not None:
        lines.append(f"eval: loss {summary.eval_loss:.4f}, perplexity {summary.eval_perplexity:.2f}")
    if summary.predicted_step_time_s:
        error = summary.predicted_step_time_s / summary.step_time_s - 1
        tuned = f" (the tuner said {summary.tuner_step_time_s:.3f} s)" if summary.tuner_step_time_s else ""
        if str(summary.device).startswith("cuda"):
            lines.append(f"predicted {summary.predicted_step_time_s:.3f} s/step for {spec.hardware.name}{tuned}, "
                         f"measured {summary.step_time_s:.3f} s/step ({error:+.0%})")
        else:
            lines.append(f"predicted {summary.predicted_step_time_s:.3f} s/step for {spec.hardware.name}{tuned}; "
                         f"this run was on the CPU, so its {summary.step_time_s:.3f} s/step is not comparable")
    lines.append(f"run directory {spec.out}")
    return "\n".join(lines)
