"""Micro-benchmarks over a grid of operation shapes, for the shape-aware compute curves (calibration.shape_fit).

The grid spans the shapes decoder layers of any common width produce (GEMMs from 256 to 16K rows, widths
1K to 150K; causal flash attention from 1K to 128K tokens with grouped KV heads; the eager Hugging Face
memory-bound modules; a GPU-resident optimizer step, clip and fused AdamW over layer-shaped fp32 parameters; one
chunk of the runtime's loss head over the vocabularies of the common families), not
one target model, so the fitted curves price a model nobody calibrated on. Whole decoder layers of a calibration
model are timed too, only to fit the per-pass overhead.

Timing: on CUDA, queued calls between two events with the GPU held busy while the CPU issues them (Timer), median
of ``repeats`` groups; on a CPU the host clock, fp32 and a small grid (the path the tests use). Every benchmark is
bounded: a shape whose warm-up run takes longer than ``max_seconds`` is timed once.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from slidedp import compute as c
from slidedp.calibration.shape_fit import ShapeSamples
from slidedp.model_spec import ModelSpec

Progress = Callable[[int, int], None]

GPU_GEMMS: tuple[tuple[int, int, int], ...] = tuple(
    (m, n, k) for m in (256, 1024, 4096, 16384)
    for n, k in ((1024, 1024), (2048, 2048), (4096, 4096), (1024, 4096), (4096, 1024), (512, 4096),
                 (14336, 4096), (4096, 14336), (8192, 2560), (2560, 8192), (151936, 2048), (32000, 4096)))
CPU_GEMMS: tuple[tuple[int, int, int], ...] = ((16, 32, 32), (64, 64, 32), (128, 96, 64), (256, 128, 128),
                                              (64, 256, 64), (512, 64, 128))
# (batch, seq, heads, kv_heads, head_dim)
# Up to 128K tokens: the rate at long sequences is what a 256K-token run is priced at (a curve fitted only to 32K
# had to be extrapolated there, benchmarks/RESULTS.md "Attention at long sequences").
GPU_ATTENTION = ((1, 1024, 32, 8, 128), (4, 1024, 16, 2, 128), (1, 2048, 24, 8, 128), (2, 4096, 32, 8, 128),
                 (1, 4096, 16, 8, 64), (1, 8192, 32, 8, 128), (1, 16384, 16, 4, 128), (1, 32768, 32, 8, 128),
                 (1, 65536, 40, 8, 128), (1, 131072, 16, 8, 128))
CPU_ATTENTION = ((1, 32, 4, 2, 8), (2, 64, 4, 4, 16), (1, 128, 2, 1, 16))
GPU_ELEMENTWISE = ((4096, 2048), (16384, 4096), (65536, 4096), (32768, 8192))  # (tokens, width)
# One loss-head chunk (tokens, hidden, vocab): the vocabularies of Qwen, Llama 3 and Mistral at their widths.
GPU_HEADS = ((4096, 2048, 151936), (4096, 4096, 128256), (2048, 5120, 32000), (4096, 2560, 151936))
CPU_HEADS = ((32, 16, 300), (64, 32, 500))
CPU_ELEMENTWISE = ((256, 64), (1024, 128))
# (decoder layers, hidden, ffn) whose fp32 parameters the optimizer benchmark clips and updates: 134M and 537M
# parameters on a GPU (2.1 and 8.6 GB with gradients and moments), a few thousand on the CPU.
GPU_OPTIMIZER = ((2, 2048, 8192), (8, 2048, 8192))
CPU_OPTIMIZER = ((2, 32, 64), (4, 64, 128))


# A CUDA timing group queues calls of one operation up to this many, or this many seconds of them.
QUEUED_CALLS, QUEUED_SECONDS = 20, 0.05
HOLD_MAX_SECONDS = 0.2  # the longest the GPU is held busy before a group (torch.cuda._sleep)
HOLD_FLOOR_SECONDS = 1e-4  # added to every hold: the loop and the events' records after the hold is queued
SLEEP_CYCLES_PER_S = (1e8, 1e10)  # a spin kernel's plausible rate (GPU clocks); outside it the hold is skipped


def queued_calls(warm_seconds: float) -> int:
    """Calls of an operation one timing group queues: up to QUEUED_CALLS, about QUEUED_SECONDS of them by its
    warm-up call's time (which includes the first call's kernel selection, so the group errs short)."""
    return max(1, min(QUEUED_CALLS, int(QUEUED_SECONDS / max(warm_seconds, 1e-9))))


def queued_seconds(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``calls`` calls of ``fn`` queued between two CUDA events (the GPU's time for them when
    the CPU issues them faster than it runs them)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


class Timer:
    """Seconds of one call of an operation as the GPU runs it inside a training step.

    Why queued: in a step the CPU issues kernels ahead of the GPU, so a kernel follows the previous one without a
    gap. One call between two events, synchronised between calls (as this timer did until 2026-12-07), adds the
    launch and the event's latency to every sample: on an H100, 16-35 us for a residual add, an RMSNorm and a GEMM
    at 4096 tokens and about 100 us for SDPA's backward (benchmarks/RESULTS.md, call56), which the fits took for
    fixed costs per kernel (kernel_us 26.5 us) that a step never pays. So each sample is a group of
    ``queued_calls`` calls between two events, issued while the GPU is held busy (torch.cuda._sleep for 1.5x the
    time the CPU takes to issue the group, plus 0.1 ms) so the group's time is the GPU's alone. ``hold_gpu=False``
    for whole layer passes, which are timed for the CPU's share of a pass (the layer-level fit's overhead and, with
    --model, ComputeCurves.layer_dispatch_us): queued without the hold, a call costs the longer of its GPU time and
    the CPU's time to issue it, as a pass in a step does.
    On a CPU: the host clock around each call."""

    def __init__(self, device: torch.device, repeats: int, max_seconds: float, hold_gpu: bool = True):
        self.device, self.repeats, self.max_seconds = device, repeats, max_seconds
        self.cuda = device.type == "cuda"
        self.hold_gpu = hold_gpu
        self._sleep_cycles_per_s: float | None = None

    def seconds(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()  # warm-up: kernel selection, allocator, page faults
        self._sync()
        warm = time.perf_counter() - t0
        repeats = 1 if warm > self.max_seconds else self.repeats
        if not self.cuda:
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return statistics.median(times)
        hold = self.hold_gpu and repeats > 1  # a shape timed once is long: nothing to hide behind the hold
        calls = queued_calls(warm) if repeats > 1 else 1
        issue = 0.0
        if hold:
            t = time.perf_counter()
            fn()  # the CPU's time to issue one call (the GPU may still be running it)
            issue = time.perf_counter() - t
            self._sync()
        times = []
        for _ in range(repeats):
            if hold:
                hold = self._hold_gpu(1.5 * calls * issue + HOLD_FLOOR_SECONDS)
            times.append(queued_seconds(fn, calls))
        return statistics.median(times)

    def _hold_gpu(self, seconds: float) -> bool:
        """Queue a spin kernel of about ``seconds`` (at most HOLD_MAX_SECONDS) so the calls queued after it start
        back to back once it ends, whatever the CPU's issue time. False (and nothing queued) where the spin
        kernel's rate, timed once, is not a GPU clock's (SLEEP_CYCLES_PER_S): the group is then timed unheld."""
        if self._sleep_cycles_per_s is None:
            cycles = 20_000_000  # about 10 ms at a GPU's 1.5-2 GHz
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
            self._sleep_cycles_per_s = cycles / elapsed if elapsed > 0 else float("inf")
        low, high = SLEEP_CYCLES_PER_S
        if not low <= self._sleep_cycles_per_s <= high:
            return False
        torch.cuda._sleep(int(min(seconds, HOLD_MAX_SECONDS) * self._sleep_cycles_per_s))
        return True

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def gemm_samples(timer: Timer, dtype: torch.dtype, shapes) -> list[tuple[c.Gemm, float]]:
    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=dtype, device=timer.device)
        b = torch.randn(k, n, dtype=dtype, device=timer.device)
        out.append((c.Gemm(m, n, k), timer.seconds(lambda a=a, b=b: torch.mm(a, b))))
        del a, b
    return out


def attention_samples(timer: Timer, dtype: torch.dtype, shapes) -> list[tuple[c.Attention, float]]:
    """Forward alone, and forward + backward minus forward, of causal SDPA with grouped KV heads in the
    (batch, heads, seq, head_dim) layout the HF attention passes it."""
    out = []
    for b, s, h, kv, d in shapes:
        q = torch.randn(b, h, s, d, dtype=dtype, device=timer.device, requires_grad=True)
        k = torch.randn(b, kv, s, d, dtype=dtype, device=timer.device, requires_grad=True)
        v = torch.randn(b, kv, s, d, dtype=dtype, device=timer.device, requires_grad=True)

        gqa = kv != h

        def fwd(q=q, k=k, v=v, gqa=gqa):
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

        def both(q=q, k=k, v=v, gqa=gqa):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            torch.autograd.grad(o, (q, k, v), torch.ones_like(o))

        t_fwd = timer.seconds(fwd)
        t_both = timer.seconds(both)
        out.append((c.Attention(b, s, h, kv, d), t_fwd))
        out.append((c.Attention(b, s, h, kv, d, backward=True), max(t_both - t_fwd, 1e-9)))
        del q, k, v
    return out


def elementwise_samples(timer: Timer, dtype: torch.dtype, shapes) -> list[tuple[c.Elementwise, float]]:
    """The HF memory-bound modules the layers run (RMSNorm, rotary, SwiGLU, residual add), each against
    the byte and kernel counts slidedp.compute assigns it."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    out = []
    for tokens, width in shapes:
        x = torch.randn(1, tokens, width, dtype=dtype, device=timer.device)
        y = torch.randn_like(x)
        norm = Qwen3RMSNorm(width).to(device=timer.device, dtype=dtype)
        heads = max(1, width // 128)
        hd = width // heads
        q = x.view(1, tokens, heads, hd).transpose(1, 2)
        cos = torch.randn(1, tokens, hd, dtype=dtype, device=timer.device)
        sin = torch.randn_like(cos)
        n = tokens * width
        with torch.no_grad():
            out.append((c.RMSNORM.op("rmsnorm", n), timer.seconds(lambda x=x, norm=norm: norm(x))))
            out.append((c.SWIGLU.op("swiglu", n), timer.seconds(lambda x=x, y=y: F.silu(x) * y)))
            out.append((c.RESIDUAL.op("residual", n), timer.seconds(lambda x=x, y=y: x + y)))
            out.append((c.ROTARY.op("rotary", 2 * n, calls=2),
                        timer.seconds(lambda q=q, cos=cos, sin=sin: apply_rotary_pos_emb(q, q, cos, sin))))
        del x, y, q
    return out


def optimizer_samples(timer: Timer, shapes) -> list[tuple[c.Elementwise, float]]:
    """A GPU-resident peer's step after backward over fp32 parameters shaped like ``layers`` decoder layers (seven
    projections and two norms each): torch's global-norm clip and fused AdamW (foreach on the CPU path), against
    the bytes slidedp.compute.gpu_optimizer_op counts."""
    out = []
    for layers, hidden, ffn in shapes:
        shapes_one = [(hidden, hidden)] * 4 + [(ffn, hidden)] * 2 + [(hidden, ffn)] + [(hidden,)] * 2
        params = [torch.zeros(shape, device=timer.device, requires_grad=True) for _ in range(layers)
                  for shape in shapes_one]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt = torch.optim.AdamW(params, lr=1e-5, fused=timer.cuda, foreach=None if timer.cuda else True)

        def step(params=params, opt=opt):
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            opt.step()

        step()  # the moments are allocated on the first step, outside the timing
        out.append((c.gpu_optimizer_op(sum(p.numel() for p in params)), timer.seconds(step)))
        del params, opt, step
    return out


def head_samples(timer: Timer, dtype: torch.dtype, shapes) -> list[tuple[tuple[int, int, int], list, float]]:
    """One chunk of the runtime's own loss head (runtime.loss_head.LossHead: final norm, lm_head, cross-entropy
    and the gradients it produces in forward, fp32 weight-gradient accumulation included) per shape."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from slidedp.calibration.shape_fit import head_sample
    from slidedp.runtime.loss_head import LossHead

    out = []
    for tokens, hidden, vocab in shapes:
        head = LossHead(Qwen3RMSNorm(hidden).to(device=timer.device, dtype=dtype), tokens)
        h = torch.randn(1, tokens, hidden, dtype=dtype, device=timer.device)
        labels = torch.randint(0, vocab, (1, tokens), device=timer.device)
        wn = torch.ones(hidden, dtype=dtype, device=timer.device, requires_grad=True)
        w_out = (torch.randn(vocab, hidden, dtype=dtype, device=timer.device) * 0.02).requires_grad_()
        grads = {"norm": torch.zeros(hidden, device=timer.device), "out": torch.zeros(vocab * hidden,
                                                                                        device=timer.device)}
        seconds = timer.seconds(lambda head=head, h=h, labels=labels, wn=wn, w_out=w_out, grads=grads, tokens=tokens:
                                head.loss_and_grads(h, labels, wn, w_out, 1.0 / tokens, grads))
        out.append(head_sample(tokens, hidden, vocab, seconds))
        del h, w_out, grads
    return out


def layer_pass_times(timer: Timer, dtype: torch.dtype, model: str, grid) -> Iterator[tuple[int, int, float, float]]:
    """Yield (seq, batch, forward s, backward s) of one decoder layer of ``model`` per grid point, through the
    runtime's own functional layer call; backward = (forward + backward) - forward, with weight and input
    gradients as in training."""
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config

    cfg = load_hf_config(model)
    adapter = ModelAdapter(cfg)
    unit = adapter.units[1]
    layer = adapter.layer_module(unit)
    flat = torch.randn(unit.numel, dtype=dtype, device=timer.device) * 0.02
    rotary = adapter.rotary(timer.device)
    for seq, batch in grid:
        x = torch.randn(batch, seq, cfg.hidden_size, dtype=dtype, device=timer.device, requires_grad=True)
        pos = torch.arange(seq, device=timer.device).unsqueeze(0)
        pe = rotary(x, pos)

        def run(backward: bool, x=x, pos=pos, pe=pe):
            # Each weight a detached leaf view of the flat unit, as the runtime's engine passes them: a
            # gradient w.r.t. the flat tensor itself would add a full-size scatter per weight that the
            # runtime never runs (it inflated the old layer-level backward ratio).
            params = {p.name: flat[p.offset:p.offset + p.numel].view(p.shape).detach().requires_grad_(backward)
                      for p in unit.params}
            with torch.set_grad_enabled(backward):
                o = torch.func.functional_call(layer, params, (x,), {"attention_mask": None,
                                                                     "position_embeddings": pe, "position_ids": pos})
                o = o[0] if isinstance(o, tuple) else o
                if backward:
                    torch.autograd.grad(o, [x, *params.values()], torch.ones_like(o))

        fwd = timer.seconds(lambda run=run: run(False))
        both = timer.seconds(lambda run=run: run(True))
        yield seq, batch, fwd, max(both - fwd, 1e-9)


def layer_samples(timer: Timer, dtype: torch.dtype, model: str, grid) -> list[tuple[str, list, float]]:
    """Layer passes of ``model`` against the operations slidedp.compute lists for them."""
    from slidedp.runtime.hf_adapter import load_hf_config

    spec = ModelSpec.from_hf_config(load_hf_config(model).to_dict(), name=model)
    out = []
    for seq, batch, fwd, bwd in layer_pass_times(timer, dtype, model, grid):
        ops = spec.layer_forward_ops(batch, seq)
        out.append((f"{model} fwd s{seq} b{batch}", ops, fwd))
        out.append((f"{model} bwd s{seq} b{batch}", c.backward_ops(ops), bwd))
    return out


def shape_samples(layer_model: str | None = None, quick: bool = False, progress: Progress | None = None,
                  repeats: int = 10, max_seconds: float = 2.0) -> ShapeSamples:
    """Every family on this machine's device (CUDA when present, else the CPU in fp32 with a small grid)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    timer = Timer(device, 3 if quick else repeats, max_seconds)
    gemms = GPU_GEMMS if cuda else CPU_GEMMS
    if quick and cuda:
        gemms = tuple(s for s in gemms if s[0] in (1024, 4096))
    steps = 5 if layer_model else 4
    samples = ShapeSamples()
    samples.gemm = gemm_samples(timer, dtype, gemms)
    if progress:
        progress(1, steps)
    samples.attention = attention_samples(timer, dtype, (GPU_ATTENTION[:4] if quick else GPU_ATTENTION)
                                          if cuda else CPU_ATTENTION)
    if progress:
        progress(2, steps)
    samples.elementwise = elementwise_samples(timer, dtype, GPU_ELEMENTWISE if cuda else CPU_ELEMENTWISE) + \
        optimizer_samples(timer, GPU_OPTIMIZER if cuda else CPU_OPTIMIZER)
    if progress:
        progress(3, steps)
    samples.heads = head_samples(timer, dtype, (GPU_HEADS[:2] if quick else GPU_HEADS) if cuda else CPU_HEADS)
    if progress:
        progress(4, steps)
    if layer_model:
        grid = ([(1024, 1), (4096, 1), (4096, 4), (16384, 1)] if cuda else [(32, 1), (64, 2)])
        layer_timer = Timer(device, timer.repeats, max_seconds, hold_gpu=False)  # the CPU's share counts here
        samples.layers = layer_samples(layer_timer, dtype, layer_model, grid)
        if progress:
            progress(5, steps)
    return samples
