"""Validate the simulator against the measured H200 runs.

    python -m benchmarks.validate_h200 [--out validation.csv]

Main set: the 20 runs of the second session (benchmarks/results/h200-2026-12-02b: 10 hand-picked policies
over seq 1K-32K, chunking, activation policy, accumulation and prefetch, plus the 10 tuned Qwen3-4B/8B runs
of the peer comparison). Profiles: the probe-based one used before calibration; `slidedp calibrate`'s output
as produced on the device; the shipped h200-x1 (that output with the max-observed-traffic DRAM rule);
that profile refitted from half the runs and tested on the other half. Also: the shipped profile on the
first session's 9 runs (another machine of the same kind, another day). Third set: the third session's 23 runs
(benchmarks/results/h200-2026-12-02c), where leading units keep their optimizer state on the GPU
(Policy.gpu_state_units): 8 hand-picked, 5 tuned Qwen3-4B and 5 tuned Qwen3-8B runs, plus 5 tuned Qwen3-4B runs
with every optimizer state on the host.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pandas as pd

from slidedp.calibration.from_run import load_record, mape, refit_profile, validate
from slidedp.exposure import exposure_from_trace
from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.report.rundir import unpack_session, write_run_dir
from slidedp.run_summary import RunSummary

RESULTS = Path(__file__).parent / "results" / "h200-2026-12-02"
NEW = Path(__file__).parent / "results" / "h200-2026-12-02b"
THIRD = Path(__file__).parent / "results" / "h200-2026-12-02c"


def sweep_runs(directory: Path, first: Path) -> list[Path]:
    """The first session's batch sweeps as run directories under ``directory``, cut from the per-sweep trace
    files of ``first`` (that session's folder, unpacked)."""
    runs = []
    for jsonl, traces in (("sweep_4b.jsonl", "sweep_4b_traces.parquet"),
                          ("sweep_8b_b4_b16.jsonl", "sweep_8b_b4_b16_traces.parquet")):
        trace_all = pd.read_parquet(first / traces)
        for line in (first / jsonl).read_text().splitlines():
            row = json.loads(line)
            if "model" not in row:
                continue
            label = f"{row['model']}-b{row['batch']}"
            trace = trace_all[trace_all["run"] == label].drop(columns="run").reset_index(drop=True)
            policy = Policy.from_dict(row["policy"])
            summary = RunSummary(model=row["model"], model_spec=load_model_spec(row["model"]).to_dict(),
                                 policy=row["policy"], seq=row["seq"], batch=row["batch"], ranks=1,
                                 adam_threads=policy.adam_threads, step_time_s=row["step_time_s"],
                                 limiter=row["limiter"])
            runs.append(write_run_dir(directory / label, trace, exposure_from_trace(trace), summary))
    return runs


def session_runs(tree: Path, folders: list[str]) -> list[Path]:
    """The run directories in ``folders`` of an unpacked session, in the order the refit's even/odd halves have
    always used: by (runs | slidedp_runs, run name), as when the drivers' tarballs were unpacked into one place."""
    runs = [p for folder in folders for p in (tree / folder).iterdir() if (p / "summary.json").exists()]
    return sorted(runs, key=lambda p: (p.parent.name, p.name))


def new_runs(directory: Path) -> list[Path]:
    """The 20 runs of the second H200 session: 10 hand-picked policies + the 10 tuned peer-comparison runs."""
    return session_runs(unpack_session(NEW, directory), ["calibration/runs", "peers/slidedp_runs", "p8b/slidedp_runs"])


def third_runs(directory: Path) -> list[Path]:
    """The 23 runs of the third H200 session (GPU-held optimizer state; the host-only tuned runs)."""
    return session_runs(unpack_session(THIRD, directory), ["validation/runs", "peers/slidedp_runs",
                                                           "host/slidedp_runs", "p8b/slidedp_runs"])


def two_fold(base, records):
    """Refit from half of the runs (even/odd), predict the other half; both halves' held-out errors."""
    halves = (records[::2], records[1::2])
    tables = []
    for fit_on, test_on in (halves, halves[::-1]):
        refit, _ = refit_profile(base, fit_on)
        tables.append(validate(test_on, refit))
    return pd.concat(tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the per-run table (all profiles) as CSV")
    args = parser.parse_args()
    probe = load_hardware(str(NEW / "calibration" / "h200-x1-probe.yaml"))
    raw = load_hardware(str(NEW / "calibration" / "h200-calibrated.yaml"))
    shipped = load_hardware("h200-x1")
    with tempfile.TemporaryDirectory() as tmp:
        records = [load_record(p) for p in new_runs(Path(tmp) / "new")]
        first = unpack_session(RESULTS, Path(tmp) / "first")
        old = [load_record(p) for p in sweep_runs(Path(tmp) / "old", first) + [first / "run64k"]]
        third = [load_record(p) for p in third_runs(Path(tmp) / "third")]
        tables = {
            "probe profile (before calibration)": validate(records, probe),
            "slidedp calibrate output (copy-pass DRAM rule)": validate(records, raw),
            "h200-x1 = calibrate output, max-traffic DRAM rule": validate(records, shipped),
            "h200-x1 + refit from half the runs, held-out half": two_fold(shipped, records),
            "h200-x1 on the first session's 9 runs": validate(old, shipped),
            "h200-x1 on the third session's 23 runs (GPU-held state)": validate(third, shipped),
            "h200-x1 on the second and third sessions' 43 runs": validate(records + third, shipped),
        }
        for name, table in tables.items():
            print(f"{name}: MAPE {mape(table):.1f}% (max {table.error_percent.abs().max():.1f}%) over {len(table)} "
                  f"runs, limiter matches {int(table.limiter_match.sum())}/{len(table)}")
        print(tables["h200-x1 = calibrate output, max-traffic DRAM rule"].round(3).to_string(index=False))
        print(tables["h200-x1 on the third session's 23 runs (GPU-held state)"].round(3).to_string(index=False))
        if args.out:
            pd.concat([t.assign(profile=n) for n, t in tables.items()]).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
