"""Predict already-measured H200 runs again with one or more profiles: what a change of the compute model does
to the predictions that matter, without a GPU.

    python -m benchmarks.compute_recheck --profile before=PATH --profile after=h200-x1 [--out FILE.jsonl]
    python -m benchmarks.compute_recheck --attention-forms     # the attention forms, leave-one-shape-out

Two sets, both measured on the H200 and never used to fit the compute curves (those come from micro-benchmarks
of single operations, benchmarks/results/h200-2026-12-03/fit_v2.json):
- ``held-out``: the 16 runs of the two held-out architecture sets (benchmarks/shape_validation.py; measured
  step time, GPU compute time of the last step's trace and limiter in h200-2026-12-03/results*.jsonl);
- ``long-seq``: the Qwen3-14B-wide sequence sweep (32K-256K tokens, h200-2026-12-02b/long_seq) and the 256K run
  under the 80 GiB cap (h200-2026-12-04/c3_cap.jsonl), whose rows carry their model and policy.
Prints each run's predicted step time (and GPU compute time where the run measured it) per profile, and per set
the mean absolute error. ``--attention-forms`` compares the attention cost forms on the H200's attention
micro-benchmarks of both 2026-12-03 calibrations (fit.json, fit_v2.json: 8 shapes x 2 directions x 2 days),
each fitted in log error with soft-L1 loss as calibration does, in-sample and leaving each shape out in turn.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from benchmarks.common import append_jsonl, read_jsonl

RESULTS = Path(__file__).parent / "results"
HELD_OUT = RESULTS / "h200-2026-12-03"  # runs/ and v2/runs/ in its raw.tar.xz
LONG_SEQ = [RESULTS / "h200-2026-12-02b" / "long_seq" / "results.jsonl", RESULTS / "h200-2026-12-04" / "c3_cap.jsonl"]


@dataclass
class Measured:
    """One measured run: how to build its workload on a profile, what it measured, its trace where kept."""

    set: str
    label: str
    workload: Callable  # HardwareProfile -> StepWorkload
    step_s: float
    limiter: str | None
    trace: object = None  # pandas DataFrame


def _workload(spec, policy, seq: int, batch: int, hw):
    from slidedp.workload import StepWorkload

    return StepWorkload(spec, hw, policy, seq, batch)


def compute_seconds(trace) -> float:
    """GPU compute busy time of rank 0's step (the trace's compute operations)."""
    from slidedp.calibration.from_run import rank0_ops
    from slidedp.exposure import OP_CATEGORY

    t = rank0_ops(trace, tuple(op for op, category in OP_CATEGORY.items() if category == "compute"))
    return float((t.end_s - t.start_s).sum())


def held_out_dirs(tmp: Path) -> list[Path]:
    """The run directories of both held-out architecture sets (HELD_OUT's runs/ and v2/runs/), unpacked in tmp."""
    from slidedp.report.rundir import unpack_session

    tree = unpack_session(HELD_OUT, tmp / "held-out")
    return sorted(p for p in [*(tree / "runs").iterdir(), *(tree / "v2" / "runs").iterdir()]
                  if (p / "summary.json").exists())


def measured_runs(tmp: Path, sessions: bool) -> list[Measured]:
    """Every successful run of the sets (``sessions`` adds the Qwen3-4B/8B runs of 2026-12-02b/c, in-sample
    for the layer-level fit those sessions made, never for the shape curves)."""
    from benchmarks.validate_h200 import new_runs, third_runs
    from slidedp.calibration.from_run import load_record
    from slidedp.model_spec import ModelSpec
    from slidedp.policy import Policy

    def from_dirs(which, dirs):
        records = [load_record(path) for path in dirs]
        return [Measured(which, r.label, r.workload, r.measured_s, r.measured_limiter, r.trace) for r in records]

    runs = from_dirs("held-out", held_out_dirs(tmp))
    for path in LONG_SEQ:
        for row in read_jsonl(path):
            if row.get("status") == "ok":
                spec, policy = ModelSpec(**row["model_spec"]), Policy.from_dict(row["policy"])
                runs.append(Measured("long-seq", f"{row.get('part', 'sweep')} {row['seq'] // 1024}K",
                                     partial(_workload, spec, policy, row["seq"], row["batch"]),
                                     row["step_time_s"], row.get("limiter")))
    if sessions:
        runs += from_dirs("qwen3-4b/8b", new_runs(tmp / "new") + third_runs(tmp / "third"))
    return runs


def predict(profiles: dict[str, str], sessions: bool = False) -> list[dict]:
    from slidedp.calibration.from_run import busy_seconds, head_pass_seconds, unit_pass_seconds
    from slidedp.hardware import load_hardware
    from slidedp.sim import simulate

    hardware = {label: load_hardware(path) for label, path in profiles.items()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in measured_runs(Path(tmp), sessions):
            row = {"set": run.set, "run": run.label, "measured_step_s": run.step_s, "measured_limiter": run.limiter,
                   "measured_compute_s": None if run.trace is None else compute_seconds(run.trace),
                   "measured_head_s": None, "measured_layer_s": None}
            row["measured_adam_s"] = None if run.trace is None else busy_seconds(run.trace, "adam")
            if run.trace is not None:
                row["measured_head_s"] = head_pass_seconds(run.trace)
                row["measured_layer_s"] = unit_pass_seconds(run.trace, 1, 1)
            for name, hw in hardware.items():
                sim = simulate(run.workload(hw))
                row[name] = {"step_s": sim.step_time_s, "compute_s": sim.compute_s, "limiter": sim.limiter,
                             "head_s": head_pass_seconds(sim.trace), "layer_s": unit_pass_seconds(sim.trace, 1, 1),
                             "adam_s": busy_seconds(sim.trace, "adam")}
            rows.append(row)
    return rows


def _err(pred: float, meas: float | None) -> float | None:
    return None if not meas else 100.0 * (pred - meas) / meas


def report(rows: list[dict], names: list[str]) -> str:
    head = ["run", "measured s"] + [f"{n} s (err)" for n in names] + ["compute meas"] + [f"{n} compute" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["run"], f"{r['measured_step_s']:.3f}"]
        cells += [f"{r[n]['step_s']:.3f} ({_err(r[n]['step_s'], r['measured_step_s']):+.1f}%)" for n in names]
        mc = r["measured_compute_s"]
        cells.append(f"{mc:.3f}" if mc else "-")
        cells += [f"{r[n]['compute_s']:.3f} ({_err(r[n]['compute_s'], mc):+.1f}%)" if mc else "-" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    for which in sorted({r["set"] for r in rows}):
        sel = [r for r in rows if r["set"] == which]
        for n in names:
            step = [abs(_err(r[n]["step_s"], r["measured_step_s"])) for r in sel]
            comp = [abs(_err(r[n]["compute_s"], r["measured_compute_s"])) for r in sel if r["measured_compute_s"]]
            lim = sum(r[n]["limiter"] == r["measured_limiter"] for r in sel if r["measured_limiter"])
            text = (f"{which}, {n}: step MAPE {sum(step) / len(step):.1f}% (worst {max(step):.1f}%, "
                    f"{sum(e <= 10 for e in step)}/{len(step)} within 10%)")
            if comp:
                text += (f"; GPU compute MAPE {sum(comp) / len(comp):.1f}% ({sum(e <= 10 for e in comp)}/{len(comp)}"
                         f" within 10%); limiter {lim}/{len(sel)}")
            lines.append(text)
    return "\n".join(lines)


def report_units(rows: list[dict], names: list[str]) -> str:
    """Per set, the mean signed error of the loss head's and the first decoder layer's fwd + bwd seconds, and how
    much longer the CPU update was busy in the measured step than in the simulated one."""
    lines = []
    for which in sorted({r["set"] for r in rows}):
        sel = [r for r in rows if r["set"] == which and r["measured_head_s"]]
        if not sel:
            continue
        for n in names:
            head = [_err(r[n]["head_s"], r["measured_head_s"]) for r in sel]
            layer = [_err(r[n]["layer_s"], r["measured_layer_s"]) for r in sel]
            adam = [r["measured_adam_s"] / r[n]["adam_s"] for r in sel if r["measured_adam_s"] and r[n]["adam_s"]]
            lines.append(f"{which}, {n}: loss head {sum(head) / len(head):+.1f}% mean ({min(head):+.1f} .. "
                         f"{max(head):+.1f}), first layer {sum(layer) / len(layer):+.1f}% mean ({min(layer):+.1f} .. "
                         f"{max(layer):+.1f}) over {len(sel)} runs"
                         + (f"; CPU update busy, measured / simulated: {sum(adam) / len(adam):.2f} mean "
                            f"({min(adam):.2f} .. {max(adam):.2f}) over {len(adam)} runs" if adam else ""))
    return "\n".join(lines)


def attention_forms() -> str:
    """Relative RMS error of the attention forms, in-sample and leave-one-shape-out (both directions and both
    days of a shape held out together), overall and for the shapes of 8K tokens and more."""
    import json

    import numpy as np
    from scipy.optimize import least_squares

    rows = []
    for name in ("fit.json", "fit_v2.json"):
        rows += json.loads((RESULTS / "h200-2026-12-03" / name).read_text())["samples"]["attention"]
    b, s, h, kv, d, bwd, t = (np.array([r[i] for r in rows], dtype=float) for i in range(7))
    flops = 4 * b * h * d * s * s / 2 * np.where(bwd > 0, 2.5, 1.0)
    shape = np.array([f"{r[0]}x{r[1]}x{r[2]}x{r[4]}" for r in rows])
    kernel_us = 26.53  # the GEMM fit's per-kernel cost (h200-x1), which the old form charged attention

    def old(x, i):  # rate x seq / (seq + half) + kernel_us
        rate = np.where(bwd[i] > 0, x[1], x[0])
        return flops[i] / (rate * 1e12 * s[i] / (s[i] + x[2])) + kernel_us * 1e-6

    def new(x, i):  # the same + a fixed cost per call and direction (slidedp.compute.ComputeCurves)
        rate = np.where(bwd[i] > 0, x[1], x[0])
        return flops[i] / (rate * 1e12 * s[i] / (s[i] + x[2])) + np.where(bwd[i] > 0, x[4], x[3]) * 1e-6

    forms = {"rate x seq/(seq+half) + kernel_us (before)": (old, [600, 600, 256], [1, 1, 0], [989, 989, 1e6]),
             "... + fixed us per call and direction (now)": (new, [600, 600, 256, 30, 30], [1, 1, 0, 0, 0],
                                                             [989, 989, 1e6, 1e4, 1e4])}
    everything = np.arange(len(t))
    lines = []
    for label, (fn, x0, lo, hi) in forms.items():
        def fit(idx, fn=fn, x0=x0, lo=lo, hi=hi):
            return least_squares(lambda y: np.log(fn(y, idx) / t[idx]), x0, bounds=(lo, hi), loss="soft_l1",
                                 f_scale=0.1, max_nfev=8000).x
        x = fit(everything)
        inside = (fn(x, everything) - t) / t
        held = np.zeros(len(t))
        for one in sorted(set(shape)):
            test = everything[shape == one]
            held[test] = (fn(fit(everything[shape != one]), test) - t[test]) / t[test]
        long = s >= 8192

        def rms(e):
            return 100 * float(np.sqrt(np.mean(e ** 2)))
        lines.append(f"{label}: fwd {x[0]:.0f} / bwd {x[1]:.0f} TF/s, half {x[2]:.0f} tokens"
                     + (f", fixed {x[3]:.0f} / {x[4]:.0f} us" if len(x) > 3 else "")
                     + f"; in-sample {rms(inside):.1f}% RMS, held-out shape {rms(held):.1f}% "
                       f"(>= 8K tokens: {rms(held[long]):.1f}%)")
    return "\n".join(lines)


def fit_from_runs(profile: str = "h200-x1") -> str:
    """The fields of a profile that only training runs measure, fitted (calibration.from_run) to the Qwen3-4B/8B
    runs of 2026-12-02b/c against ``profile`` with all of them reset, in the order --from-run fits them: the GPU's
    step factor, the loss head's logits bandwidth (with that factor), the CPU update's cost per call (where the
    runs called it at two or more sizes) and its step factor (with all three);
    the held-out architectures' own values beside them, for comparison only (they are the test set)."""
    from dataclasses import replace

    from benchmarks.validate_h200 import new_runs, third_runs
    from slidedp.calibration.from_run import (
        fit_logits_gbps,
        fit_step_compute_factor,
        fit_step_update_factor,
        fit_update_call_us,
        load_record,
    )
    from slidedp.hardware import load_hardware

    hw = load_hardware(profile)
    by_kind = {k: v for k, v in hw.gpu.compute.memory_gbps_by_kind.items() if k != "logits"}
    reset = replace(hw, host=replace(hw.host, step_update_factor=1.0, update_call_us={}),
                    gpu=replace(hw.gpu, compute=replace(hw.gpu.compute, memory_gbps_by_kind=by_kind, step_factor=1.0)))

    with tempfile.TemporaryDirectory() as tmp:
        fit_set = [load_record(p) for p in new_runs(Path(tmp) / "new") + third_runs(Path(tmp) / "third")]
        held = [load_record(p) for p in held_out_dirs(Path(tmp))]
        lines = []
        for label, records in (("02b/02c runs", fit_set), ("held-out runs (not used)", held)):
            base = reset
            step, n_step = fit_step_compute_factor(records, base)
            base = replace(base, gpu=replace(base.gpu, compute=replace(base.gpu.compute, step_factor=step)))
            logits, n_logits = fit_logits_gbps(records, base)
            base = replace(base, gpu=replace(base.gpu, compute=base.gpu.compute.with_module_gbps("logits", logits)))
            calls, call = fit_update_call_us(records, base)
            base = replace(base, host=replace(base.host, update_call_us=calls))
            update, n_update = fit_step_update_factor(records, base)
            call_text = "; ".join(f"{m} {calls[m]:.0f} us" if m in calls else f"{m} not fitted" for m in call) or "-"
            lines.append(f"{label}: gpu.compute.step_factor {step:.4f} ({n_step} GPU-bound runs), logits "
                         f"{logits:.0f} GB/s ({n_logits} runs), host.update_call_us {call_text}, "
                         f"host.step_update_factor {update:.3f} ({n_update} runs)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attention-forms", action="store_true", help="compare the attention cost forms and stop")
    p.add_argument("--fit-from-runs", action="store_true",
                   help="fit the fields only runs measure (GPU and CPU step factors, logits bandwidth) to the "
                   "02b/02c runs and stop")
    p.add_argument("--profile", action="append", metavar="NAME=PROFILE",
                   help="a label and a preset name or profile path; give it once per profile")
    p.add_argument("--sessions", action="store_true",
                   help="add the 43 Qwen3-4B/8B runs of 2026-12-02b/c (benchmarks.validate_h200's sets)")
    p.add_argument("--out", type=Path, help="also write the rows as JSON lines")
    args = p.parse_args(argv)
    if args.attention_forms:
        print(attention_forms())
        return 0
    if args.fit_from_runs:
        print(fit_from_runs())
        return 0
    if not args.profile:
        p.error("give --profile NAME=PROFILE (at least once) or --attention-forms")
    profiles = {}
    for item in args.profile:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            p.error(f"--profile {item!r}: expected NAME=PROFILE")
        profiles[name] = path
    rows = predict(profiles, args.sessions)
    print(report(rows, list(profiles)))
    print(report_units(rows, list(profiles)))
    if args.out:
        for row in rows:
            append_jsonl(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
