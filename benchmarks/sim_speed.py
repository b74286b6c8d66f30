"""Speed of the analytical model and the discrete-event simulator (not a test: timings vary by machine).

    python -m benchmarks.sim_speed [--repeats 5]

Times an 80-layer model (Qwen2.5-72B) on 4 GPUs with 8 chunks per layer for every route pair, and the
analytical model on the same configurations: on a fresh workload (its units built and timed too) and with the
units given, as the tuner gives them (it times each set of units once for every policy that shares them,
slidedp.units.unit_inputs). Python runs on one core, so these are one-core figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from slidedp.hardware import load_hardware
from slidedp.model import estimate_step
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.schedule import build_plan
from slidedp.sim import simulate
from slidedp.workload import StepWorkload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # pin to one core
    model, hw = load_model_spec("qwen2.5-72b"), load_hardware("h100-sxm-x4")
    print(f"{'policy':36s} {'ops':>6s} {'DES s':>6s} {'model ms':>8s} {'units given':>11s} {'step s':>7s}")
    for pr, gr, act in [("sharded", "reduce_scatter", "recompute"), ("replicated", "per_rank", "recompute"),
                        ("sharded", "per_rank", "offload"), ("replicated", "reduce_scatter", "keep")]:
        policy = Policy(param_route=pr, grad_route=gr, activation=act, chunks_per_layer=8, accumulation=8)
        w = StepWorkload(model, hw, policy, 4096, 32)
        sim_times, model_times, reused_times = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = simulate(StepWorkload(model, hw, policy, 4096, 32))
            sim_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(100):
                estimate_step(StepWorkload(model, hw, policy, 4096, 32))
            model_times.append((time.perf_counter() - t0) / 100)
            t0 = time.perf_counter()
            for _ in range(100):
                estimate_step(StepWorkload(model, hw, policy, 4096, 32, units=w.units))
            reused_times.append((time.perf_counter() - t0) / 100)
        print(f"{pr + '/' + gr + '/' + act:36s} {len(build_plan(w).ops):6d} {statistics.median(sim_times):6.3f} "
              f"{1e3 * statistics.median(model_times):8.3f} {1e3 * statistics.median(reused_times):11.3f} "
              f"{result.step_time_s:7.2f}")


if __name__ == "__main__":
    main()
