"""Validate the simulator against the measured H200 runs, before and after refitting the profile.

    python benchmarks/validate_h200.py [--out validation.csv]

Turns the batch-sweep results (benchmarks/results/h200-2026-12-02/sweep_*.jsonl + traces) into run
directories, adds the 64K-token run, and reports MAPE for: the shipped h200-x1 profile; a profile refitted
on all runs (in-sample); and a profile refitted on the Qwen3-4B runs only, validated on the Qwen3-8B runs
(out-of-sample).
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
from slidedp.report.rundir import write_run_dir

RESULTS = Path(__file__).parent / "results" / "h200-2026-12-02"


def sweep_runs(directory: Path) -> list[Path]:
    runs = []
    for jsonl, traces in (("sweep_4b.jsonl", "sweep_4b_traces.parquet"),
                          ("sweep_8b_b4_b16.jsonl", "sweep_8b_b4_b16_traces.parquet")):
        trace_all = pd.read_parquet(RESULTS / traces)
        for line in (RESULTS / jsonl).read_text().splitlines():
            row = json.loads(line)
            if "model" not in row:
                continue
            label = f"{row['model']}-b{row['batch']}"
            trace = trace_all[trace_all["run"] == label].drop(columns="run").reset_index(drop=True)
            policy = Policy.from_dict(row["policy"])
            summary = {"model": row["model"], "model_spec": load_model_spec(row["model"]).to_dict(),
                       "policy": row["policy"], "seq": row["seq"], "batch": row["batch"], "ranks": 1,
                       "adam_threads": policy.adam_threads, "step_time_s": row["step_time_s"],
                       "limiter": row["limiter"]}
            runs.append(write_run_dir(directory / label, trace, exposure_from_trace(trace), summary))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the per-run table (all profiles) as CSV")
    args = parser.parse_args()
    base = load_hardware("h200-x1")
    with tempfile.TemporaryDirectory() as tmp:
        paths = sweep_runs(Path(tmp)) + [RESULTS / "run64k"]
        records = [load_record(p) for p in paths]
        four_b = [r for r in records if r.label.startswith("qwen3-4b")]
        others = [r for r in records if not r.label.startswith("qwen3-4b")]
        in_sample, _ = refit_profile(base, records)
        from_4b, report = refit_profile(base, four_b)
        tables = {"shipped h200-x1": validate(records, base), "refit on all (in-sample)": validate(records, in_sample),
                  "refit on 4B, tested on 8B + 64K": validate(others, from_4b)}
        for name, table in tables.items():
            print(f"{name}: MAPE {mape(table):.1f}% over {len(table)} runs, limiter matches "
                  f"{int(table.limiter_match.sum())}/{len(table)}")
            print(table.round(3).to_string(index=False))
        print("refit on 4B:", report)
        if args.out:
            pd.concat([t.assign(profile=n) for n, t in tables.items()]).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
