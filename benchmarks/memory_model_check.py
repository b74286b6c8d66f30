"""Predicted GPU peak (memory model) against the peaks measured on the H200 (not a test).

The measurements are torch.cuda.max_memory_allocated, so the like-for-like prediction is the allocated
peak (without the reserve for the CUDA context and allocator slack); the full peak is shown too.

    python -m benchmarks.memory_model_check
"""

from __future__ import annotations

import json
from pathlib import Path

from slidedp.hardware import GIB, load_hardware
from slidedp.model import estimate_memory
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.run_summary import RunSummary
from slidedp.workload import StepWorkload

RESULTS = Path(__file__).parent / "results" / "h200-2026-12-02"
NEW = Path(__file__).parent / "results" / "h200-2026-12-02b"
LONG_POLICY = Policy(activation="recompute", micro_batch=1, accumulation=1, chunks_per_layer=8, prefetch_depth=2)
LONG_RUNS = {32768: 24.4295654296875}  # run32k: summary printed in its log only (see summary_from_log.txt)


def measured_points():
    for name in ("sweep_4b.jsonl", "sweep_8b_b1_b2.jsonl", "sweep_8b_b4_b16.jsonl"):
        for line in (RESULTS / name).read_text().splitlines():
            row = json.loads(line)
            if "model" in row:
                yield (f"{row['model']} batch {row['batch']} ({row['policy']['activation']})", row["model"],
                       Policy.from_dict(row["policy"]), row["seq"], row["batch"], row["gpu_peak_gib"])
    for run in ("run64k", "run128k"):
        summary = RunSummary.load(RESULTS / run / "summary.json")
        yield (f"qwen3-8b {summary.seq} tokens", "qwen3-8b", Policy.from_dict(summary.policy), summary.seq,
               summary.batch, summary.gpu_peak_gib)
    for seq, peak in LONG_RUNS.items():
        yield f"qwen3-8b {seq} tokens", "qwen3-8b", LONG_POLICY, seq, 1, peak
    # Second session: validation runs, the tuned runs of the peer comparison, the 14B-wide long sequences.
    for name in ("calibration/results.jsonl", "peers/results.jsonl", "p8b/results.jsonl"):
        for line in (NEW / name).read_text().splitlines():
            row = json.loads(line)
            if row.get("system", "slidedp") == "slidedp" and row.get("status") == "ok":
                label = row.get("label") or f"{row['model']} batch {row['batch']} tuned"
                yield (f"{label} ({row['policy']['activation']})", row["model"], Policy.from_dict(row["policy"]),
                       row["seq"], row["batch"], row["gpu_peak_gib"])
    wide = str(NEW / "long_seq" / "qwen3-14b-shaped-8l.json")
    for line in (NEW / "long_seq" / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        yield (f"qwen3-14b-wide 8 layers {row['seq']} tokens", wide, Policy.from_dict(row["policy"]), row["seq"],
               row["batch"], row["gpu_peak_gib"])


def main() -> None:
    hw = load_hardware("h200-x1")
    print(f"{'run':34s} {'measured GiB':>12s} {'peak (err)':>16s} {'allocated (err)':>18s}")
    for label, model, policy, seq, batch, peak in measured_points():
        mem = estimate_memory(StepWorkload(load_model_spec(model), hw, policy, seq, batch))
        full, allocated = mem.gpu_peak / GIB, mem.gpu_allocated_peak / GIB
        print(f"{label:34s} {peak:12.1f} {full:8.1f} ({100 * (full - peak) / peak:+5.1f}%) "
              f"{allocated:9.1f} ({100 * (allocated - peak) / peak:+5.1f}%)")


if __name__ == "__main__":
    main()
