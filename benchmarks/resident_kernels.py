"""CUDA kernel time of one GPU-resident training step by kind (GEMM, attention, elementwise/other), per batch.

Why: the GPU-resident peer's step on the H200 is under-predicted by 8-9% at batch 8 while batch 1 is right
(benchmarks/RESULTS.md, twentieth session); whole-phase timings cannot say which operation's cost grows faster
with the batch than the compute model says. This times kernels with torch.profiler over one step after warm-up
and writes one JSON row per batch: total kernel seconds by kind and the 15 largest kernels.

    python -m benchmarks.resident_kernels --model qwen3-4b --batches 1 8 --out kernels.jsonl
    python -m benchmarks.resident_kernels --compare kernels.jsonl --profile PROFILE   # beside the compute model
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator

from slidedp.errors import SlideDPError

KINDS = (("attention", ("flash", "fmha", "attention", "sdpa")),
         ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "sm90", "cublas", "matmul")))


def kernel_kind(name: str) -> str:
    """Kind of a CUDA kernel by its name (attention before GEMM: flash kernels also name sm90)."""
    low = name.lower()
    for kind, marks in KINDS:
        if any(m in low for m in marks):
            return kind
    return "other"


def kernel_seconds(prof) -> Iterator[tuple[str, str, float]]:
    """(name, kind, seconds) of every CUDA kernel a torch.profiler session recorded (not record_function spans)."""
    for e in prof.events():
        if e.device_type.name == "CUDA" and not e.is_user_annotation:
            yield e.name, kernel_kind(e.name), e.device_time / 1e6


def model_kernel_seconds(spec, hw, batch: int, seq: int) -> dict[str, float]:
    """The compute model's seconds of one GPU-resident step's operations by the profiler's kinds: every unit's
    forward, recomputed forward and backward operations and its backward bookkeeping (the units the plan times,
    without the passes' dispatch floors and fixed costs, which are not kernel time), and the clip + fused AdamW
    passes (PeerStep.gpu_adam_s) as ``other``. One GPU's step: ``hw`` must have one GPU."""
    from slidedp.compute import Attention, Gemm
    from slidedp.peers import SYSTEMS, PeerStep, system_workload
    from slidedp.workload import policy_unit_work

    system = SYSTEMS["ddp-resident"]
    step = PeerStep(system, system_workload(system, spec, hw, seq, batch))
    w, curves = step.w, hw.gpu.compute
    out = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for work in policy_unit_work(w.model, w.policy, w.seq, w.attention_span, w.attention, w.precision):
        for op in (*work.fwd_ops, *work.recompute_ops, *work.bwd_ops):
            kind = "gemm" if isinstance(op, Gemm) else "attention" if isinstance(op, Attention) else "other"
            out[kind] += curves.seconds(op) * work.micro_batches
        out["other"] += curves.total_seconds(work.step_ops)
    out["other"] += step.gpu_adam_s()
    return out


def compare(path: str, profile: str) -> int:
    """Measured kernel seconds by kind (rows of a --out file) beside model_kernel_seconds, per batch."""
    from benchmarks.zero2_heldout import model_spec
    from slidedp.hardware import load_hardware

    hw = load_hardware(profile)
    if hw.gpu.compute is None:
        raise SlideDPError(f"{profile}: no compute curves to compare with")
    if hw.num_gpus != 1:
        raise SlideDPError(f"{profile}: {hw.num_gpus} GPUs; the kernels were timed on one (give a one-GPU profile)")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(f"{'batch':>5} {'kind':<10} {'model s':>8} {'measured':>8} {'error':>7}")
    for row in (r for r in rows if "batch" in r):
        spec = model_spec(row.get("model", "qwen3-4b"))  # the tied head as configured: trained so since 2026-12-07
        model = model_kernel_seconds(spec, hw, row["batch"], row["seq"])
        for kind in ("gemm", "attention", "other"):
            measured = row["kind_s"].get(kind, 0.0)
            error = f"{(model[kind] / measured - 1) * 100:+6.1f}%" if measured else "    -"
            print(f"{row['batch']:>5} {kind:<10} {model[kind]:>8.3f} {measured:>8.3f} {error:>7}")
    return 0


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.common import require_cuda, synthetic_tokens
    from benchmarks.peer_setup import PhaseClock
    from benchmarks.peer_systems import resident_trainer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-4b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--out")
    p.add_argument("--compare", metavar="FILE", help="print a --out file's kernel seconds beside the model's")
    p.add_argument("--profile", default="h200-x1", help="the profile whose compute curves --compare prices with")
    args = p.parse_args()
    if args.compare:
        try:
            return compare(args.compare, args.profile)
        except (OSError, ValueError, KeyError, TypeError, SlideDPError) as e:
            print(f"resident_kernels --compare: {e}", file=sys.stderr)
            return 2
    if not args.out:
        p.error("--out is required (or --compare FILE)")
    require_cuda("benchmarks.resident_kernels")
    cfg, _, step = resident_trainer(args.model, "cuda", PhaseClock(False, True))
    with open(args.out, "w") as f:
        for batch in args.batches:
            tokens = synthetic_tokens(cfg.vocab_size, batch, args.seq)
            x, y = tokens[:, :-1].cuda(), tokens[:, 1:].cuda()
            for _ in range(2):
                step(x, y)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step(x, y)
                torch.cuda.synchronize()
            by_kind: dict[str, float] = defaultdict(float)
            by_name: dict[str, float] = defaultdict(float)
            counts: dict[str, int] = defaultdict(int)
            for name, kind, seconds in kernel_seconds(prof):
                by_kind[kind] += seconds
                by_name[name[:90]] += seconds
                counts[kind] += 1
            top = sorted(by_name.items(), key=lambda kv: -kv[1])[:15]
            row = {"model": args.model, "batch": batch, "seq": args.seq, "kind_s": dict(by_kind),
                   "kernels": dict(counts), "total_s": sum(by_kind.values()), "top": top}
            print(json.dumps(row), flush=True)
            f.write(json.dumps(row) + "\n")
            torch.cuda.empty_cache()
        f.write(json.dumps(isolated_vs_queued()) + "\n")
        f.write(json.dumps(elementwise_backward()) + "\n")
    return 0


def _queued(fn: Callable[[], object], repeats: int) -> float:
    """Seconds per call of ``repeats`` calls queued between two CUDA events, after one warm-up call: what the GPU
    spends on them when the CPU runs ahead, as inside a training step."""
    import torch

    from slidedp.calibration.shape_bench import queued_seconds

    fn()
    torch.cuda.synchronize()
    return queued_seconds(fn, repeats)


def _isolated(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of one call between two CUDA events, synchronised between calls (calibration.shape_bench's
    timing until 2026-12-07, c56)."""
    import statistics

    import torch

    fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def isolated_vs_queued(repeats: int = 20) -> dict:
    """Qwen3-4B-shaped RMSNorm, SDPA backward and a GEMM, each timed one call at a time between events (calibration's
    timing until c56), queued (``repeats`` calls between two events) and by calibration.shape_bench.Timer (queued
    behind a held GPU): how much of a micro-benchmark's fixed cost per call is the GPU waiting for the CPU, which a
    step's queued kernels hide."""
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from slidedp.calibration.shape_bench import Timer

    queued_held = Timer(torch.device("cuda"), 5, max_seconds=2.0).seconds  # the calibration's timing since c56

    out = {}
    for tokens in (4096, 32768):
        x = torch.randn(1, tokens, 2560, dtype=torch.bfloat16, device="cuda")
        norm = Qwen3RMSNorm(2560).to(device="cuda", dtype=torch.bfloat16)
        w = torch.randn(9728, 2560, dtype=torch.bfloat16, device="cuda")
        q = torch.randn(tokens // 4096, 32, 4096, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        kv = torch.randn(tokens // 4096, 8, 4096, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        o = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        g = torch.randn_like(o)
        fns = {"rmsnorm": lambda x=x, norm=norm: norm(x), "gemm_up": lambda x=x, w=w: x @ w.t(),
               "residual": lambda x=x: x + x,
               "sdpa_bwd": lambda o=o, g=g, q=q, kv=kv: torch.autograd.grad(o, (q, kv), g, retain_graph=True)}
        for name, fn in fns.items():
            ctx = torch.no_grad() if name != "sdpa_bwd" else torch.enable_grad()
            with ctx:
                out[f"{name}@{tokens}"] = {"isolated_s": _isolated(fn, repeats), "queued_s": _queued(fn, repeats),
                                           "timer_s": queued_held(fn)}
        del x, q, kv, o, g
    print(json.dumps(out), flush=True)
    return {"isolated_vs_queued": out}


def _elementwise_cases(tokens: int) -> tuple[list, dict]:
    """Inputs (leaves needing gradients) and (forward, backward) callables of each memory-bound module."""
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    bf = torch.bfloat16

    def leaf(*shape):
        return torch.randn(*shape, dtype=bf, device="cuda", requires_grad=True)

    x, q, k, gate, up = leaf(1, tokens, 2560), leaf(1, 32, tokens, 128), leaf(1, 8, tokens, 128), \
        leaf(1, tokens, 9728), leaf(1, tokens, 9728)
    gx, gq, gk, gf = (torch.randn_like(t) for t in (x, q, k, gate))
    cos = torch.randn(1, tokens, 128, dtype=bf, device="cuda")
    sin = torch.randn_like(cos)
    norm = Qwen3RMSNorm(2560).to(device="cuda", dtype=bf)
    qn = Qwen3RMSNorm(128).to(device="cuda", dtype=bf)
    grad = torch.autograd.grad  # not .backward: no accumulation into the leaves' .grad between calls
    cases = {
        "rmsnorm": (lambda: norm(x), lambda o: grad(o, (x, norm.weight), gx)),
        "qk_norm": (lambda: (qn(q), qn(k)), lambda o: grad(o, (q, k, qn.weight), (gq, gk))),
        "rotary": (lambda: apply_rotary_pos_emb(q, k, cos, sin), lambda o: grad(o, (q, k), (gq, gk))),
        "swiglu": (lambda: F.silu(gate) * up, lambda o: grad(o, (gate, up), gf)),
        "residual": (lambda: x + x, lambda o: grad(o, (x,), gx)),
    }
    return [x, q, k, gate, up], cases


def elementwise_backward(repeats: int = 20) -> dict:
    """Queued seconds of the HF memory-bound modules' forward and of forward + backward, at Qwen3-4B's widths
    (hidden 2560, q 4096, kv 1024, FFN 9728) and 4096 and 32768 tokens: the backward over the forward, which
    slidedp.compute counts from aten calls (its EagerModule constants) and no micro-benchmark fits. At 4096 tokens
    a module's kernels are short enough (tens of us) that queued calls may be bound by the CPU issuing them
    (autograd.grad costs about 100 us of Python per call): read the 32768-token ratios as the kernels'."""
    import torch

    out = {}
    for tokens in (4096, 32768):
        leaves, cases = _elementwise_cases(tokens)
        for name, (fwd, bwd) in cases.items():
            with torch.no_grad():
                f_s = _queued(fwd, repeats)
            fb_s = _queued(lambda fwd=fwd, bwd=bwd: bwd(fwd()), repeats)
            out[f"{name}@{tokens}"] = {"forward_s": f_s, "forward_backward_s": fb_s,
                                       "backward_over_forward": (fb_s - f_s) / f_s}
        del leaves, cases
        torch.cuda.empty_cache()
    print(json.dumps(out), flush=True)
    return {"elementwise_backward": out}


if __name__ == "__main__":
    raise SystemExit(main())
