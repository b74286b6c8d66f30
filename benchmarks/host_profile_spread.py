"""The same measured peer rows predicted from several host profiles: how much of a peer's error is its model and
how much is the host calibration it was predicted with.

    python -m benchmarks.host_profile_spread --profiles P1.yaml P2.yaml ... --runs DIR/results.jsonl ...

Each ``ok`` row of each ``results.jsonl`` (a peer_compare / peer_validation run) is simulated as the system it
measured (slidedp.report.peers.SIMULATED_AS) with the model it trained (benchmarks.peer_setup.spec_as_trained),
once per profile, nothing fitted. A row whose model is a path that is not on this machine (a device call's /tmp
config) is resolved by its file stem in benchmarks.shape_validation.ARCHS. The table gives, per profile, the host
rates the predictions rest on, the error of every row and, per system, its MAPE, worst error and rows within 10%.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import log, read_jsonl
from benchmarks.peer_predictions import error_summary, error_text, predict
from benchmarks.peer_setup import spec_as_trained
from benchmarks.shape_validation import ARCHS
from benchmarks.zero2_heldout import model_spec
from slidedp.errors import SlideDPError
from slidedp.hardware import HardwareProfile, load_hardware
from slidedp.model_spec import ModelSpec
from slidedp.peers.systems import DEEPSPEED_CPU_ADAM
from slidedp.report.peers import SIMULATED_AS


def row_spec(row: dict) -> ModelSpec:
    """The model a measured row trained: its config name or path, else its stem in ARCHS, as trained."""
    name = row["model"]
    if name.endswith(".json") and not Path(name).exists():
        name = Path(name).stem
        if name not in ARCHS:
            raise SlideDPError(f"{row['model']}: not on this machine and not a benchmarks.shape_validation.ARCHS name")
    return spec_as_trained(model_spec(name), row)


def measured_rows(runs: list[Path]) -> list[dict]:
    """The ``ok`` rows of peer systems the simulator models, each labelled with its run (the results file's
    two parent folders, e.g. ``c48/zero3``)."""
    rows = []
    for path in runs:
        label = "/".join(path.resolve().parent.parts[-2:])
        for row in read_jsonl(path):
            if row.get("status") == "ok" and row.get("system") in SIMULATED_AS:
                missing = {"model", "seq", "batch", "step_time_s"} - set(row)
                if missing:
                    raise SlideDPError(f"{path}: a row lacks {', '.join(sorted(missing))}")
                rows.append({**row, "run": label})
    return rows


def host_rates(hw: HardwareProfile) -> str:
    """The host rates a CPU-bound peer's prediction rests on, each at its curve's largest thread count."""
    h = hw.host
    stream_threads = max(h.stream_gbps)
    text = f"stream {h.stream_gbps[stream_threads]:.0f} GB/s at {stream_threads} threads"
    ds = h.peer_adam_gparams_per_s.get(DEEPSPEED_CPU_ADAM, {})
    if ds:
        text += f", DeepSpeedCPUAdam {ds[max(ds)]:.2f} G params/s at {max(ds)}"
    return text


def spread_table(profiles: list[str], rows: list[dict]) -> str:
    """Per profile: its host rates, every row predicted with it and its error, and each system's summary."""
    lines = []
    for profile in profiles:
        hw = load_hardware(profile)
        errors: dict[str, list[float]] = {}
        lines += ["", f"### {profile} ({host_rates(hw)})", "",
                  "| run | model as trained | system | batch | predicted s | measured s | error |",
                  "|---|---|---|---|---|---|---|"]
        for row in rows:
            spec = row_spec(row)
            pred = predict(SIMULATED_AS[row["system"]], row["model"], hw, row["seq"], row["batch"], spec)
            step, measured = pred.get("step_s"), row["step_time_s"]
            if step is not None:
                errors.setdefault(row["system"], []).append(100 * (step - measured) / measured)
            lines.append(f"| {row['run']} | {spec.name} | {row['system']} | {row['batch']} | "
                         f"{'-' if step is None else f'{step:.3f}'} | {measured:.3f} | "
                         f"{error_text(step, measured) if step is not None else pred.get('refused', '-')} |")
        lines += [""] + [error_summary(system, errs) for system, errs in errors.items()]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", required=True, help="hardware profile files or presets")
    parser.add_argument("--runs", nargs="+", type=Path, required=True, help="results.jsonl files of peer runs")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args()
    try:
        missing = [p for p in args.runs if not p.is_file()]
        if missing:
            raise SlideDPError(f"no such results file: {missing[0]}")
        text = spread_table(args.profiles, measured_rows(args.runs))
    except (SlideDPError, json.JSONDecodeError) as exc:
        print(f"host_profile_spread: {exc}", file=sys.stderr)
        return 2
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
