"""Sequence-tiled layers on one H200 (#19): a Qwen3-14B-wide model at 256K tokens under a hard 80 GiB cap, then
the longest sequence that fits the whole GPU.

    python -m benchmarks.long_seq_tiled --layers 8 --out DIR                 # on the H200
    python -m benchmarks.long_seq_tiled --layers 8 --predict-only --out DIR  # the predictions alone, no GPU

The model is Qwen3-14B's width, vocabulary and head at reduced depth (see benchmarks/long_seq_runs.py: the full
model's host state does not fit the lent host's 128 GiB; every per-layer quantity that decides the fit is the
full model's). For each run the tuner picks the policy under the run's budget (sequence tile included: it tiles
only when no untiled policy fits) and `slidedp train` runs it with ``--gpu-budget``, which sets
``torch.cuda.set_per_process_memory_fraction`` to that budget over the device's memory: an allocation beyond it
fails, so a finished run proves the fit.

  cap    ``--cap-seq`` tokens (262144) within ``--cap-gib`` (80 GiB); if it fails, again with the policy the tuner
         picks for 90%, then 80% of the cap (``--cap-retry``), the cap itself unchanged.
  whole  the longest sequence the memory model predicts for ``--whole-gib`` (the H200's 139 GiB), searched in
         steps of ``--granule`` tokens; the run starts there and steps down a granule after each failure until
         one fits. (`slidedp train`'s preflight refuses a length predicted not to fit, so no run goes past the
         prediction: the measured peak against the predicted one says how much room is left.)

Each row of DIR/results.jsonl holds the tuner's prediction (step time, GPU peak, allocator peak) and the run's
summary (median step time, tokens/s, model TFLOP/s per GPU, measured allocator peak) and the ratio of the measured
peak to the predicted one. ``--seq-tile N`` forces tile N on every run (the CPU test uses it on a tiny model).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import append_jsonl, log, pack, train_run
from benchmarks.long_seq_runs import model_config
from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, HardwareProfile, load_hardware
from slidedp.model import estimate_memory, estimate_step
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.problem import resolve_budget
from slidedp.tune import TuneResult, TuneSpace, tune
from slidedp.workload import StepWorkload

# One sequence per step on one GPU; the routes are moot on one GPU and the threads are the host's.
SPACE = TuneSpace(micro_batches=(1,), thread_fractions=(1.0,), chunks_per_layer=(4, 8))


def tuned(spec: ModelSpec, hw: HardwareProfile, seq: int, gpu_gib: float, seq_tile: int | None) -> TuneResult | None:
    """The tuner's pick for one sequence of ``seq`` tokens within ``gpu_gib`` and the host limit `slidedp train`
    preflights with (None: nothing fits)."""
    space = SPACE if seq_tile is None else replace(SPACE, seq_tiles=(seq_tile,))
    try:
        return tune(spec, hw, seq, 1, resolve_budget(hw, gpu_gib, None), space, refine_top=2)
    except SlideDPError:
        return None


def longest_predicted(spec: ModelSpec, hw: HardwareProfile, gpu_gib: float, granule: int, seq_tile: int | None,
                      upper: int = 1 << 24) -> int:
    """The longest multiple of ``granule`` tokens for which the tuner finds a policy within ``gpu_gib`` (0: none).
    Whether a length fits only gets harder as it grows, so bisection finds it."""
    lo, hi = 0, upper // granule
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tuned(spec, hw, mid * granule, gpu_gib, seq_tile) is not None:
            lo = mid
        else:
            hi = mid - 1
    return lo * granule


def prediction(spec: ModelSpec, hw: HardwareProfile, seq: int, gpu_gib: float, seq_tile: int | None) -> dict:
    """The tuner's policy and predictions for one run, as a results row's fields (with a forced tile: the
    tuner's policy with that tile, predicted by the analytical model)."""
    result = tuned(spec, hw, seq, gpu_gib, seq_tile)
    if result is None:
        return {"predicted_fit": False}
    best = result.best
    step_s = best.sim_step_s if best.sim_step_s is not None else best.estimate.step_time_s
    policy, memory = best.policy, best.memory
    if seq_tile is not None and policy.seq_tile_tokens != seq_tile:
        policy = policy.with_(seq_tile_tokens=seq_tile)
        w = StepWorkload(spec, hw, policy, seq, 1)
        memory, step_s = estimate_memory(w), estimate_step(w, with_memory=False).step_time_s
    return {"predicted_fit": True, "policy": policy.to_dict(), "tuner_step_time_s": step_s,
            "tuner_tokens_per_s": seq / step_s, "tuner_gpu_peak_gib": memory.gpu_peak / GIB,
            "tuner_gpu_allocated_gib": memory.gpu_allocated_peak / GIB}


def run_one(args, config: Path, spec: ModelSpec, hw: HardwareProfile, part: str, seq: int, gpu_gib: float,
            results: Path, plan_gib: float | None = None) -> bool:
    """One `slidedp train` run of ``seq`` tokens under a hard cap of ``gpu_gib`` with the tuner's policy for
    ``plan_gib`` (default: the cap); True if it finished."""
    plan_gib = gpu_gib if plan_gib is None else plan_gib
    row = {"part": part, "seq": seq, "layers": args.layers, "gpu_budget_gib": gpu_gib, "tuned_for_gib": plan_gib,
           **prediction(spec, hw, seq, plan_gib, args.seq_tile)}
    if not row["predicted_fit"] or args.predict_only:
        row["status"] = "predicted only" if row["predicted_fit"] else "not run (no policy predicted to fit)"
        append_jsonl(results, row)
        return row["predicted_fit"]
    tag = f"{part}-{seq}" + ("" if plan_gib == gpu_gib else f"-plan{plan_gib:g}")
    run = Path(args.out) / tag
    policy_path = Path(args.out) / f"policy-{tag}.yaml"
    Policy.from_dict(row["policy"]).save(policy_path)
    t0 = time.perf_counter()
    code, summary = train_run(str(config), seq, policy_path, args.steps, run, hardware=args.hardware,
                              device=args.device, extra=("--gpu-budget", str(gpu_gib)))
    row.update(exit=code, wall_s=time.perf_counter() - t0)
    if summary is not None and code == 0:
        row.update(summary.to_dict(), status="ok")
        measured, predicted = row.get("gpu_peak_gib"), row.get("predicted_gpu_allocated_gib")
        if measured and predicted:
            row["measured_over_predicted_peak"] = measured / predicted
    else:
        row["status"] = f"failed (exit {code})"
    append_jsonl(results, row)
    (run / "trace.parquet").unlink(missing_ok=True)  # keep the transfer small
    log(f"{part} seq {seq}: {row['status']}")
    return row["status"] == "ok"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="qwen3-14b", help="preset or config.json whose width is kept")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hardware", default="h200-x1")
    p.add_argument("--cap-seq", type=int, default=262144)
    p.add_argument("--cap-gib", type=float, default=80.0, help="the hard cap of the first part (GiB)")
    p.add_argument("--cap-retry", type=float, nargs="*", default=[0.9, 0.8],
                   help="after a failed capped run, retry with the tuner planning for these fractions of the cap")
    p.add_argument("--whole-gib", type=float, default=None, help="the whole GPU (default: the profile's memory)")
    p.add_argument("--granule", type=int, default=32768, help="tokens between the lengths the search tries")
    p.add_argument("--max-seq", type=int, default=1 << 22, help="the longest sequence the search considers")
    p.add_argument("--seq-tile", type=int, default=None, help="force this sequence tile (default: the tuner's)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--deadline", type=float, default=1e9, help="start no run after this many seconds")
    p.add_argument("--device", default="auto")
    p.add_argument("--parts", nargs="+", choices=["cap", "whole"], default=["cap", "whole"],
                   help="which parts to run (one device call each fits the 10-minute limit better)")
    p.add_argument("--predict-only", action="store_true", help="write the predictions, run nothing")
    p.add_argument("--out", default="long_seq_tiled")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hw = load_hardware(args.hardware)
    whole_gib = args.whole_gib if args.whole_gib is not None else hw.gpu.memory_gib
    cfg = model_config(args.base, args.layers, max(args.cap_seq, args.max_seq))
    config = out / f"{Path(args.base).stem}-wide-{args.layers}l.json"
    config.write_text(json.dumps(cfg))
    spec = ModelSpec.from_hf_config(cfg, name=config.stem)
    results = out / "results.jsonl"
    start = time.perf_counter()
    in_time = lambda: time.perf_counter() - start < args.deadline  # noqa: E731

    # A failed capped run is retried with a policy planned for less.
    for fraction in (1.0, *args.cap_retry) if "cap" in args.parts else ():
        if not in_time() or run_one(args, config, spec, hw, "cap", args.cap_seq, args.cap_gib, results,
                                    plan_gib=fraction * args.cap_gib):
            break
    if "whole" not in args.parts:
        return _finish(out)
    longest = longest_predicted(spec, hw, whole_gib, args.granule, args.seq_tile, args.max_seq)
    append_jsonl(results, {"part": "whole", "layers": args.layers, "gpu_budget_gib": whole_gib,
                           "granule": args.granule, "longest_predicted_seq": longest, "status": "prediction"})
    log(f"whole GPU ({whole_gib} GiB): longest predicted sequence {longest} tokens")
    seq = longest  # down a granule after each failure, until one fits
    while seq > 0 and in_time() and not run_one(args, config, spec, hw, "whole", seq, whole_gib, results):
        seq -= args.granule
    return _finish(out)


def _finish(out: Path) -> int:
    """The run directories (traces removed) into one archive."""
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    if runs:
        pack(out / "long_seq_tiled.tar.gz", [(run, run.name) for run in runs])
    return 0


if __name__ == "__main__":
    sys.exit(main())
