"""The simulator's predictions for the peer systems, against the rows the H200 peer comparisons measured.

    python -m benchmarks.peer_predictions [--sessions DIR ...] [--hardware h200-x1] [--out table.md]

For every measured peer row (``results.jsonl`` of each session's ``peers/`` folder) it simulates the matching
peer system (slidedp.peers) with the hardware profile as it is, nothing fitted to the peer step times: the peers'
CPU optimizer rates the profile stores were timed alone by calibration.peer_bench. Where a profile lacks a peer's
rate the peer refuses, and its rows are predicted a second time with a stand-in rate (SlideDP's own one-pass
kernel's curve), labelled as such. It prints, per system and batch, predicted vs
measured step time and error, predicted vs measured GPU peak (allocated) and host memory, and per system the first
batch the memory model says runs out of GPU memory against the measured one.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.common import log
from benchmarks.peer_setup import spec_as_trained
from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, HardwareProfile, load_hardware
from slidedp.model_spec import ModelSpec, load_model_spec
from slidedp.peers import estimate_peer_memory, peer_step, phase_seconds, simulate_peer
from slidedp.peers.systems import DEEPSPEED_CPU_ADAM
from slidedp.report.peers import SIMULATED_AS, load_rows

RESULTS = Path(__file__).parent / "results"
SESSIONS = (RESULTS / "h200-2026-12-02b" / "peers", RESULTS / "h200-2026-12-02b" / "p8b",
            RESULTS / "h200-2026-12-02c" / "peers", RESULTS / "h200-2026-12-03b" / "pv")
# The peers these sessions measured, and the simulated system of each (one map: slidedp.report.peers).
MEASURED_AS = {m: SIMULATED_AS[m] for m in ("deepspeed-offload", "fsdp2-offload", "resident")}
BATCHES = (1, 2, 4, 8, 16)
STAND_IN = "stand-in DeepSpeedCPUAdam rate = SlideDP's one-pass kernel (assumed, not measured)"


def with_stand_in(hw: HardwareProfile) -> HardwareProfile:
    rates = {**hw.host.peer_adam_gparams_per_s, DEEPSPEED_CPU_ADAM: dict(hw.host.adam_gparams_per_s)}
    return replace(hw, host=replace(hw.host, peer_adam_gparams_per_s=rates))


def predict(system: str, model: str, hw: HardwareProfile, seq: int, batch: int, spec: ModelSpec | None = None) -> dict:
    """Predicted step, limiter and memory; ``refused`` names why the simulator declined. ``spec``: the model as a
    measured row trained it (benchmarks.peer_setup.spec_as_trained), where that differs from ``model``."""
    spec = spec or load_model_spec(model)
    try:
        step = peer_step(system, spec, hw, seq, batch)
    except SlideDPError as exc:
        return {"refused": str(exc)}
    sim = simulate_peer(step)
    mem = estimate_peer_memory(step)
    return {"step_s": sim.step_time_s, "limiter": sim.limiter, "alloc_gib": mem.gpu_allocated_peak / GIB,
            "reserved_gib": mem.gpu_reserved_peak / GIB, "peak_gib": mem.gpu_peak / GIB,
            "host_gib": mem.host_total_gib(), "fits": mem.gpu_peak <= hw.gpu.memory_gib * GIB,
            "phase_s": phase_seconds(step, sim.trace, sim.step_time_s)}


def error_text(pred: float, meas: float | None) -> str:
    """(predicted - measured) / measured as the comparison tables print it, "-" without a measurement."""
    return "-" if meas is None else f"{100 * (pred - meas) / meas:+.1f}%"


def error_summary(system: str, errors_pct: list[float]) -> str:
    """One system's signed errors (percent) as the comparisons summarise them: MAPE, the worst with its sign, and
    how many are within 10% as the tables print them (one decimal)."""
    worst = max(errors_pct, key=abs)
    within = sum(abs(round(e, 1)) <= 10 for e in errors_pct)
    return (f"- {system}: MAPE {sum(map(abs, errors_pct)) / len(errors_pct):.1f}%, worst {worst:+.1f}%, "
            f"{within} of {len(errors_pct)} within 10%")


def _s(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def comparison(sessions: list[Path], hw: HardwareProfile) -> str:
    # Rows grouped by the model each trained (a session before the tied-head fix and one after are two groups).
    measured: dict[tuple[str, str, int], dict[str, dict]] = {}
    seqs: dict[str, int] = {}
    specs: dict[str, tuple[str, ModelSpec]] = {}
    for folder in sessions:
        for r in load_rows(folder):
            if r["system"] in MEASURED_AS and r.get("gpus", 1) == 1 and r.get("status") != "not run":
                spec = spec_as_trained(load_model_spec(r["model"]), r)
                specs[spec.name] = (r["model"], spec)
                measured.setdefault((spec.name, r["system"], r["batch"]), {})[folder.parent.name] = r
                seqs[spec.name] = r["seq"]
    names = list(dict.fromkeys(f.parent.name for f in sessions))  # one column per session
    lines = ["| model | batch | measured system | simulated as | predicted s (limiter) | "
             + " | ".join(f"measured s {n} | error" for n in names)
             + " | GPU peak GiB predicted / measured | host GiB predicted / measured RSS |",
             "|---" * (6 + 2 * len(names)) + "|"]
    errors: dict[str, list[float]] = {}
    oom_lines = []
    stand_in_hw = with_stand_in(hw)
    for shown in sorted({k[0] for k in measured}):  # the model as trained, as the table names it
        model, spec = specs[shown]
        for system in MEASURED_AS:
            rows = {b: measured.get((shown, system, b)) for b in BATCHES}
            if not any(rows.values()):
                continue
            variants = [(MEASURED_AS[system], hw)]
            if "refused" in predict(MEASURED_AS[system], model, hw, seqs[shown], 1, spec):  # the profile lacks its rate
                variants.append((f"{MEASURED_AS[system]} (stand-in rate)", stand_in_hw))
            for label, profile in variants:
                simulated = label.split(" ")[0]
                predicted_oom = None
                for b in BATCHES:
                    p = predict(simulated, model, profile, seqs[shown], b, spec)
                    if "refused" not in p and not p["fits"] and predicted_oom is None:
                        predicted_oom = b
                    by_session = rows[b] or {}
                    if not by_session:
                        continue
                    ok = {n: r for n, r in by_session.items() if r.get("status") == "ok"}
                    if "refused" in p:
                        cells = " | ".join("- | -" for _ in names)
                        lines.append(f"| {shown} | {b} | {system} | {label} | refused: no DeepSpeedCPUAdam rate "
                                     f"in {hw.name} | {cells} | - | - |")
                        continue
                    cells = []
                    for n in names:
                        meas = ok[n]["step_time_s"] if n in ok else None
                        status = by_session[n].get("status") if n in by_session else None
                        shown_meas = _s(meas) if meas is not None else (status or "-")
                        cells.append(f"{shown_meas} | {error_text(p['step_s'], meas)}")
                        if meas is not None and b <= 8:
                            errors.setdefault(label, []).append(abs(p["step_s"] - meas) / meas)
                    any_ok = next(iter(ok.values()), None)
                    gpu = f"{p['alloc_gib']:.1f} / {_s(any_ok and any_ok.get('gpu_peak_gib'), '.1f')}"
                    host = f"{p['host_gib']:.1f} / {_s(any_ok and any_ok.get('host_rss_peak_gib'), '.1f')}"
                    fits = "" if p["fits"] else " OOM"
                    lines.append(f"| {shown} | {b} | {system} | {label} | {p['step_s']:.3f} ({p['limiter']}){fits} | "
                                 + " | ".join(cells) + f" | {gpu} | {host} |")
                measured_oom = next((b for b in BATCHES if rows[b] and any(r.get("status") == "oom"
                                                                            for r in rows[b].values())), None)
                ran = [b for b in BATCHES if rows[b]]
                oom_lines.append(f"| {shown} | {system} | {label} | {predicted_oom or f'none up to {BATCHES[-1]}'} | "
                                 f"{measured_oom or f'none up to {max(ran)}'} |")
    out = ["Step time (predicted on the development machine; error = (predicted - measured) / measured; GPU peak "
           "is the memory model's allocated peak against torch.cuda.max_memory_allocated; host is the model's state "
           "plus the measured overhead against the process's peak RSS):", "", *lines, "",
           "Mean absolute error over batch 1-8 (every session): "
           + "; ".join(f"{k} {100 * sum(v) / len(v):.1f}% (worst {100 * max(v):.1f}%)" for k, v in errors.items()),
           "", "First batch out of GPU memory (batches 1, 2, 4, 8, 16; GPU peak incl. reserve > "
           f"{hw.gpu.memory_gib:.0f} GiB):", "", "| model | measured system | simulated as | predicted | measured |",
           "|---|---|---|---|---|", *oom_lines]
    if any("stand-in" in line for line in oom_lines):
        out += ["", f"Stand-in: {STAND_IN}."]
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description="Predicted vs measured step time and memory of the peer systems")
    p.add_argument("--sessions", nargs="+", type=Path, default=list(SESSIONS),
                   help="folders holding a comparison's results.jsonl (default: the 2026-12-02b peers/ and p8b/ and "
                   "the 2026-12-02c peers/ folders)")
    p.add_argument("--hardware", default="h200-x1", help="profile to predict with (default h200-x1)")
    p.add_argument("--out", type=Path, help="also write the tables here")
    args = p.parse_args()
    text = comparison(args.sessions, load_hardware(args.hardware))
    print(text, end="")
    if args.out:
        args.out.write_text(text)
        log(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
