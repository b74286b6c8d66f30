"""The simulator's predictions for the paper's comparison (#21): SlideDP (tuned, and with every optimizer state on the
host) against ZeRO-2-Offload, SlideFormer and MegaTrain, per batch, written before anything is measured.

    python -m benchmarks.paper_peer_predictions --model qwen3-4b --hardware h200-x1 --seq 4096 \\
        --batches 1 2 4 8 16 [--out predictions.md]

SlideDP's rows are what `benchmarks.peer_compare` would run: `slidedp tune`'s best policy for the batch (the
same budget as peer_compare: the GPU's usable fraction, all host memory), simulated. Each peer is its simulated
system (slidedp.peers) with its own memory model. Where the profile lacks a peer's CPU optimizer rate the peer
refuses; its row is then predicted a second time with stand-in rates, labelled as such (STAND_INS: SlideFormer's
LayerAdam is DeepSpeed's cpu_adam code, modified, and has not been timed: its stand-in is DeepSpeedCPUAdam's
measured curve; MegaTrain's DeepSpeedCPUAdam and clip over bf16 tensors stand in as the measured fp32 ones).
Ratios are SlideDP's predicted tokens/s over each peer's, with their geometric mean over the
batches both fit (the paper's headline: 1.46-2.64x). With ``--measured DIR ...`` (peer_compare output folders)
each row also shows the measured step time of that system and batch and the prediction's error.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.our_variants import VARIANT_SPACES
from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, HardwareProfile, load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.peers import estimate_peer_memory, peer_step, simulate_peer
from slidedp.peers.systems import (
    DEEPSPEED_CPU_ADAM,
    DEEPSPEED_CPU_ADAM_BF16,
    SLIDEFORMER_CPU_ADAM,
    SYSTEMS,
    TORCH_CLIP_GRAD_NORM,
    TORCH_CLIP_GRAD_NORM_BF16,
)
from slidedp.problem import resolve_budget
from slidedp.report.peers import SIMULATED_AS, geomean, load_rows
from slidedp.tune import TuneSpace, tune

OURS = VARIANT_SPACES  # SlideDP as each variant peer_compare measures
PEERS = ("zero2-offload", "slideformer", "megatrain")
# An untimed pass -> the measured one it derives from: SlideFormer's kernel is DeepSpeed's code, modified;
# MegaTrain's passes are DeepSpeedCPUAdam's and torch's clip on bf16 instead of fp32 tensors.
STAND_INS = {SLIDEFORMER_CPU_ADAM: DEEPSPEED_CPU_ADAM, DEEPSPEED_CPU_ADAM_BF16: DEEPSPEED_CPU_ADAM,
             TORCH_CLIP_GRAD_NORM_BF16: TORCH_CLIP_GRAD_NORM}
MEASURED_AS = {sim: measured for measured, sim in SIMULATED_AS.items()}  # simulated name -> peer_compare's


def with_stand_ins(hw: HardwareProfile, keys: tuple[str | None, ...]) -> tuple[HardwareProfile, list[str]]:
    """``hw`` with each of ``keys`` the profile lacks set to its STAND_INS source's curve, and what was stood in."""
    rates = dict(hw.host.peer_adam_gparams_per_s)
    used = []
    for key in keys:
        source = STAND_INS.get(key)
        if key not in rates and source in rates:
            rates[key] = rates[source]
            used.append(f"{key} := {source}")
    return replace(hw, host=replace(hw.host, peer_adam_gparams_per_s=rates)), used


def predict_ours(model, hw: HardwareProfile, seq: int, batch: int, space: TuneSpace) -> dict:
    budget = resolve_budget(hw, None, hw.host.memory_gib)
    try:
        best = tune(model, hw, seq, batch, budget, space, refine_top=4).best
    except SlideDPError as exc:
        return {"status": f"does not fit ({str(exc)[:80]})"}
    step = best.sim_step_s
    return {"status": "ok", "step_s": step, "tokens_per_s": batch * seq / step, "limiter": best.sim.limiter,
            "gpu_peak_gib": best.memory.gpu_peak / GIB, "host_gib": best.memory.host_total / GIB,
            "note": f"gpu_state_units={best.policy.gpu_state_units}"}


def predict_peer(name: str, model, hw: HardwareProfile, seq: int, batch: int) -> dict:
    try:
        step = peer_step(name, model, hw, seq, batch)
        note = ""
    except SlideDPError as exc:
        system = SYSTEMS[name]
        stood_in, used = with_stand_ins(hw, (system.cpu_adam, system.cpu_clip))
        if not used:
            return {"status": f"refused ({exc})"}
        step = peer_step(name, model, stood_in, seq, batch)
        note = "stand-in rate " + ", ".join(used)
    mem = estimate_peer_memory(step)
    if mem.gpu_peak > hw.gpu.memory_gib * GIB or mem.host_total > hw.host.memory_gib * GIB:
        return {"status": "does not fit (" + "; ".join(mem.shortfalls(hw.gpu.memory_gib * GIB,
                                                                      hw.host.memory_gib * GIB)) + ")"}
    sim = simulate_peer(step)
    return {"status": "ok", "step_s": sim.step_time_s, "tokens_per_s": sim.tokens_per_s, "limiter": sim.limiter,
            "gpu_peak_gib": mem.gpu_peak / GIB, "host_gib": mem.host_total / GIB, "note": note}


def predictions(model_name: str, hw: HardwareProfile, seq: int, batches: list[int]) -> dict[str, dict[int, dict]]:
    model = load_model_spec(model_name)
    out: dict[str, dict[int, dict]] = {name: {} for name in (*OURS, *PEERS)}
    for batch in batches:
        for name, space in OURS.items():
            out[name][batch] = predict_ours(model, hw, seq, batch, space)
        for name in PEERS:
            out[name][batch] = predict_peer(name, model, hw, seq, batch)
    return out


def measured_steps(rows: list[dict], model: str, seq: int) -> dict[tuple[str, int], float | str]:
    """Measured step time (or the status of a row without one) per (simulated system name, batch)."""
    simulated_as = {MEASURED_AS.get(n, n): n for n in (*OURS, *PEERS)}  # peer_compare's name -> simulated name
    out: dict[tuple[str, int], float | str] = {}
    for r in rows:
        if r.get("model") == model and r.get("seq") == seq and r.get("system") in simulated_as:
            value = r["step_time_s"] if r.get("status") == "ok" else r.get("status", "?")
            out[(simulated_as[r["system"]], r["batch"])] = value
    return out


def markdown(pred: dict[str, dict[int, dict]], batches: list[int],
             measured: dict[tuple[str, int], float | str] | None = None) -> str:
    extra = " measured s | error |" if measured is not None else ""
    lines = ["| system | batch | predicted step s | tokens/s | limiter | GPU peak GiB | host GiB | note |" + extra,
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if extra else "")]
    for name, rows in pred.items():
        for b in batches:
            r = rows[b]
            meas = (measured or {}).get((name, b), "-")
            cells = ""
            if measured is not None:
                err = "-"
                if isinstance(meas, float):
                    if r["status"] == "ok":
                        err = f"{100 * (r['step_s'] - meas) / meas:+.1f}%"
                    meas = f"{meas:.3f}"
                cells = f" {meas} | {err} |"
            if r["status"] != "ok":
                lines.append(f"| {name} | {b} | {r['status']} | | | | | |" + cells)
                continue
            lines.append(f"| {name} | {b} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['limiter']} | "
                         f"{r['gpu_peak_gib']:.1f} | {r['host_gib']:.1f} | {r['note']} |" + cells)
    lines.append("")
    for ours in OURS:
        for peer in PEERS:
            both = [b for b in batches if pred[ours][b]["status"] == "ok" and pred[peer][b]["status"] == "ok"]
            ratios = {b: pred[ours][b]["tokens_per_s"] / pred[peer][b]["tokens_per_s"] for b in both}
            if not ratios:
                lines.append(f"{ours} / {peer}: no batch where both fit")
                continue
            per = ", ".join(f"b{b}: {v:.2f}x" for b, v in ratios.items())
            lines.append(f"{ours} / {peer}: geometric mean {geomean(list(ratios.values())):.2f}x ({per})")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-4b")
    p.add_argument("--hardware", default="h200-x1")
    p.add_argument("--gpu-from", metavar="PROFILE",
                   help="predict for --hardware's host with this profile's GPU (e.g. h100-sxm-x1: the H100 that "
                        "came on the H200's host type)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--measured", type=Path, nargs="*", help="peer_compare output folders to compare with")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args()
    measured = None
    if args.measured is not None:
        rows = [r for folder in args.measured for r in load_rows(folder)]
        measured = measured_steps(rows, args.model, args.seq)
    hw = load_hardware(args.hardware)
    if args.gpu_from:
        hw = hw.with_gpu_of(load_hardware(args.gpu_from))
    pred = predictions(args.model, hw, args.seq, args.batches)
    text = markdown(pred, args.batches, measured)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
