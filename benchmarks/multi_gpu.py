"""The multi-GPU runs of one host, in one invocation: correctness, routes, strong scaling, host memory.

    python -m benchmarks.multi_gpu --model qwen3-14b --gpus 4 --seq 4096 --batches 16 64 256 --out DIR

1. correctness: `slidedp train --nproc N` against `--nproc 1` at the same global batch, same data and
   init: per-step losses (bf16 tolerance) for N = 2 and N = --gpus;
2. routes: every parameter route x gradient route at each batch (256 x 4096 = 1M tokens per step), with the
   step time, tokens/s, the limiter and exposure from the trace, and rank 0's RSS next to the shared state;
3. strong scaling: the tuned policy at a fixed global batch on 1, 2, ..., --gpus GPUs;
4. predicted vs measured for every run (`slidedp validate DIR/runs/*` gives the MAPE).
The peers on N GPUs: `python -m benchmarks.peer_compare --gpus N`. Rows go to DIR/results.jsonl as they finish;
run directories to DIR/runs. Runs stop being started after --deadline seconds.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from benchmarks.common import append_jsonl, log, train_run
from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.policy import GRAD_ROUTES, PARAM_ROUTES, Policy
from slidedp.problem import resolve_budget
from slidedp.report.rundir import load_run
from slidedp.runtime.device import cuda_memory_gib
from slidedp.tune import tune


class Runner:
    """Runs `slidedp train` and keeps one row per run."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        (self.out / "runs").mkdir(parents=True, exist_ok=True)
        self.start = time.perf_counter()
        self.hw = load_hardware(args.hardware)
        self.spec = load_model_spec(args.model)

    def tuned(self, gpus: int, batch: int) -> Policy:
        hw = self.hw.with_gpus(gpus)
        budget = resolve_budget(hw, None, hw.host.memory_gib, cuda_memory_gib(self.args.device))
        return tune(self.spec, hw, self.args.seq, batch, budget, refine_top=2).best.policy

    def train(self, experiment: str, label: str, gpus: int, batch: int, policy: Policy, steps: int) -> dict:
        row = {"experiment": experiment, "label": label, "gpus": gpus, "batch": batch, "seq": self.args.seq,
               "tokens_per_step": batch * self.args.seq, "policy": policy.to_dict()}
        if time.perf_counter() - self.start > self.args.deadline:
            row["status"] = "not run (deadline)"
            return self._keep(row)
        run = self.out / "runs" / label
        policy_path = self.out / "runs" / f"{label}.policy.yaml"
        policy.save(policy_path)
        code, s = train_run(self.args.model, self.args.seq, policy_path, steps, run, batch=batch, nproc=gpus,
                            hardware=self.args.hardware, device=self.args.device, extra=("--seed", "0"))
        if code != 0 or s is None:
            row["status"] = f"failed (exit {code})"
            return self._keep(row)
        exposure = load_run(run).exposure.drop(columns="rank").iloc[0].to_dict()  # rank 0's
        with (run / "metrics.csv").open() as fh:
            losses = [float(r["loss"]) for r in csv.DictReader(fh)]
        row.update(status="ok", losses=losses, exposure_s=exposure,
                   **{k: getattr(s, k) for k in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "limiter",
                                            "predicted_step_time_s", "predicted_limiter", "gpu_peak_gib",
                                            "host_rss_peak_gib", "host_state_bytes_per_param")})
        return self._keep(row)

    def _keep(self, row: dict) -> dict:
        append_jsonl(self.out / "results.jsonl", row)
        shown = {k: row.get(k) for k in ("label", "status", "step_time_s", "tokens_per_s", "limiter",
                                         "predicted_step_time_s", "host_rss_peak_gib")}
        log(f"  {shown}")
        return row


def correctness(r: Runner, batch: int) -> None:
    """N ranks against one at the same global batch: the per-step losses must agree (bf16 tolerance)."""
    policy = Policy(micro_batch=1, accumulation=batch, activation="recompute", chunks_per_layer=4)
    one = r.train("correctness", f"correct-g1-b{batch}", 1, batch, policy, r.args.check_steps)
    for gpus in sorted({2, r.args.gpus}):
        if gpus > r.args.gpus or batch % gpus:
            continue
        many = r.train("correctness", f"correct-g{gpus}-b{batch}", gpus, batch,
                       Policy(micro_batch=1, accumulation=batch // gpus, activation="recompute", chunks_per_layer=4),
                       r.args.check_steps)
        if one.get("status") == many.get("status") == "ok":
            diff = max(abs(a - b) for a, b in zip(one["losses"], many["losses"], strict=True))
            log(f"correctness: {gpus} GPUs vs 1, max loss difference {diff:.2e}")
            r._keep({"experiment": "correctness-summary", "label": f"correct-g{gpus}-vs-g1-b{batch}", "gpus": gpus,
                     "batch": batch, "max_loss_diff": diff,
                     "status": "ok" if diff < 2e-2 else "MISMATCH"})


def routes(r: Runner) -> None:
    gpus = r.args.gpus
    for batch in r.args.batches:
        base = r.tuned(gpus, batch)
        for p_route in PARAM_ROUTES:
            for g_route in GRAD_ROUTES:
                policy = Policy.from_dict({**base.to_dict(), "param_route": p_route, "grad_route": g_route})
                r.train("routes", f"routes-g{gpus}-b{batch}-{p_route}-{g_route}", gpus, batch, policy, r.args.steps)


def strong_scaling(r: Runner) -> None:
    batch = r.args.scaling_batch
    gpus = 1
    while gpus <= r.args.gpus:
        if batch % gpus == 0:
            r.train("scaling", f"scaling-g{gpus}-b{batch}", gpus, batch, r.tuned(gpus, batch), r.args.steps)
        gpus *= 2


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-14b")
    p.add_argument("--hardware", default="h200-x1", help="profile whose GPU count is set to each run's")
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--scaling-batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--check-steps", type=int, default=4)
    p.add_argument("--device", default="auto")
    p.add_argument("--deadline", type=float, default=1e9, help="start no run after this many seconds")
    p.add_argument("--only", nargs="*", choices=["correctness", "routes", "scaling"], default=None)
    p.add_argument("--out", default="multi_gpu")
    args = p.parse_args()
    r = Runner(args)
    parts = args.only or ["correctness", "routes", "scaling"]
    if "correctness" in parts:
        correctness(r, args.gpus * 2)
    if "routes" in parts:
        routes(r)
    if "scaling" in parts:
        strong_scaling(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
