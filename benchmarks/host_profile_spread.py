"""The same measured peer rows predicted from several host profiles: how much of a peer's error is its model and
how much is the host calibration it was predicted with.

    python -m benchmarks.host_profile_spread --profiles P1.yaml P2.yaml ... --runs DIR/results.jsonl ...

Each ``ok`` row of each ``results.jsonl`` (a peer_compare / peer_validation run) is simulated as the system it
measured (slidedp.report.peers.SIMULATED_AS) with the model it trained (benchmarks.peer_setup.spec_as_trained),
once per profile, nothing fitted. A row whose model is a path that is not on this machine (a device call's /tmp
config) is resolved by its file stem in benchmarks.shape_validation.ARCHS. The table gives, per profile, the host
rates the predictions rest on and the error of every row; the summary line per profile its MAPE.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import log
from benchmarks.peer_predictions import error_text, predict
from benchmarks.peer_setup import spec_as_trained
from benchmarks.shape_validation import ARCHS
from slidedp.hardware import HardwareProfile, load_hardware
from slidedp.model_spec import ModelSpec, load_model_spec
from slidedp.peers.systems import DEEPSPEED_CPU_ADAM
from slidedp.report.peers import SIMULATED_AS


def row_spec(row: dict) -> ModelSpec:
    """The model a measured row trained: its config name or path, else its stem in ARCHS, as trained."""
    model = row["model"]
    if model.endswith(".json") and not Path(model).exists():
        stem = Path(model).stem
        if stem not in ARCHS:
            raise SystemExit(f"{model}: not on this machine and not a benchmarks.shape_validation.ARCHS name")
        spec = ModelSpec.from_hf_config(ARCHS[stem], name=stem)
    else:
        spec = load_model_spec(model)
    return spec_as_trained(spec, row)


def measured_rows(runs: list[Path]) -> list[dict]:
    rows = []
    for path in runs:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("status") == "ok" and row.get("system") in SIMULATED_AS:
                rows.append({**row, "run": path.parent.name})
    return rows


def host_rates(hw: HardwareProfile) -> str:
    """The host rates a CPU-bound peer's prediction rests on, at the host's largest thread count."""
    h = hw.host
    threads = max(h.stream_gbps)
    ds = h.peer_adam_gparams_per_s.get(DEEPSPEED_CPU_ADAM, {})
    ds_rate = f"{ds[max(ds)]:.2f}" if ds else "-"
    return f"stream {h.stream_gbps[threads]:.0f} GB/s, DeepSpeedCPUAdam {ds_rate} G/s at {threads} threads"


def spread_table(profiles: list[Path], rows: list[dict]) -> str:
    lines = []
    for profile in profiles:
        hw = load_hardware(str(profile))
        errors: dict[str, list[float]] = {}
        lines += ["", f"### {profile} ({host_rates(hw)})", "",
                  "| run | model as trained | system | batch | predicted s | measured s | error |",
                  "|---|---|---|---|---|---|---|"]
        for row in rows:
            spec = row_spec(row)
            pred = predict(SIMULATED_AS[row["system"]], row["model"], hw, row["seq"], row["batch"], spec)
            step = pred.get("step_s")
            if step is not None:
                errors.setdefault(row["system"], []).append(abs(step / row["step_time_s"] - 1))
            lines.append(f"| {row['run']} | {spec.name} | {row['system']} | {row['batch']} | "
                         f"{'-' if step is None else f'{step:.3f}'} | {row['step_time_s']:.3f} | "
                         f"{error_text(step, row['step_time_s']) if step is not None else pred.get('refused', '-')} |")
        lines.append("")
        for system, errs in errors.items():
            lines.append(f"- {system}: MAPE {100 * sum(errs) / len(errs):.1f}%, worst {100 * max(errs):.1f}%, "
                         f"{sum(e <= 0.10 for e in errs)} of {len(errs)} within 10%")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", type=Path, required=True, help="hardware profile files or presets")
    parser.add_argument("--runs", nargs="+", type=Path, required=True, help="results.jsonl files of peer runs")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args()
    missing = [p for p in args.runs if not p.is_file()]
    if missing:
        print(f"no such results file: {missing[0]}", file=sys.stderr)
        return 2
    text = spread_table(args.profiles, measured_rows(args.runs))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
