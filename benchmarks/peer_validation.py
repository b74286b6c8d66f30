"""Peers predicted before they run, then measured, in one invocation: the held-out check of the peer models.

    python -m benchmarks.peer_validation --out DIR [--model qwen3-4b] [--seq 4096] [--batches 1 2 4 8]
        [--systems deepspeed-offload fsdp2-offload] [--calibrate clip|host] [--base h200-x1] [--no-contention]
    python -m benchmarks.peer_validation --compare DIR [--repredict PROFILE]     # no GPU

1. Calibrates what the peers' models lack on this host into DIR/profile.yaml. ``--calibrate clip`` (the
   default) times torch's clip_grad_norm_ over CPU gradients only (the rate FSDP2-offload's clip runs at) and keeps
   every other field of --base. ``--calibrate host`` runs ``slidedp calibrate --host-only --base BASE``: every CPU
   rate of this host (SlideDP's update modes, the peers' CPU AdamW and clip where installed, copy and cast), the
   GPU, PCIe and contention fields kept from BASE: what a user on a machine the profile never saw would run.
   ``--calibrate none`` takes BASE as it is (a profile an earlier call on the same machine wrote).
2. Writes DIR/predictions.json: the simulator's step time, limiter, phases and GPU / host memory for each of --systems
   (measured names, simulated as slidedp.report.peers.SIMULATED_AS says) at every batch, and the contention
   experiments' predictions (benchmarks.contention) unless --no-contention, before anything is run. Nothing is
   fitted to the peers' step times.
3. Measures the contention experiments, then the peers (benchmarks.peer_compare, one process per system).
4. Writes DIR/comparison.md: predicted vs measured step time, GPU peak and host memory, per system the first
   batch out of GPU memory, predicted and measured, and with --phases the phases (forward, backward, after backward,
   the CPU clip), predicted and measured: a step within a few percent can hide phases off by a quarter.
``--compare DIR`` rebuilds comparison.md from a fetched folder; ``--repredict PROFILE`` prints the comparison with
every row predicted again from PROFILE by the models as they are now (post hoc: DIR keeps what was predicted before
its runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import log, read_jsonl, require_cuda
from benchmarks.host_profile_spread import row_spec
from benchmarks.peer_predictions import error_summary, error_text, predict
from slidedp.errors import SlideDPError
from slidedp.hardware import HardwareProfile, load_hardware
from slidedp.report.peers import SIMULATED_AS

DEFAULT_SYSTEMS = ("deepspeed-offload", "fsdp2-offload")


def calibrated_profile(how: str, base_name: str, out: Path):
    """The profile the predictions use, written to ``out``/profile.yaml (see the module's step 1)."""
    from slidedp.calibration.host_bench import peer_thread_counts
    from slidedp.calibration.measurements import Measurements
    from slidedp.calibration.peer_bench import peer_adam_benchmarks
    from slidedp.peers.systems import TORCH_CLIP_GRAD_NORM

    path = out / "profile.yaml"
    if how == "none":
        hw = load_hardware(base_name)
        hw.save(path)
        return hw
    if how == "host":
        cmd = [sys.executable, "-m", "slidedp.cli", "calibrate", "--host-only", "--base", base_name,
               "--out", str(path)]
        with open(out / "calibrate.log", "w") as logfile:
            done = subprocess.run(cmd, stdout=logfile, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            raise SystemExit(f"slidedp calibrate --host-only failed (exit {done.returncode}): {out / 'calibrate.log'}")
        return load_hardware(str(path))
    m = Measurements()
    peer_adam_benchmarks(m, False, peer_thread_counts(), implementations=(TORCH_CLIP_GRAD_NORM,))
    base = load_hardware(base_name)
    hw = replace(base, name=f"{base.name}+clip", host=replace(base.host, peer_adam_gparams_per_s={
        **base.host.peer_adam_gparams_per_s, **m.peer_adam_gparams_per_s}))
    hw.save(path)
    log(f"calibrated: {m.peer_adam_gparams_per_s} {m.report.get('warnings', [])}")
    return hw


def main() -> int:
    from benchmarks import contention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for the profile, predictions, results and comparison")
    parser.add_argument("--base", default="h200-x1")
    parser.add_argument("--calibrate", choices=("clip", "host", "none"), default="clip")
    parser.add_argument("--systems", nargs="+", choices=sorted(SIMULATED_AS), default=list(DEFAULT_SYSTEMS))
    parser.add_argument("--model", default="qwen3-4b")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-contention", action="store_true", help="skip the contention experiments")
    parser.add_argument("--phases", action="store_true", help="time each step's phases too (peer_compare --phases)")
    parser.add_argument("--deadline", type=float, default=420, help="seconds for the peer runs at most")
    parser.add_argument("--timeout", type=float, help="seconds per system at most (default: half of --deadline "
                        "plus 30)")
    parser.add_argument("--compare", metavar="DIR", help="only rebuild DIR/comparison.md from its files (no GPU)")
    parser.add_argument("--repredict", metavar="PROFILE", help="with --compare: predict the measured rows again "
                        "from PROFILE with today's models and print that comparison (post hoc: nothing is written)")
    args = parser.parse_args()
    if args.repredict and not args.compare:
        parser.error("--repredict needs --compare DIR")
    if args.compare:
        if not (Path(args.compare) / "predictions.json").is_file():
            parser.error(f"{args.compare} has no predictions.json: give a folder this script wrote")
        hw = None
        if args.repredict:
            try:
                hw = load_hardware(args.repredict)
            except (SlideDPError, OSError) as exc:
                parser.error(f"--repredict {args.repredict}: {str(exc).splitlines()[0]}")
        try:
            text = compare_folder(Path(args.compare), hw)
        except (SlideDPError, OSError, KeyError, ValueError) as exc:  # a folder this script did not write whole
            parser.error(f"--compare {args.compare}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        if hw is None:  # a re-prediction is printed only: the folder keeps the predictions made before the runs
            (Path(args.compare) / "comparison.md").write_text(text)
        print(text, end="")
        return 0
    if not args.out:
        parser.error("--out is required")
    require_cuda("benchmarks.peer_validation")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    hw = calibrated_profile(args.calibrate, args.base, out)
    predictions = {"written_at": time.strftime("%Y-%m-%d %H:%M:%S"), "profile": hw.name,
                   "peer_rates": hw.host.peer_adam_gparams_per_s, "mem_bw_gbps": hw.host.mem_bw_gbps,
                   "gpu_memory_gib": hw.gpu.memory_gib, "peers": {}}
    for measured in args.systems:
        predictions["peers"][measured] = {b: predict(SIMULATED_AS[measured], args.model, hw, args.seq, b)
                                          for b in args.batches}
    if not args.no_contention:
        predictions["contention"] = contention.predict(str(out / "profile.yaml"), 2**28)
    (out / "predictions.json").write_text(json.dumps(predictions, indent=1))
    log(f"predictions written: {predictions['peers']}")

    measured_contention = {}
    if not args.no_contention:
        measured_contention = contention.measure(2**28, 3)
        (out / "contention_measured.json").write_text(json.dumps(measured_contention, indent=1))

    peers_dir = out / "peers"  # inside --out, so rows a killed call finished still come back
    shutil.rmtree(peers_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "benchmarks.peer_compare", "--model", args.model, "--seq", str(args.seq),
           "--batches", *map(str, args.batches), "--steps", str(args.steps), "--systems", *args.systems,
           "--timeout", str(args.timeout or args.deadline / 2 + 30), "--deadline", str(args.deadline),
           "--out", str(peers_dir)] + (["--phases"] if args.phases else [])
    subprocess.run(cmd, check=False)
    if not (peers_dir / "results.jsonl").is_file():
        raise SystemExit(f"benchmarks.peer_compare wrote no rows into {peers_dir}; its output above says why")
    shutil.copy(peers_dir / "results.jsonl", out / "results.jsonl")
    (out / "comparison.md").write_text(comparison(predictions, measured_contention, out / "results.jsonl"))
    log((out / "comparison.md").read_text())
    return 0


def _gib(value) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def first_oom(per_batch: dict[int, bool]) -> str:
    """The first batch that ran out of GPU memory (``per_batch``: batch -> out of memory), or "none up to B"."""
    ooms = [b for b, oom in sorted(per_batch.items()) if oom]
    return str(ooms[0]) if ooms else f"none up to {max(per_batch)}"


def comparison(predictions: dict, contention_measured: dict, results: Path) -> str:
    """predicted vs measured per (system, batch): step time, GPU peak, host memory; the first batch out of GPU
    memory per system; the contention experiments."""
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    peers = {system: {int(b): p for b, p in per.items()} for system, per in predictions["peers"].items()}
    lines = ["| system | batch | predicted s (limiter) | measured s | error | GPU allocated GiB pred / meas "
             "| GPU reserved GiB pred / meas | host GiB pred / RSS |", "|---|---|---|---|---|---|---|---|"]
    errors: dict[str, list[float]] = {}
    oom_pred: dict[str, dict[int, bool]] = {}
    oom_meas: dict[str, dict[int, bool]] = {}
    for r in rows:
        system, batch = r["system"], r["batch"]
        pred = peers.get(system, {}).get(batch) or {}
        meas = r.get("step_time_s") if r.get("status") == "ok" else None
        if "step_s" in pred:
            oom_pred.setdefault(system, {})[batch] = not pred["fits"]
        if r.get("status") == "ok" or r.get("status") == "oom":
            oom_meas.setdefault(system, {})[batch] = r.get("status") == "oom"
        predicted = f"{pred['step_s']:.3f} ({pred['limiter']})" if "step_s" in pred else pred.get("refused", "-")
        if not pred.get("fits", True):
            predicted += " OOM"
        err = "-"
        if "step_s" in pred and meas:
            errors.setdefault(system, []).append(100 * (pred["step_s"] - meas) / meas)
            err = error_text(pred["step_s"], meas)
        # Like for like: the allocator's peaks, predicted (PeerMemory: allocated; with fragmentation, reserved) and
        # measured (max_memory_allocated / max_memory_reserved); the card's total adds the profile's reserve on top.
        gpu = f"{_gib(pred.get('alloc_gib'))} / {_gib(r.get('gpu_peak_gib'))}"
        reserved = f"{_gib(pred.get('reserved_gib'))} / {_gib(r.get('gpu_reserved_gib'))}"
        host = f"{_gib(pred.get('host_gib'))} / {_gib(r.get('host_rss_peak_gib'))}"
        lines.append(f"| {system} | {batch} | {predicted} | {f'{meas:.3f}' if meas else r.get('status')} | {err} "
                     f"| {gpu} | {reserved} | {host} |")
    lines.append("")
    lines += [error_summary(system, errs) for system, errs in errors.items()]
    lines += ["", "| system | first batch out of GPU memory, predicted | measured |", "|---|---|---|"]
    for system in oom_meas:
        predicted = first_oom(oom_pred[system]) if system in oom_pred else "- (not predicted)"
        lines.append(f"| {system} | {predicted} | {first_oom(oom_meas[system])} |")
    lines += phase_table(peers, rows)
    if predictions.get("contention"):
        lines += ["", "| contention experiment | predicted | measured | error |", "|---|---|---|---|"]
        for key, p in predictions["contention"].items():
            m = contention_measured.get(key)
            if isinstance(p, float) and isinstance(m, float):
                lines.append(f"| {key} | {p:.4f} | {m:.4f} | {error_text(p, m)} |")
    return "\n".join(lines) + "\n"


def measured_phases(phase_s: dict) -> dict[str, float]:
    """A measured row's phases (benchmarks.peer_setup.PhaseClock) on the simulator's split
    (slidedp.peers.plan.phase_seconds): forward, backward, and everything after backward, of which the clip where
    the system timed one apart (DeepSpeed clips inside its optimizer step)."""
    out = {k: phase_s[k] for k in ("forward", "backward", "clip") if k in phase_s}
    after = [v for k, v in phase_s.items() if k not in ("forward", "backward")]
    if after:
        out["after_backward"] = sum(after)
    return out


def phase_table(peers: dict, rows: list[dict]) -> list[str]:
    """Predicted against measured phases per (system, batch) where both exist (runs with --phases; predictions
    written since 2026-12-07's twentieth session): a step within a few percent can hide phases off by a quarter
    in opposite directions."""
    lines = []
    for r in rows:
        pred = (peers.get(r["system"], {}).get(r["batch"]) or {}).get("phase_s")
        if r.get("status") != "ok" or not pred or not r.get("phase_s"):
            continue
        meas = measured_phases(r["phase_s"])
        cells = []
        for phase in ("forward", "backward", "after_backward", "clip"):
            if phase in pred and meas.get(phase, 0.0) > 0:
                cells.append(f"{pred[phase]:.3f} / {meas[phase]:.3f} ({error_text(pred[phase], meas[phase])})")
            else:
                cells.append("-")
        lines.append(f"| {r['system']} | {r['batch']} | " + " | ".join(cells) + " |")
    if not lines:
        return []
    return ["", "Phases, predicted / measured s (error): after backward is clip + optimizer + the rest", "",
            "| system | batch | forward | backward | after backward | of which clip |", "|---|---|---|---|---|---|",
            *lines]


def compare_folder(folder: Path, repredict: HardwareProfile | None = None) -> str:
    """comparison.md again from a fetched run's predictions.json, results.jsonl (or peers/results.jsonl, where the
    call was stopped before it copied them) and contention_measured.json; with ``repredict``, every peer row's
    prediction made again from that profile with the models as they are now (what a model change does to a call's
    rows; not the prediction the call wrote before its runs)."""
    predictions = json.loads((folder / "predictions.json").read_text())
    contention_file = folder / "contention_measured.json"
    measured = json.loads(contention_file.read_text()) if contention_file.exists() else {}
    results = folder / "results.jsonl"
    results = results if results.exists() else folder / "peers" / "results.jsonl"
    if repredict is not None:
        rows = read_jsonl(results)
        peers = {}
        for system, per in predictions["peers"].items():
            # a row that ran (or ran out of memory) names the model as trained; "not run" rows lack that mark
            row = next((r for r in rows if r.get("system") == system and r.get("status") in ("ok", "oom")), None)
            if row is None or system not in SIMULATED_AS:
                continue
            spec = row_spec(row)  # one model and seq per system and call
            peers[system] = {b: predict(SIMULATED_AS[system], row["model"], repredict, int(row["seq"]), int(b), spec)
                             for b in per}
        predictions = {**predictions, "profile": repredict.name, "contention": {}, "peers": peers}
    return comparison(predictions, measured, results)


if __name__ == "__main__":
    raise SystemExit(main())
