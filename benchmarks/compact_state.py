"""Compact host optimizer state (#16) on the H200: update rate, step time, the 14B fit, and a fine-tune per mode.

Parts (each appends rows to <out>/results.jsonl and leaves its run directories under <out>/runs):
  rates     the CPU update of each state mode against thread count (G params/s, the calibration's machinery)
  steps     Qwen3-4B with every optimizer state on the host (gpu_state_units 0), seq 4096: step time per mode at
            batch 1/4/8 (tuned host-only policy with the mode applied)
  big       Qwen3-14B, full depth, seq 4096, batch 1/4/16 in one compact mode: step time, tokens/s, host RSS and
            GPU peak beside the simulator's prediction (from each run's summary.json)
  finetune  300 steps of a >= 0.5B model (Qwen3-0.6B shape, one seeded init) in each mode on real text found on
            the machine (--text, or 'auto': the Python standard library's source files), held-out loss every
            --eval-every steps; writes finetune_losses.png (train and held-out curves) and finetune.md

    python -m benchmarks.compact_state rates --out benchmarks/results/h200-compact
    python -m benchmarks.compact_state steps --out benchmarks/results/h200-compact
    python -m benchmarks.compact_state big --out benchmarks/results/h200-compact
    python -m benchmarks.compact_state finetune --out benchmarks/results/h200-compact

Every part runs on a CPU with a tiny model (--model config.json --device cpu and small --seq/--batches/--steps),
which is how tests/cli/test_benchmark_scripts.py checks that it works.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from benchmarks.common import append_jsonl, log, model_label, read_jsonl, train_run
from slidedp.state_precision import STATE_CHOICES, StatePrecision

MODES = [p.name for p in STATE_CHOICES]


def _policy(model: str, seq: int, batch: int, state: str, out: Path, tune: bool, hardware: str,
            threads: int | None = None, gpu_budget: float | None = None) -> Path:
    """A policy YAML for one run: the tuner's host-only choice (or the default policy) with ``state`` applied,
    and ``threads`` optimizer threads where given. A tuner that finds nothing (e.g. a memory model that does not
    know the state) falls back to the default."""
    from slidedp.policy import Policy, default_policy

    path = out / f"policy-b{batch}-{state}{'' if threads is None else f'-t{threads}'}.yaml"
    policy = None
    if tune:
        budget = "" if gpu_budget is None else f"-g{gpu_budget:g}"
        tuned = out / f"tuned-b{batch}-{state}{budget}.yaml"  # the mode decides the fit (Qwen3-14B: only compact)
        cmd = [sys.executable, "-m", "slidedp.cli", "tune", "--model", model, "--seq", str(seq), "--batch", str(batch),
               "--hardware", hardware, "--no-gpu-state", "--state", state, "--out", str(tuned)]
        if gpu_budget is not None:  # a profile of a bigger GPU than this one (h200-x1's host on an H100)
            cmd += ["--gpu-budget", str(gpu_budget)]
        if tuned.exists() or subprocess.run(cmd, check=False, capture_output=True).returncode == 0:
            policy = Policy.load(str(tuned))
        else:
            log(f"tune failed for batch {batch}: using the default policy")
    if policy is None:
        policy = default_policy(batch, 1)
    policy = policy.with_(gpu_state_units=0, state=StatePrecision.parse(state).name)
    (policy if threads is None else policy.with_(adam_threads=threads)).save(path)
    return path


def _run_row(part: str, model: str, seq: int, batch: int, state: str, out: Path, steps: int, device: str,
             tune: bool, hardware: str, threads: int | None = None, gpu_budget: float | None = None) -> dict:
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    policy = _policy(model, seq, batch, state, runs, tune, hardware, threads, gpu_budget)
    run_dir = runs / f"{part}-{model_label(model)}-b{batch}-{state}{'' if threads is None else f'-t{threads}'}"
    rc, summary = train_run(model, seq, policy, steps, run_dir, device=device, hardware=hardware,
                            extra=("--log", "none"))
    row = {"part": part, "model": model_label(model), "seq": seq, "batch": batch, "state": state, "rc": rc,
           "adam_threads": threads,
           "host_bytes_per_param": StatePrecision.parse(state).host_bytes_per_param(2)}
    if summary is not None:
        row.update(step_time_s=summary.step_time_s, tokens_per_s=summary.tokens_per_s,
                   predicted_step_time_s=summary.predicted_step_time_s, gpu_peak_gib=summary.gpu_peak_gib,
                   predicted_gpu_peak_gib=summary.predicted_gpu_peak_gib, host_rss_peak_gib=summary.host_rss_peak_gib,
                   measured_host_state_bytes_per_param=summary.host_state_bytes_per_param)
    append_jsonl(out / "results.jsonl", row)
    log(f"{part} {row['model']} batch {batch} {state}: " +
        (f"{row['step_time_s']:.3f} s/step" if "step_time_s" in row else f"exit {rc}"))
    return row


def part_rates(args: argparse.Namespace) -> None:
    import torch

    from slidedp.calibration.host_bench import _adam_update, compact_state_update
    from slidedp.calibration.measurements import median_time, torch_threads
    from slidedp.runtime.cpu_adam import fused_kernel
    from slidedp.runtime.host_state import host_buffer, placed_copy

    n = args.params
    for state in args.states:
        precision = StatePrecision.parse(state)
        # Pages first touched as the runtime touches them (all threads), or (--first-touch serial, exact mode)
        # the master's by one thread, as the exact rates of 2026-12-06 and before had it (torch.randn; their
        # moments and slot were zeroed and cast by all threads; the compact modes' always were).
        if precision.is_exact:
            with torch_threads(1 if args.first_touch == "serial" else None):
                p = placed_copy(torch.randn(n))
            mom, var = host_buffer(n, torch.float32), host_buffer(n, torch.float32)
            update = _adam_update(fused_kernel(), p, mom, var, placed_copy(torch.randn(n).bfloat16()))
        else:
            update = compact_state_update(precision, n)
        serial_exact = precision.is_exact and args.first_touch == "serial"
        for threads in args.threads:
            with torch_threads(threads):
                seconds = median_time(update, args.repeats)
            row = {"part": "rates", "state": precision.name, "threads": threads, "params": n,
                   "first_touch": "serial" if serial_exact else "parallel",
                   "gparams_per_s": n / seconds / 1e9, "ns_per_param": seconds / n * 1e9,
                   "dram_bytes_per_param": precision.update_dram_bytes_per_param(2)}
            append_jsonl(args.out / "results.jsonl", row)
            touch = " (master's pages touched by one thread)" if serial_exact else ""
            log(f"rates {precision.name} {threads} thread(s): {row['gparams_per_s']:.3f} G params/s{touch}")
        del update


def part_steps(args: argparse.Namespace) -> None:
    """Each batch x state (x optimizer thread count, where --adam-threads overrides the tuner's: whether leaving
    cores to the thread that issues GPU work and to the copies shortens the step, the in-step cost that
    host.step_update_factor prices)."""
    for batch in args.batches:
        for state in args.states:
            for threads in args.adam_threads or [None]:
                _run_row("steps", args.model, args.seq, batch, state, args.out, args.steps, args.device, args.tune,
                         args.hardware, threads, args.gpu_budget)


def part_big(args: argparse.Namespace) -> None:
    for batch in args.batches:
        _run_row("big", args.model, args.seq, batch, args.states[0], args.out, args.steps, args.device, args.tune,
                 args.hardware, gpu_budget=args.gpu_budget)


def real_text(spec: str, limit_mb: float, out: Path) -> tuple[Path, str]:
    """One text file of real text and a line saying what it is: ``spec`` is a file, or 'auto' for the Python
    standard library's .py files in name order (present on every machine that runs this), up to ``limit_mb``."""
    if spec != "auto":
        return Path(spec), f"file {spec}"
    root = Path(sysconfig.get_paths()["stdlib"])
    target = out / "stdlib_text.txt"
    budget = int(limit_mb * 2**20)
    used = 0
    with open(target, "w", encoding="utf-8") as fh:
        for path in sorted(root.rglob("*.py")):
            if "test" in path.parts or used >= budget:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            fh.write(text[:budget - used] + "\n")
            used += len(text)
    return target, f"Python {sys.version.split()[0]} standard library sources under {root} (tests excluded), " \
                   f"{min(used, budget) / 2**20:.1f} MB"


def part_finetune(args: argparse.Namespace) -> None:
    from slidedp.policy import default_policy

    text, what = real_text(args.text, args.text_mb, args.out)
    log(f"finetune data: {what}")
    runs = args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    curves = {}
    policy = runs / f"finetune-policy-b{args.batches[0]}-m{args.micro_batch}.yaml"  # one for every mode
    default_policy(args.batches[0], 1, max_micro_batch=args.micro_batch).save(policy)
    for state in args.states:
        run_dir = runs / f"finetune-{model_label(args.model)}-{state}"
        cmd = [sys.executable, "-m", "slidedp.cli", "train", "--model", args.model, "--data", str(text), "--seq",
               str(args.seq), "--batch", str(args.batches[0]), "--policy", str(policy), "--steps", str(args.steps),
               "--state", state,
               "--device", args.device, "--hardware", args.hardware, "--seed", "0", "--lr", str(args.lr),
               "--warmup", str(max(1, args.steps // 20)), "--eval-fraction", "0.02", "--eval-every",
               str(args.eval_every), "--no-checkpoint", "--log", "none", "--out", str(run_dir)]
        print(f"=== {' '.join(cmd[3:])}", flush=True)
        rc = subprocess.run(cmd, check=False).returncode
        metrics = run_dir / "metrics.csv"
        rows = []
        if metrics.exists():
            with open(metrics) as fh:
                rows = list(csv.DictReader(fh))
        train = [(int(r["step"]), float(r["loss"])) for r in rows]
        held = [(int(r["step"]), float(r["eval_loss"])) for r in rows if r.get("eval_loss")]
        curves[state] = (train, held)
        append_jsonl(args.out / "results.jsonl", {"part": "finetune", "model": model_label(args.model), "state": state,
                                                  "rc": rc, "data": what, "steps": args.steps,
                                                  "final_eval_loss": held[-1][1] if held else None,
                                                  "final_train_loss": train[-1][1] if train else None})
    _plot_finetune(curves, args.out)


def _plot_finetune(curves: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_train, ax_eval) = plt.subplots(1, 2, figsize=(11, 4))
    for state, (train, held) in curves.items():
        if train:
            ax_train.plot(*zip(*train, strict=True), label=state, lw=0.8)
        if held:
            ax_eval.plot(*zip(*held, strict=True), label=state, marker="o", ms=3)
    ax_train.set(title="training loss", xlabel="optimizer step", ylabel="cross-entropy (nats per token)")
    ax_eval.set(title="held-out loss", xlabel="optimizer step", ylabel="cross-entropy (nats per token)")
    ax_train.legend(title="host state")
    ax_eval.legend(title="host state")
    fig.suptitle("Fine-tune per host-state precision (same init, data and schedule)")
    fig.tight_layout()
    fig.savefig(out / "finetune_losses.png", dpi=120)
    base = curves.get("fp32", ([], []))[1]
    lines = ["| state | held-out loss | vs fp32 |", "|---|---|---|"]
    for state, (_, held) in curves.items():
        if held:
            rel = f"{(held[-1][1] / base[-1][1] - 1) * 100:+.2f}%" if base else "n/a"
            lines.append(f"| {state} | {held[-1][1]:.4f} | {rel} |")
    (out / "finetune.md").write_text("\n".join(lines) + "\n")


PARTS = {"rates": part_rates, "steps": part_steps, "big": part_big, "finetune": part_finetune}
DEFAULTS = {  # model, seq, batches, states, steps
    "rates": (None, None, [], MODES, None),
    "steps": ("qwen3-4b", 4096, [1, 4, 8], MODES, 6),
    "big": ("qwen3-14b", 4096, [1, 4, 16], ["bf16+int8"], 4),
    "finetune": ("qwen3-0.6b", 1024, [16], MODES, 300),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=sorted(PARTS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", help="preset or config.json (default per part)")
    ap.add_argument("--seq", type=int)
    ap.add_argument("--batches", type=int, nargs="+", help="global batches (finetune: the first)")
    ap.add_argument("--states", nargs="+", help=f"state modes (default per part; all: {' '.join(MODES)})")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--hardware", default="h200-x1")
    ap.add_argument("--gpu-budget", type=float, metavar="GIB",
                    help="steps/big: tune under this GPU budget (a profile of a bigger GPU than the one it runs on)")
    ap.add_argument("--no-tune", dest="tune", action="store_false", help="default policy instead of the tuner's")
    ap.add_argument("--params", type=int, default=64_000_000, help="rates: parameters per update")
    ap.add_argument("--threads", type=int, nargs="+", default=sorted({1, 2, 4, 8, 16, os.cpu_count() or 1}))
    ap.add_argument("--adam-threads", type=int, nargs="+", help="steps: optimizer threads per run (default: the "
                    "tuner's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--first-touch", choices=("parallel", "serial"), default="parallel",
                    help="rates, exact mode: the master's pages touched by every thread, as the runtime does, "
                         "or by one (the exact rates of 2026-12-06 and before)")
    ap.add_argument("--text", default="auto", help="finetune: a text file, or auto (Python stdlib sources)")
    ap.add_argument("--text-mb", type=float, default=32.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--micro-batch", type=int, default=1,
                    help="finetune: sequences per micro-batch (the default policy's, up to the batch)")
    args = ap.parse_args(argv)
    model, seq, batches, states, steps = DEFAULTS[args.part]
    args.model = args.model or model
    args.seq = args.seq or seq
    args.batches = args.batches or batches
    args.states = args.states or states
    args.steps = args.steps or steps
    args.threads = [t for t in args.threads if t <= (os.cpu_count() or 1)]
    args.out.mkdir(parents=True, exist_ok=True)
    PARTS[args.part](args)
    rows = [r for r in read_jsonl(args.out / "results.jsonl") if r.get("part") == args.part]
    return 0 if rows and all(r.get("rc", 0) == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
