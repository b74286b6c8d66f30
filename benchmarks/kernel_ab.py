"""A/B of the CPU update between an earlier build of the kernel and the current one: the exact update
(``adamw_bf16``) or, with ``--state``, a compact mode's (``adamw_compact``), on the same tensors, calls
alternating, median of --repeats, so a kernel change is timed against what it replaces on the same machine at
the same moment. An earlier build is the ``.so`` that torch left in its extension cache
under that revision's KERNEL_NAME (runtime/cpu_adam.py), e.g.

    python -m benchmarks.kernel_ab ~/.cache/torch_extensions/slidedp_cpu_adam_v5/slidedp_cpu_adam_v5.so \\
        --params 16000000 64000000 --threads 1 2
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path


def load_build(path: Path):
    """The extension module in ``path`` (its module name is the file's stem up to the first dot)."""
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exact_step(n: int):
    """``step(kernel, k)``: one exact update by ``kernel`` on fp32 state and a bf16 slot of ``n`` elements."""
    import torch

    from slidedp.runtime.host_state import placed_copy

    p, m, v = placed_copy(torch.randn(n)), placed_copy(torch.randn(n) * 1e-3), placed_copy(torch.rand(n) * 1e-6)
    slot = placed_copy(torch.randn(n).bfloat16())
    return lambda kernel, k: kernel.adamw_bf16(p, m, v, slot, 1e-5, 0.9, 0.95, 1e-8, 0.0, float(k), 1.0)


def time_ab(old, new, n: int, threads: int, repeats: int, state: str = "fp32") -> dict[str, float]:
    """G params/s of each build's update of ``n`` parameters in ``state`` (fp32: the exact update)."""
    import torch

    torch.set_num_threads(threads)
    if state == "fp32":
        step = _exact_step(n)
    else:
        from slidedp.calibration.host_bench import compact_state_step
        from slidedp.state_precision import StatePrecision

        step = compact_state_step(StatePrecision.parse(state), n)
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    builds = [("old", old), ("new", new)]
    for k in range(1, repeats + 2):  # the first round warms both up and is not counted
        for name, kernel in builds if k % 2 else builds[::-1]:  # each goes first every other round
            t0 = time.perf_counter()
            step(kernel, k)
            if k > 1:
                seconds[name].append(time.perf_counter() - t0)
    return {name: n / statistics.median(t) / 1e9 for name, t in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path, help="the earlier build's .so")
    ap.add_argument("--params", type=int, nargs="+", default=[16_000_000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--state", default="fp32", help="host state mode (fp32: the exact update; e.g. bf16+int8)")
    args = ap.parse_args(argv)
    from slidedp.errors import SlideDPError
    from slidedp.state_precision import StatePrecision

    try:
        args.state = StatePrecision.parse(args.state).name
    except (SlideDPError, ValueError) as exc:
        print(f"kernel_ab: error: {exc}", file=sys.stderr)
        return 2
    if not args.old.is_file():
        print(f"kernel_ab: error: no such build: {args.old}", file=sys.stderr)
        return 2
    from slidedp.runtime.cpu_adam import KERNEL_NAME, fused_kernel, fused_kernel_error

    new = fused_kernel()
    if new is None:
        print(f"kernel_ab: error: the current kernel does not build here: {fused_kernel_error()}", file=sys.stderr)
        return 2
    old = load_build(args.old)
    print(f"old: {args.old.name}; new: {KERNEL_NAME}; state {args.state} (G params/s, median of {args.repeats})")
    print(f"{'params':>12} {'threads':>7} {'old':>8} {'new':>8} {'ratio':>6}")
    for n in args.params:
        for threads in args.threads:
            r = time_ab(old, new, n, threads, args.repeats, args.state)
            print(f"{n:>12,} {threads:>7} {r['old']:>8.3f} {r['new']:>8.3f} {r['new'] / r['old']:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
