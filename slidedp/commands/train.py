"""``slidedp train``: the streaming runtime behind a progress bar."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from slidedp.commands.train_args import build_train_spec
from slidedp.errors import Interrupted, OutOfGpuMemory, SlideDPError, TrainingStopped

RANK_ARGV_ENV = "SLIDEDP_RANK_ARGV"
# A private file in the run directory where a rank that stops on purpose (TrainingStopped) or runs out of GPU
# memory (OutOfGpuMemory) writes its exit code and message: torchrun reports any failed rank as exit code 1, so
# this is how the launcher keeps the documented code (3 for --on-nonfinite stop, 4 out of GPU memory) and
# prints the reason once instead of once per rank.
EXIT_FILE_ENV = "SLIDEDP_EXIT_FILE"


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_SECONDS = 20  # after forwarding a signal: how long the ranks get to stop before they are killed


def launch_ranks(args: argparse.Namespace, spec) -> int:
    """Re-run this command under torchrun, one process per rank; any rank's failure ends them all.

    The launcher owns the run's lifetime: it holds the run directory's lock, names the shared state (a random
    run id the ranks inherit), runs torchrun in its own session so that a signal meant for the run reaches
    every rank through it (SIGINT and SIGTERM are forwarded, stragglers killed after a grace period), makes
    torchrun die with it, and removes the shared state however the ranks ended.

    Over several hosts (--nnodes) this command runs once on every host: each launcher starts its host's ranks
    through torchrun's c10d rendezvous at --rdzv-endpoint, names and removes its own host's state (the
    directory carries the node rank), and locks the run directory for its node only. With --max-restarts 0 a
    rank that dies on any host fails its collectives on the others, so every host's torchrun ends non-zero."""
    from slidedp.runtime.lifetime import RunLock, die_with_parent
    from slidedp.runtime.shared_dir import (
        LAUNCHER_PID_ENV,
        NODE_RANK_ENV,
        RUN_ID_ENV,
        SharedDir,
        new_run_id,
        stale_states,
        state_dir,
    )

    multi = args.nnodes > 1
    lock = RunLock(spec.out, node=args.node_rank if multi else None)
    stale = stale_states()
    if stale:
        print(f"slidedp: note: {len(stale)} state director{'y' if len(stale) == 1 else 'ies'} of killed runs in "
              f"/dev/shm ({sum(s.bytes for s in stale) / 2**30:.1f} GiB): `slidedp clean --remove` frees them",
              file=sys.stderr)
    run_id = new_run_id()
    exit_fd, exit_file = tempfile.mkstemp(prefix=".slidedp-exit-", dir=spec.out)
    os.close(exit_fd)
    # --standalone: torchrun binds its rendezvous store on port 0 itself and hands the ranks that bound port
    # (a port picked here and released before torchrun binds it could be taken by another process meanwhile).
    if multi:  # torchrun's own multi-node rendezvous; it places this host (GROUP_RANK) in join order
        where = ["--nnodes", str(args.nnodes), "--node-rank", str(args.node_rank), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", args.rdzv_endpoint]
    else:
        where = ["--standalone", "--local-addr", "127.0.0.1"]
    cmd = [sys.executable, "-m", "slidedp.commands.rank_launcher", *where,  # torchrun, no traceback of its own
           "--nproc_per_node", str(args.nproc), "--max_restarts", "0", "-m", "slidedp.cli"]
    # The rank processes get this command line through the environment: torchrun's own parser would
    # otherwise try to read options such as --nproc.
    # OMP_NUM_THREADS=1 for several ranks a host unless the user set it: torchrun's own rule, without its banner.
    env = {**({"OMP_NUM_THREADS": "1"} if args.nproc > 1 else {}), **os.environ, RANK_ARGV_ENV: json.dumps(args.argv),
           RUN_ID_ENV: run_id, LAUNCHER_PID_ENV: str(os.getpid()),
           EXIT_FILE_ENV: exit_file, **({NODE_RANK_ENV: str(args.node_rank)} if multi else {})}
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
        SharedDir(state_dir(run_id, node=args.node_rank if multi else None)).remove()
        stopped = _read_stop(Path(exit_file))
        Path(exit_file).unlink(missing_ok=True)
        lock.release()
    if received:
        sig = signal.Signals(received[0])
        print(f"slidedp: interrupted ({sig.name}); every rank stopped and the shared state was removed; "
              f"{checkpoint_state(spec.out)}", file=sys.stderr)
        return 128 + sig
    if code != 0:
        state = checkpoint_state(spec.out)
        if stopped is not None:  # a rank stopped the run on purpose: its code and reason, once
            print(f"slidedp: error: {stopped[1]}", file=sys.stderr)
            return stopped[0]
        where = f" (node {args.node_rank}: a rank here or on another host)" if multi else ""
        print(f"slidedp: error: a rank failed{where} (exit code {code}); all ranks stopped; {state}", file=sys.stderr)
        return 1
    return 0


def check_rank_placement(nproc: int, ranks_per_gpu: int, device: str) -> None:
    """Refuse, before any rank starts, a run whose ranks do not each get a GPU: rank r computes on GPU
    r // ranks_per_gpu, so ``nproc`` may not exceed the visible GPUs times ``ranks_per_gpu``."""
    import torch

    if nproc == 1 and ranks_per_gpu == 1:
        return
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if not cuda:
        if ranks_per_gpu > 1:
            raise SlideDPError("--ranks-per-gpu needs a CUDA device (CPU ranks share the cores already)")
        return
    if device.startswith("cuda:"):
        raise SlideDPError(f"--device {device} names one GPU, but --nproc {nproc} places each rank itself: "
                           "use --device cuda")
    visible = torch.cuda.device_count()
    if nproc > visible * ranks_per_gpu:
        where = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={where})" if where is not None else ""
        raise SlideDPError(f"--nproc {nproc} needs {-(-nproc // ranks_per_gpu)} GPU(s) at {ranks_per_gpu} rank(s) "
                           f"per GPU, but {visible} {'is' if visible == 1 else 'are'} visible{shown}: lower --nproc, "
                           f"add --ranks-per-gpu {-(-nproc // max(visible, 1))}, or use --device cpu")
    if nproc % ranks_per_gpu:
        raise SlideDPError(f"--nproc {nproc} is not a multiple of --ranks-per-gpu {ranks_per_gpu}")


def checkpoint_state(out: Path) -> str:
    """What a stopped run leaves to resume from, for its last line: the latest complete checkpoint and its step,
    or that none was written (a checkpoint directory only appears complete: checkpoint_files saves by rename)."""
    from slidedp.runtime.checkpoint_history import checkpoint_step, kept, latest

    ckpt = latest(out)
    if not ckpt.exists():  # a resume from an earlier kept checkpoint moved the latest aside: the newest kept one
        older = kept(out)
        if not older:
            return "no checkpoint was written"
        ckpt = older[-1][1]
    step = checkpoint_step(ckpt)
    return f"the last complete checkpoint {ckpt}{'' if step is None else f' (step {step})'} is intact"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_between_steps(trainer) -> dict[int, object]:
    """SIGINT and SIGTERM to a one-process run: the first asks the trainer to stop after the step in progress
    (errors.Interrupted where its state and logs agree: an exception at an arbitrary bytecode, Ctrl-C's default,
    can leave a lock held that the run's cleanup then waits on), a second stops it at once. SIGTERM was a silent
    exit 143 without cleanup. Returns the handlers it replaced, for the caller to restore."""
    requested: list[int] = []

    def on_signal(signum, _frame) -> None:
        if requested:
            raise Interrupted(signum)
        requested.append(signum)
        print(f"slidedp: {signal.Signals(signum).name}: stopping after this step (again: at once)", file=sys.stderr,
              flush=True)

    trainer.stop_requested = lambda: requested[0] if requested else None
    # a signal the process was started ignoring (nohup, a background job's SIGINT) stays ignored, as Python does
    return {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}


def _read_stop(path: Path) -> tuple[int, str] | None:
    """The first record a rank wrote to the exit file: (exit code, message), or None."""
    try:
        first = path.read_text(errors="replace").split("\n", 1)[0]
        code, message = first.split("\t", 1)
        return int(code), message[:500]
    except (OSError, ValueError):
        return None


def _record_stop(exc: SlideDPError) -> bool:
    """A rank's record of why it stopped, for its launcher (see EXIT_FILE_ENV); False where there is none."""
    path = os.environ.get(EXIT_FILE_ENV)
    if not path:
        return False
    try:  # the launcher created it; never create or follow anything here
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{exc.exit_code}\t{' '.join(str(exc).split())}\n")
    return True


def run_train(args: argparse.Namespace) -> int:
    import torch

    from slidedp.runtime.device import prefer_expandable_segments
    from slidedp.runtime.shared_dir import LAUNCHER_PID_ENV
    from slidedp.runtime.trainer import Trainer

    prefer_expandable_segments()  # before any CUDA allocation, in the launcher and so in every rank
    console = Console(stderr=True)
    if "WORLD_SIZE" not in os.environ:
        check_rank_placement(args.nproc, args.ranks_per_gpu, args.device)
    # Under a launcher, the launcher prints the start-up lines (settings, data, resume) once, as it checks every
    # input before any rank starts; the ranks check the same silently, and rank 0 alone prints the run's lines.
    # (Ranks that torchrun started without this launcher: rank 0 prints them all.)
    rank = int(os.environ["RANK"]) if "WORLD_SIZE" in os.environ else None
    start_log = _silent if rank is not None and (LAUNCHER_PID_ENV in os.environ or rank != 0) else console.print
    spec = build_train_spec(args, log=start_log)
    if (args.nproc > 1 or args.nnodes > 1) and rank is None:
        Trainer(spec, log=console.print)
        return launch_ranks(args, spec)
    if rank is not None:  # a rank: it must not outlive torchrun (and so the launcher)
        from slidedp.runtime.lifetime import die_with_parent

        die_with_parent()
    trainer = Trainer(spec, log=start_log)  # every input checked; nothing written yet
    if rank == 0:
        trainer.log = console.print
    start, target = trainer.start_step, trainer.start_step + spec.steps
    progress = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                        disable=not console.is_terminal)
    task = progress.add_task("train", total=target, completed=start, info="")
    trainer.on_step = step_reporter(progress, task, console, spec.world, target)
    lock, replaced = None, {}
    if "WORLD_SIZE" not in os.environ:  # one process: it holds the run directory (a launcher holds it for ranks)
        from slidedp.runtime.lifetime import RunLock

        lock = RunLock(spec.out)
        if threading.current_thread() is threading.main_thread():  # where Python lets a handler be set
            replaced = stop_between_steps(trainer)
    try:
        with progress:
            summary = trainer.run()
    except KeyboardInterrupt as caught:
        if lock is None:  # a rank: its launcher says it once for every rank
            raise
        sig = signal.Signals(caught.signum if isinstance(caught, Interrupted) else signal.SIGINT)
        print(f"slidedp: interrupted ({sig.name}); {checkpoint_state(spec.out)}", file=sys.stderr)
        return 128 + sig
    except (torch.OutOfMemoryError, TrainingStopped) as caught:
        # A rank's stop on purpose or out of GPU memory: its launcher reports the reason once, with its code
        # (torchrun turns every failed rank into exit code 1).
        exc = OutOfGpuMemory(trainer.out_of_memory_message(caught)) if isinstance(caught, torch.OutOfMemoryError) \
            else caught
        if "WORLD_SIZE" in os.environ and _record_stop(exc):
            return exc.exit_code
        raise exc from None
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)
        if lock is not None:
            lock.release()
    if spec.world > 1 and int(os.environ.get("RANK", "0")) != 0:
        return 0
    console.print(run_outcome(summary, spec))
    return 0


def _silent(_line: str) -> None:
    """The log of a rank whose start-up lines its launcher printed (and of ranks past 0 throughout)."""


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


# Beyond this prediction error the closing lines suggest refitting the profile from the run (2026-12-06: a lent
# host ran the compact update at 0.39x the shipped profile's rate; the refit then predicted two other models
# within 10%).
REFIT_HINT_ERROR = 0.10


def _update_repriced(run_dir: Path, hardware, measured_s: float) -> str | None:
    """One closing line: the step predicted again on ``hardware`` (the profile the run was predicted with) with
    the CPU update as fast as it ran in this run, so a miss reads as the host CPU's or the rest of the model's.
    None where the run had no CPU update or cannot be read back (the line is a diagnosis; its absence must not
    fail a finished run)."""
    from slidedp.calibration.from_run import load_record, reprice_update

    try:
        repriced = reprice_update(load_record(run_dir), hardware)
    except (SlideDPError, OSError, ValueError, KeyError):
        return None
    if repriced is None:
        return None
    error = repriced.predicted_s / measured_s - 1
    return (f"the CPU update ran at {repriced.rate_gparams_per_s:.2f} G params/s in these steps (the profile: "
            f"{repriced.profile_gparams_per_s:.2f}); at that rate the simulator predicts {repriced.predicted_s:.3f} "
            f"s/step ({error:+.0%})")


def run_outcome(summary, spec) -> str:
    """The closing lines: throughput, loss, eval, and the simulator's prediction beside the measurement."""
    lines = [f"done: {summary.steps} steps (global step {summary.global_step}), median {summary.step_time_s:.3f} "
             f"s/step, {summary.tokens_per_s:,.0f} tokens/s on {summary.device}, final loss {summary.final_loss:.4f}"]
    if summary.eval_loss is not None:
        lines.append(f"eval: loss {summary.eval_loss:.4f}, perplexity {summary.eval_perplexity:.2f}")
    if summary.predicted_step_time_s:
        error = summary.predicted_step_time_s / summary.step_time_s - 1
        tuned = f" (the tuner said {summary.tuner_step_time_s:.3f} s)" if summary.tuner_step_time_s else ""
        on_gpu, shared = str(summary.device).startswith("cuda"), spec.ranks_per_gpu
        if on_gpu and shared > 1:
            # The profile prices one GPU per rank; K ranks time-sharing one GPU run its compute K times over and
            # their collectives over gloo, which no profile describes, so an error figure would mislead.
            lines.append(f"predicted {summary.predicted_step_time_s:.3f} s/step for {spec.hardware.name}{tuned} "
                         f"(one GPU per rank); here {shared} ranks share each GPU, so this run's "
                         f"{summary.step_time_s:.3f} s/step is not comparable")
        elif on_gpu:
            lines.append(f"predicted {summary.predicted_step_time_s:.3f} s/step for {spec.hardware.name}{tuned}, "
                         f"measured {summary.step_time_s:.3f} s/step ({error:+.0%})")
            if abs(error) > REFIT_HINT_ERROR:
                from slidedp.report.rundir import HARDWARE_FILE

                out = Path(spec.out)
                q = shlex.quote
                repriced = _update_repriced(out, spec.hardware, summary.step_time_s)
                if repriced:
                    lines.append(repriced)
                lines.append(f"to predict this machine, refit the profile from this run: slidedp calibrate "
                             f"--from-run {q(str(out))} --base {q(str(out / HARDWARE_FILE))} "
                             f"--out {q(str(out / 'refit.yaml'))}")
                if getattr(summary, "limiter", None) == "cpu":  # lent hosts of one type differ 2x in CPU rates
                    lines.append(f"the host's CPU limited this step; before tuning for another model, measure "
                                 f"it: slidedp calibrate --host-only --base {q(str(out / HARDWARE_FILE))} "
                                 f"--out host.yaml")
        else:
            lines.append(f"predicted {summary.predicted_step_time_s:.3f} s/step for {spec.hardware.name}{tuned}; "
                         f"this run was on the CPU, so its {summary.step_time_s:.3f} s/step is not comparable")
    lines.append(f"run directory {spec.out}")
    return "\n".join(lines)
