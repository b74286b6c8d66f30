"""How long `slidedp tune` takes for the default search space (not a test).

    python -m benchmarks.tune_speed

Prints, per problem, how many candidates were enumerated, how many fit, and the wall time including
the simulator refinement of the top 6.
"""

from __future__ import annotations

import time

from slidedp.model_spec import load_model_spec
from slidedp.problem import resolve_budget, resolve_hardware
from slidedp.tune import tune

PROBLEMS = [("qwen3-14b", "h100-sxm-x4", 4096, 32), ("qwen3-8b", "h200-x1", 4096, 8),
            ("qwen2.5-72b", "rtx4090-x4", 4096, 16), ("llama-3-70b", "h100-sxm-x8", 4096, 64)]


def main() -> None:
    print(f"{'problem':44s} {'enumerated':>10s} {'feasible':>9s} {'seconds':>8s}  best (simulated step s)")
    for model, hardware, seq, batch in PROBLEMS:
        hw = resolve_hardware(hardware, None)
        t0 = time.perf_counter()
        result = tune(load_model_spec(model), hw, seq, batch, resolve_budget(hw, None, None))
        dt = time.perf_counter() - t0
        print(f"{f'{model} {hardware} seq {seq} batch {batch}':44s} {result.enumerated:10d} "
              f"{len(result.candidates):9d} {dt:8.2f}  {result.best.sim_step_s:.3f}")


if __name__ == "__main__":
    main()
