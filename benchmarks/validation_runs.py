"""Runs of the streaming runtime under hand-picked policies, for validating the simulator.

    python -m benchmarks.validation_runs --model qwen3-4b --out DIR [--steps 3] [--deadline 240]

The set varies what the simulator must get right: batch, sequence length (1K-32K), chunking (2-16 per
layer), activation policy (keep / recompute / offload), gradient accumulation, prefetch depth and (--set
gpu_state) how many leading units keep their optimizer state on the GPU. The host
state is allocated once. Each run becomes a run directory under DIR/runs (trace, exposure, summary), packed
into DIR/validation_runs.tar.gz; `slidedp validate DIR/runs/* --hardware PROFILE` then gives the MAPE.
Runs stop being started once --deadline seconds have passed (the rest are listed as not run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import append_jsonl, log, model_label, pack
from benchmarks.streaming_measure import StreamingModel, measure_policy, save_run_dir
from slidedp.hardware import load_hardware
from slidedp.policy import Policy
from slidedp.runtime.device import Device

# (label, seq, global batch, policy fields): micro_batch x accumulation = global batch.
RUNS: list[tuple[str, int, int, dict]] = [
    ("s1024-b8-keep-c4", 1024, 8, dict(activation="keep", micro_batch=8, chunks_per_layer=4)),
    ("s2048-b4-recompute-c4", 2048, 4, dict(activation="recompute", micro_batch=4, chunks_per_layer=4)),
    ("s4096-b2-keep-accum2-c16", 4096, 2, dict(activation="keep", micro_batch=1, accumulation=2,
                                                 chunks_per_layer=16)),
    ("s4096-b4-offload-c4", 4096, 4, dict(activation="offload", micro_batch=4, chunks_per_layer=4)),
    ("s4096-b8-recompute-c2-p1", 4096, 8, dict(activation="recompute", micro_batch=8, chunks_per_layer=2,
                                                 prefetch_depth=1)),
    ("s4096-b16-offload-c8", 4096, 16, dict(activation="offload", micro_batch=16, chunks_per_layer=8)),
    ("s8192-b1-keep-c8", 8192, 1, dict(activation="keep", micro_batch=1, chunks_per_layer=8)),
    ("s8192-b2-offload-c8", 8192, 2, dict(activation="offload", micro_batch=2, chunks_per_layer=8)),
    ("s16384-b1-recompute-c16", 16384, 1, dict(activation="recompute", micro_batch=1, chunks_per_layer=16)),
    ("s32768-b1-recompute-c8", 32768, 1, dict(activation="recompute", micro_batch=1, chunks_per_layer=8)),
]
# Leading units' optimizer state held on the GPU (Policy.gpu_state_units; Qwen3-4B has 38 units): from a few
# units to all of them, across batch, sequence length and activation policy.
GPU_STATE_RUNS: list[tuple[str, int, int, dict]] = [
    ("s4096-b1-keep-c4-g38", 4096, 1, dict(activation="keep", micro_batch=1, chunks_per_layer=4, gpu_state_units=38)),
    ("s4096-b2-recompute-c4-g20", 4096, 2, dict(activation="recompute", micro_batch=2, chunks_per_layer=4,
                                                  gpu_state_units=20)),
    ("s4096-b4-recompute-c8-g12", 4096, 4, dict(activation="recompute", micro_batch=4, chunks_per_layer=8,
                                                  gpu_state_units=12)),
    ("s4096-b8-offload-c8-g28", 4096, 8, dict(activation="offload", micro_batch=8, chunks_per_layer=8,
                                                gpu_state_units=28)),
    ("s2048-b4-keep-c4-g8", 2048, 4, dict(activation="keep", micro_batch=4, chunks_per_layer=4, gpu_state_units=8)),
    ("s8192-b1-recompute-c4-g30", 8192, 1, dict(activation="recompute", micro_batch=1, chunks_per_layer=4,
                                                  gpu_state_units=30)),
    ("s4096-b16-recompute-c2-g38", 4096, 16, dict(activation="recompute", micro_batch=16, chunks_per_layer=2,
                                                    gpu_state_units=38)),
    ("s16384-b1-recompute-c8-g16", 16384, 1, dict(activation="recompute", micro_batch=1, chunks_per_layer=8,
                                                    gpu_state_units=16)),
]
SETS = {"host": RUNS, "gpu_state": GPU_STATE_RUNS, "all": RUNS + GPU_STATE_RUNS}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-4b")
    p.add_argument("--profile", default="h200-x1", help="profile for the prediction printed beside each run")
    p.add_argument("--steps", type=int, default=3, help="steps per run; the first is warm-up")
    p.add_argument("--device", default="cuda")
    p.add_argument("--deadline", type=float, default=1e9, help="start no run after this many seconds")
    p.add_argument("--only", nargs="*", help="labels to run (default: all of the set)")
    p.add_argument("--set", choices=sorted(SETS), default="host",
                   help="host: every optimizer state on the host (default); gpu_state: leading units held on the "
                        "GPU; all: both")
    p.add_argument("--out", default="validation")
    args = p.parse_args()
    out = Path(args.out)
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    hw = load_hardware(args.profile)
    sm = StreamingModel.open(args.model, Device(args.device), log)
    selected = [r for r in SETS[args.set] if not args.only or r[0] in args.only]
    results = out / "results.jsonl"
    for label, seq, batch, fields in selected:
        if time.perf_counter() - start > args.deadline:
            log(f"{label}: not run (deadline)")
            append_jsonl(results, {"label": label, "status": "not run (deadline)"})
            continue
        units = sm.spec.layers + 2  # a smaller model (the CPU test's) holds at most all of its units
        policy = Policy(**{**fields, "gpu_state_units": min(fields.get("gpu_state_units", 0), units)})
        try:
            row, trace = measure_policy(sm, hw, policy, seq, batch, args.steps)
        except torch.OutOfMemoryError as exc:
            log(f"{label}: out of GPU memory ({str(exc).splitlines()[0][:120]})")
            append_jsonl(results, {"label": label, "status": "oom"})
            torch.cuda.empty_cache()
            continue
        name = f"{model_label(args.model)}-{label}"  # a preset name, or a config file's stem
        save_run_dir(runs_dir, name, row, trace, sm.spec)
        row["label"] = name
        append_jsonl(results, row)
        log(f"{name}: {row['step_time_s']:.3f} s/step (steps {[round(t, 3) for t in row['step_times_s']]}), "
            f"limiter {row['limiter']}, peak {row['gpu_peak_gib']:.1f} GiB; {args.profile} predicts "
            f"{row['predicted_step_time_s']:.3f} s ({row['predicted_limiter']})")
    sm.close()
    pack(out / "validation_runs.tar.gz", [(runs_dir, "runs")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
