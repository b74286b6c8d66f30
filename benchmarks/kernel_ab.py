"""A/B of the exact CPU update (``adamw_bf16``) between an earlier build of the kernel and the current one, on the
same tensors, calls alternating, median of --repeats, so a kernel change is timed against what it replaces on
the same machine at the same moment. An earlier build is the ``.so`` that torch left in its extension cache
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


def time_ab(old, new, n: int, threads: int, repeats: int) -> dict[str, float]:
    """G params/s of each build's adamw_bf16 on one set of fp32 state and a bf16 slot of ``n`` elements."""
    import torch

    from slidedp.runtime.host_state import placed_copy

    torch.set_num_threads(threads)
    p, m, v = placed_copy(torch.randn(n)), placed_copy(torch.randn(n) * 1e-3), placed_copy(torch.rand(n) * 1e-6)
    slot = placed_copy(torch.randn(n).bfloat16())
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    builds = [("old", old), ("new", new)]
    for step in range(1, repeats + 2):  # the first round warms both up and is not counted
        for name, kernel in builds if step % 2 else builds[::-1]:  # each goes first every other round
            t0 = time.perf_counter()
            kernel.adamw_bf16(p, m, v, slot, 1e-5, 0.9, 0.95, 1e-8, 0.0, float(step), 1.0)
            if step > 1:
                seconds[name].append(time.perf_counter() - t0)
    return {name: n / statistics.median(t) / 1e9 for name, t in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path, help="the earlier build's .so")
    ap.add_argument("--params", type=int, nargs="+", default=[16_000_000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if not args.old.is_file():
        print(f"kernel_ab: error: no such build: {args.old}", file=sys.stderr)
        return 2
    from slidedp.runtime.cpu_adam import KERNEL_NAME, fused_kernel, fused_kernel_error

    new = fused_kernel()
    if new is None:
        print(f"kernel_ab: error: the current kernel does not build here: {fused_kernel_error()}", file=sys.stderr)
        return 2
    old = load_build(args.old)
    print(f"old: {args.old.name}; new: {KERNEL_NAME} (G params/s, median of {args.repeats})")
    print(f"{'params':>12} {'threads':>7} {'old':>8} {'new':>8} {'ratio':>6}")
    for n in args.params:
        for threads in args.threads:
            r = time_ab(old, new, n, threads, args.repeats)
            print(f"{n:>12,} {threads:>7} {r['old']:>8.3f} {r['new']:>8.3f} {r['new'] / r['old']:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
