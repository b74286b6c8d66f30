"""The peers' CPU optimizer-phase rates against thread count, for the implementations installed here: torch's
fused CPU AdamW and ``clip_grad_norm_`` over CPU gradients (FSDP2 + CPUOffloadPolicy runs both) and
DeepSpeedCPUAdam (ZeRO-Offload; only where ``deepspeed`` imports and its CPU Adam op builds). They become
``host.peer_adam_gparams_per_s`` so that ``slidedp.peers`` simulates each peer at its own optimizer's rate instead
of borrowing SlideDP's kernel's.

Each (implementation, threads) is timed in its own process: DeepSpeed's op is built with its own OpenMP runtime,
which reads OMP_NUM_THREADS when it starts and ignores ``torch.set_num_threads``.

    python -m slidedp.calibration.peer_bench --impl deepspeed_cpu_adam --threads 8 --params 67108864
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from slidedp.calibration.measurements import Measurements, Progress, median_time
from slidedp.calibration.rate_checks import dips, warning
from slidedp.peers.systems import (
    DEEPSPEED_CPU_ADAM,
    DEEPSPEED_CPU_ADAM_BF16,
    TORCH_ADAMW_FUSED,
    TORCH_CLIP_GRAD_NORM,
    TORCH_CLIP_GRAD_NORM_BF16,
)

IMPLEMENTATIONS = (TORCH_ADAMW_FUSED, TORCH_CLIP_GRAD_NORM, DEEPSPEED_CPU_ADAM)  # what `slidedp calibrate` times
# On request only (benchmarks.host_calibration --peer-impls): MegaTrain's optimizer phase over bf16 tensors.
BF16_IMPLEMENTATIONS = (DEEPSPEED_CPU_ADAM_BF16, TORCH_CLIP_GRAD_NORM_BF16)
CLIP_PIECES = 64  # clip_grad_norm_ runs over many tensors (FSDP2 clips ~400 shards), not one flat buffer
TIMEOUT_S = 600  # one (implementation, threads) process at most; DeepSpeed's first JIT build takes ~100 s


def time_step(impl: str, params: int, repeats: int) -> float:
    """Median seconds of one optimizer step over one flat tensor of ``params`` elements with its gradient (ZeRO-2
    steps one flat partition per group), or of one clip over ``CLIP_PIECES`` tensors; fp32 tensors, bf16 ones for
    the ``_bf16`` implementations (MegaTrain's bf16 weights and gradients; the moments stay fp32)."""
    import torch

    dtype = torch.bfloat16 if impl in BF16_IMPLEMENTATIONS else torch.float32
    if impl in (TORCH_CLIP_GRAD_NORM, TORCH_CLIP_GRAD_NORM_BF16):
        pieces = [torch.nn.Parameter(torch.empty(params // CLIP_PIECES, dtype=dtype)) for _ in range(CLIP_PIECES)]
        for q in pieces:
            q.grad = torch.randn(q.shape).to(dtype)
        return median_time(lambda: torch.nn.utils.clip_grad_norm_(pieces, 1.0), repeats) * params / (
            CLIP_PIECES * (params // CLIP_PIECES))
    p = torch.nn.Parameter(torch.randn(params).to(dtype))
    p.grad = (torch.randn(params) * 1e-3).to(dtype)
    kwargs = {"lr": 1e-5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}
    if impl == TORCH_ADAMW_FUSED:
        opt = torch.optim.AdamW([p], fused=True, **kwargs)
    elif impl in (DEEPSPEED_CPU_ADAM, DEEPSPEED_CPU_ADAM_BF16):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam([p], adamw_mode=True, **kwargs)
    else:
        raise ValueError(f"unknown implementation {impl!r}")
    return median_time(opt.step, repeats)


def rate_in_subprocess(impl: str, threads: int, params: int, repeats: int) -> tuple[float | None, str]:
    """G params/s of ``impl`` with ``threads`` threads, timed in a child process; (None, why) if it failed."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "slidedp.calibration.peer_bench", "--impl", impl, "--threads", str(threads),
           "--params", str(params), "--repeats", str(repeats)]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"no result within {TIMEOUT_S} s"
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, tail[:200]
    try:
        return float(json.loads(done.stdout.strip().splitlines()[-1])["gparams_per_s"]), ""
    except (ValueError, KeyError, IndexError):
        return None, f"unreadable output {done.stdout[-120:]!r}"


def installed(impl: str) -> bool:
    if impl in (DEEPSPEED_CPU_ADAM, DEEPSPEED_CPU_ADAM_BF16):
        import importlib.util

        return importlib.util.find_spec("deepspeed") is not None
    return True


def peer_adam_benchmarks(m: Measurements, quick: bool, thread_counts: list[int],
                         progress: Progress | None = None, implementations: tuple[str, ...] = IMPLEMENTATIONS) -> None:
    """Fill ``m.peer_adam_gparams_per_s`` for every installed implementation; one warning per failure."""
    params = 2**24 if quick else 2**27
    repeats = 3 if quick else 5
    impls = [i for i in implementations if installed(i)]
    total, done = len(impls) * len(thread_counts), 0
    for impl in impls:
        curve: dict[int, float] = {}
        for threads in thread_counts:
            rate, why = rate_in_subprocess(impl, threads, params, repeats)
            done += 1
            if progress:
                progress(done, total)
            if rate is None:
                m.report.setdefault("warnings", []).append(
                    f"peer CPU AdamW {impl} at {threads} threads: {why}; not measured")
                break  # a build or import failure fails every thread count alike
            curve[threads] = rate
        retimed = dips(curve)  # interference only slows a pass down: re-time a dip once, keep the faster
        for threads in retimed:
            rate, why = rate_in_subprocess(impl, threads, params, repeats)
            if rate is None:
                m.report.setdefault("warnings", []).append(
                    f"peer CPU AdamW {impl} at {threads} threads, timed again for a dip: {why}; kept the first timing")
                continue
            curve[threads] = max(curve[threads], rate)
        if retimed:
            m.report.setdefault("peer_adam_retimed", {})[impl] = retimed
        if curve:
            m.peer_adam_gparams_per_s[impl] = curve
    line = warning({impl: ({t: [v] for t, v in curve.items()}, "G params/s")
                    for impl, curve in m.peer_adam_gparams_per_s.items()})
    if line:
        m.report.setdefault("warnings", []).append(line)
    m.report["peer_adam_gparams_per_s"] = m.peer_adam_gparams_per_s


def main() -> int:
    parser = argparse.ArgumentParser(description="time one peer CPU AdamW implementation (a calibrate worker)")
    parser.add_argument("--impl", choices=IMPLEMENTATIONS + BF16_IMPLEMENTATIONS, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--params", type=int, default=2**27)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    seconds = time_step(args.impl, args.params, args.repeats)
    print(json.dumps({"impl": args.impl, "threads": args.threads, "params": args.params, "seconds": seconds,
                      "gparams_per_s": args.params / seconds / 1e9}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
