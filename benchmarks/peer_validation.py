"""Peers predicted before they run, then measured, in one invocation: the held-out check of the peer models.

    python -m benchmarks.peer_validation --out DIR [--model qwen3-4b] [--seq 4096] [--batches 1 2 4 8]

1. Calibrates what the peers' models still lack on this host (torch's clip_grad_norm_ over CPU gradients, the
   rate FSDP2-offload's clip runs at) with calibration.peer_bench, into DIR/profile.yaml (the base profile
   otherwise unchanged: DeepSpeedCPUAdam and torch's CPU AdamW rates, DRAM capacity).
2. Writes DIR/predictions.json: the simulator's step time, limiter and memory for ZeRO-2-Offload and
   FSDP2-offload at every batch, and the contention experiments' predictions (benchmarks.contention), before
   anything is run. Nothing is fitted to the peers' step times.
3. Measures the contention experiments, then the peers (benchmarks.peer_compare, one process per system).
4. Writes DIR/comparison.md: predicted vs measured.
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

from benchmarks.common import log, require_cuda

MEASURED_AS = {"deepspeed-offload": "zero2-offload", "fsdp2-offload": "fsdp2-offload"}


def main() -> int:
    from benchmarks import contention
    from benchmarks.peer_predictions import predict
    from slidedp.calibration.host_bench import peer_thread_counts
    from slidedp.calibration.measurements import Measurements
    from slidedp.calibration.peer_bench import peer_adam_benchmarks
    from slidedp.hardware import load_hardware
    from slidedp.peers.systems import TORCH_CLIP_GRAD_NORM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", default="h200-x1")
    parser.add_argument("--model", default="qwen3-4b")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=420, help="seconds for the peer runs at most")
    args = parser.parse_args()
    require_cuda("benchmarks.peer_validation")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    m = Measurements()
    peer_adam_benchmarks(m, False, peer_thread_counts(), implementations=(TORCH_CLIP_GRAD_NORM,))
    base = load_hardware(args.base)
    hw = replace(base, name=f"{base.name}+clip", host=replace(base.host, peer_adam_gparams_per_s={
        **base.host.peer_adam_gparams_per_s, **m.peer_adam_gparams_per_s}))
    hw.save(out / "profile.yaml")
    log(f"calibrated: {m.peer_adam_gparams_per_s} {m.report.get('warnings', [])}")

    predictions = {"written_at": time.strftime("%Y-%m-%d %H:%M:%S"), "profile": hw.name,
                   "peer_rates": hw.host.peer_adam_gparams_per_s, "mem_bw_gbps": hw.host.mem_bw_gbps, "peers": {}}
    for measured, system in MEASURED_AS.items():
        predictions["peers"][measured] = {b: predict(system, args.model, hw, args.seq, b) for b in args.batches}
    predictions["contention"] = contention.predict(str(out / "profile.yaml"), 2**28)
    (out / "predictions.json").write_text(json.dumps(predictions, indent=1))
    log(f"predictions written: {predictions['peers']}")

    measured_contention = contention.measure(2**28, 3)
    (out / "contention_measured.json").write_text(json.dumps(measured_contention, indent=1))

    peers_dir = Path("/tmp/peer_validation_peers")
    shutil.rmtree(peers_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "benchmarks.peer_compare", "--model", args.model, "--seq", str(args.seq),
           "--batches", *map(str, args.batches), "--steps", str(args.steps), "--systems", *MEASURED_AS,
           "--timeout", str(args.deadline / 2 + 30), "--deadline", str(args.deadline), "--out", str(peers_dir)]
    subprocess.run(cmd, check=False)
    shutil.copy(peers_dir / "results.jsonl", out / "results.jsonl")
    (out / "comparison.md").write_text(comparison(predictions, measured_contention, out / "results.jsonl"))
    log((out / "comparison.md").read_text())
    return 0


def comparison(predictions: dict, contention_measured: dict, results: Path) -> str:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    lines = ["| system | batch | predicted s (limiter) | measured s | error |", "|---|---|---|---|---|"]
    for r in rows:
        pred = predictions["peers"].get(r["system"], {}).get(r["batch"]) or {}
        meas = r.get("step_time_s")
        if "step_s" in pred and meas:
            err = f"{100 * (pred['step_s'] - meas) / meas:+.1f}%"
            lines.append(f"| {r['system']} | {r['batch']} | {pred['step_s']:.3f} ({pred['limiter']}) | {meas:.3f} "
                         f"| {err} |")
        else:
            lines.append(f"| {r['system']} | {r['batch']} | {pred.get('refused', '-')} | {r.get('status')} | - |")
    lines += ["", "| contention experiment | predicted | measured | error |", "|---|---|---|---|"]
    for key, p in predictions["contention"].items():
        m = contention_measured.get(key)
        if isinstance(p, float) and isinstance(m, float):
            lines.append(f"| {key} | {p:.4f} | {m:.4f} | {100 * (p - m) / m:+.1f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
