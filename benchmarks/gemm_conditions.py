"""One decoder layer's GEMMs timed under the conditions that could explain why a step runs them faster than the
calibration's micro-benchmarks say.

    python -m benchmarks.gemm_conditions --out gemms.jsonl [--tokens 32768 4096]    # on a GPU host
    python -m benchmarks.gemm_conditions --compare gemms.jsonl --profile PROFILE    # beside the fitted curve

Why: in a GPU-resident Qwen3-4B step on an H100 (benchmarks/RESULTS.md, c56 against c65's curves) cuBLAS ran the
layer's GEMMs at about 790 TFLOP/s on average, faster than any calibration sample (at most 765) and 13-15% faster
than the fitted curve prices them. The calibration times ``torch.mm`` of two ``randn`` matrices, 20 calls back to
back (calibration.shape_bench.Timer); a step runs ``F.linear`` (x @ W^T) over small weights, in forward and in the
two backward layouts, with memory-bound kernels between the GEMMs. Each Qwen3-4B layer GEMM shape is timed:

- ``mm_randn``: as calibrate does (Timer, torch.mm, randn operands);
- ``linear_randn``: F.linear's layout, weights randn * 0.02 (an initialised layer's scale), Timer;
- ``linear_zeros``: the same over zeros (the least switching power a GEMM can draw), Timer;
- ``kernel_alone``: linear_randn's kernel time by torch.profiler, 20 calls back to back;
- ``kernel_interleaved``: the same GEMM kernels with an elementwise pass over the output after each (as a layer runs
  them), the GEMM kernels' time alone by the profiler;
- ``grad_input`` / ``grad_weight``: the two backward GEMMs of F.linear by autograd (profiler kernel times).

Writes one JSON line per shape and condition: seconds per call and TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import read_jsonl
from benchmarks.resident_kernels import kernel_seconds
from slidedp.errors import SlideDPError

# Qwen3-4B's layer projections as (out, in): q, k and v, o, gate and up, down.
LAYER_PROJECTIONS = ((4096, 2560), (1024, 2560), (2560, 4096), (9728, 2560), (2560, 9728))
CALLS = 20


def profiled_gemm_seconds(fn, calls: int) -> float:
    """Mean CUDA time of the GEMM kernels ``fn`` launches, per call (benchmarks.resident_kernels.kernel_seconds)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(seconds for _, kind, seconds in kernel_seconds(prof) if kind == "gemm") / calls


def measure(tokens: int, projections=LAYER_PROJECTIONS) -> list[dict]:
    """Every condition of the module docstring for each projection over ``tokens`` tokens (a GPU is needed)."""
    import torch
    import torch.nn.functional as F

    from calibration.shape_bench import Timer

    dev, dt = torch.device("cuda"), torch.bfloat16
    timer = Timer(dev, 10, 2.0)
    rows = []
    for out_f, in_f in projections:
        flops = 2.0 * tokens * out_f * in_f
        a, b = torch.randn(tokens, in_f, dtype=dt, device=dev), torch.randn(in_f, out_f, dtype=dt, device=dev)
        x = torch.randn(tokens, in_f, dtype=dt, device=dev, requires_grad=True)
        w = (torch.randn(out_f, in_f, dtype=dt, device=dev) * 0.02).requires_grad_()
        xz, wz = torch.zeros_like(x), torch.zeros_like(w)
        grad = torch.randn(tokens, out_f, dtype=dt, device=dev)
        seconds = {
            "mm_randn": timer.seconds(lambda a=a, b=b: torch.mm(a, b)),
            "linear_randn": timer.seconds(lambda x=x, w=w: F.linear(x.detach(), w.detach())),
            "linear_zeros": timer.seconds(lambda xz=xz, wz=wz: F.linear(xz, wz)),
            "kernel_alone": profiled_gemm_seconds(lambda x=x, w=w: F.linear(x.detach(), w.detach()), CALLS),
            "kernel_interleaved": profiled_gemm_seconds(
                lambda x=x, w=w: F.linear(x.detach(), w.detach()).mul_(1.0), CALLS),
        }
        y = F.linear(x, w)
        seconds["grad_input"] = profiled_gemm_seconds(
            lambda y=y, x=x, grad=grad: torch.autograd.grad(y, x, grad, retain_graph=True), CALLS)
        seconds["grad_weight"] = profiled_gemm_seconds(
            lambda y=y, w=w, grad=grad: torch.autograd.grad(y, w, grad, retain_graph=True), CALLS)
        for condition, s in seconds.items():
            rows.append({"tokens": tokens, "out": out_f, "in": in_f, "condition": condition, "seconds": s,
                         "tflops": flops / s / 1e12})
        del a, b, x, w, xz, wz, grad, y
        torch.cuda.empty_cache()
    return rows


def compare(path: str, profile: str) -> int:
    """Each measured row beside the fitted GEMM curve's price of its forward shape (both backward GEMMs of F.linear
    are priced as slidedp.compute.backward_ops orders them)."""
    from slidedp.compute import Gemm
    from slidedp.hardware import load_hardware

    curves = load_hardware(profile).gpu.compute
    if curves is None:
        raise SlideDPError(f"{profile} has no gpu.compute curves to compare with")
    rows = read_jsonl(Path(path))
    if not rows:
        raise SlideDPError(f"{path}: no rows (a --out file of this script)")
    print(f"{'tokens':>6} {'out x in':>11} {'condition':<19} {'TFLOP/s':>8} {'curve':>6} {'error':>7}")
    for r in rows:
        t, o, i = r["tokens"], r["out"], r["in"]
        op = {"grad_input": Gemm(t, i, o), "grad_weight": Gemm(o, i, t)}.get(r["condition"], Gemm(t, o, i))
        curve_s = curves.gemm_seconds(op)
        print(f"{t:>6} {f'{o}x{i}':>11} {r['condition']:<19} {r['tflops']:>8.0f} {op.flops / curve_s / 1e12:>6.0f} "
              f"{100 * (curve_s - r['seconds']) / r['seconds']:>+6.1f}%")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[32768, 4096])
    p.add_argument("--out", help="JSON lines to write (GPU host)")
    p.add_argument("--compare", metavar="FILE", help="print a --out file beside a profile's GEMM curve")
    p.add_argument("--profile", default="h100-sxm-x1")
    args = p.parse_args(argv)
    try:
        if args.compare:
            return compare(args.compare, args.profile)
        if not args.out:
            p.error("give --out FILE (on a GPU host) or --compare FILE")
        if any(t < 1 or t > 262144 for t in args.tokens):
            p.error("--tokens: between 1 and 262144")
        import torch

        if not torch.cuda.is_available():
            raise SlideDPError("gemm_conditions times CUDA kernels: run it on a GPU host")
        with open(args.out, "w") as f:
            for tokens in args.tokens:
                for row in measure(tokens):
                    print(json.dumps(row), flush=True)
                    f.write(json.dumps(row) + "\n")
    except (SlideDPError, OSError, ValueError) as exc:
        print(f"gemm_conditions: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
