"""Fit shape-aware compute curves (slidedp.compute.ComputeCurves) to micro-benchmarks over a grid of shapes.

Each family is fitted to its own samples, in relative error, so a fast small kernel counts as much as a
slow big one: GEMMs give the asymptotic rate, the three half-efficiency dimensions and the per-kernel
cost; attention its forward and backward rates, half-efficiency sequence length and fixed cost per call;
memory-bound modules the achieved bandwidth (kernel cost held), each measured kind its own (the GPU optimizer
step's multi-tensor passes kept out of the generic bandwidth); chunks of the loss head the achieved
bandwidth of its logits chain; whole decoder layers of a calibration model the per-pass overhead that the
operations leave unexplained. Every fitted value is checked against
what a GPU can physically do; a value that is not credible is reported, not silently kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares

from slidedp.compute import MEASURED_KIND, MULTI_TENSOR_KINDS, Attention, ComputeCurves, ComputeOp, Elementwise, Gemm
from slidedp.errors import SlideDPError


@dataclass
class ShapeSamples:
    """Measured seconds per operation (or op list, for whole layers), as the micro-benchmarks record them."""

    gemm: list[tuple[Gemm, float]] = field(default_factory=list)
    attention: list[tuple[Attention, float]] = field(default_factory=list)
    elementwise: list[tuple[Elementwise, float]] = field(default_factory=list)
    # (name, ops of one pass, seconds): whole units of calibration models, forward or backward
    layers: list[tuple[str, list[ComputeOp], float]] = field(default_factory=list)
    # ((tokens, hidden, vocab), forward + backward ops, seconds): one chunk of the runtime's loss head
    heads: list[tuple[tuple[int, int, int], list[ComputeOp], float]] = field(default_factory=list)


@dataclass(frozen=True)
class ShapeFit:
    curves: ComputeCurves
    residuals: dict[str, float]  # family -> relative RMS error of the fitted curve on its samples
    warnings: tuple[str, ...]


def _rel_rms(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.sqrt(np.mean(((pred - meas) / meas) ** 2)))


def _solve(residual, x0, lower, upper):
    x0 = np.clip(np.asarray(x0, dtype=float), np.asarray(lower) * 1.0001 + 1e-12, np.asarray(upper) * 0.9999)
    return least_squares(residual, x0, bounds=(lower, upper), loss="soft_l1", f_scale=0.1, max_nfev=4000).x


def fit_curves(samples: ShapeSamples, peak_tflops: float, peak_memory_gbps: float) -> ShapeFit:
    """Curves that explain ``samples``; ``peak_*`` are the chip's datasheet limits, used as the bounds a
    credible fit stays under (a fit that runs into a bound is named in ``warnings``)."""
    if len(samples.gemm) < 5:
        raise SlideDPError("a compute-curve fit needs at least five GEMM samples of different shapes")
    warnings: list[str] = []
    residuals: dict[str, float] = {}

    g_ops = [op for op, _ in samples.gemm]
    g_t = np.array([t for _, t in samples.gemm])
    g_f = np.array([op.flops for op in g_ops])
    g_dims = np.array([[op.m, op.n, op.k] for op in g_ops], dtype=float)
    g_count = np.array([op.count for op in g_ops], dtype=float)

    def gemm_pred(x):
        rate, hm, hn, hk, kern = x
        eff = 1.0 / (1.0 + hm / g_dims[:, 0] + hn / g_dims[:, 1] + hk / g_dims[:, 2])
        return g_f / (rate * 1e12 * eff) + g_count * kern * 1e-6

    rate0 = float(np.max(g_f / g_t)) / 1e12
    x = _solve(lambda x: np.log(gemm_pred(x) / g_t), [rate0, 64, 64, 64, 5.0],
               [rate0 * 0.5, 0, 0, 0, 0], [peak_tflops, 1e5, 1e5, 1e5, 1e3])
    gemm_tflops, hm, hn, hk, kernel_us = (float(v) for v in x)
    residuals["gemm"] = _rel_rms(gemm_pred(x), g_t)

    att_fwd = att_bwd = gemm_tflops
    half_seq = 0.0
    att_fwd_us = att_bwd_us = None
    if samples.attention:
        a_ops = [op for op, _ in samples.attention]
        a_t = np.array([t for _, t in samples.attention])
        a_f = np.array([op.flops for op in a_ops])
        a_seq = np.array([op.seq for op in a_ops], dtype=float)
        a_bwd = np.array([op.backward for op in a_ops])

        def att_pred(x):  # x: forward rate, backward rate, half-efficiency seq, fixed us forward, backward
            rate = np.where(a_bwd, x[1], x[0])
            return a_f / (rate * 1e12 * a_seq / (a_seq + x[2])) + np.where(a_bwd, x[4], x[3]) * 1e-6

        r0 = float(np.median(a_f / a_t)) / 1e12
        if a_bwd.any() and not a_bwd.all():
            x = _solve(lambda x: np.log(att_pred(x) / a_t), [r0, r0, 256.0, kernel_us, kernel_us],
                       [1e-6, 1e-6, 0, 0, 0], [peak_tflops, peak_tflops, 1e6, 1e4, 1e4])
        else:  # one direction measured: both get its rate and fixed cost
            x1 = _solve(lambda x: np.log(att_pred([x[0], x[0], x[1], x[2], x[2]]) / a_t), [r0, 256.0, kernel_us],
                        [1e-6, 0, 0], [peak_tflops, 1e6, 1e4])
            x = [x1[0], x1[0], x1[1], x1[2], x1[2]]
            warnings.append("attention: only one direction measured; forward and backward share its rate")
        att_fwd, att_bwd, half_seq, att_fwd_us, att_bwd_us = (float(v) for v in x)
        residuals["attention"] = _rel_rms(att_pred(x), a_t)

    memory_gbps, memory_kernel_us = peak_memory_gbps * 0.7, kernel_us
    by_kind: dict[str, float] = {}
    if samples.elementwise:
        e_b = np.array([op.nbytes for op, _ in samples.elementwise])
        e_k = np.array([op.kernels for op, _ in samples.elementwise], dtype=float)
        e_t = np.array([t for _, t in samples.elementwise])
        e_kind = np.array([MEASURED_KIND.get(op.name, "") for op, _ in samples.elementwise])
        generic = ~np.isin(e_kind, list(MULTI_TENSOR_KINDS))

        def mem_pred(x):
            return e_b / (x[0] * 1e9) + e_k * x[1] * 1e-6

        x = np.array([memory_gbps, memory_kernel_us])
        if generic.any():
            x = _solve(lambda x: np.log(mem_pred(x)[generic] / e_t[generic]),
                       [float(np.median(e_b[generic] / e_t[generic])) / 1e9, kernel_us], [1e-3, 0.0],
                       [peak_memory_gbps, 1e3])
        memory_gbps, memory_kernel_us = float(x[0]), float(x[1])
        # Then each measured module on its own: its bytes are nominal, its achieved bandwidth is its own.
        pred = mem_pred(x)
        for kind in sorted(set(e_kind) - {""}):
            sel = e_kind == kind
            if sel.sum() < 2:
                warnings.append(f"memory_gbps_by_kind.{kind}: one sample, priced at the generic bandwidth")
                continue

            def kind_pred(y, sel=sel):
                return e_b[sel] / (y[0] * 1e9) + e_k[sel] * memory_kernel_us * 1e-6

            y = _solve(lambda y, sel=sel, kind_pred=kind_pred: np.log(kind_pred(y) / e_t[sel]), [memory_gbps],
                       [1e-3], [peak_memory_gbps])
            by_kind[str(kind)] = float(y[0])
            pred[sel] = kind_pred(y)
        residuals["elementwise"] = _rel_rms(pred, e_t)

    curves = ComputeCurves(gemm_tflops=gemm_tflops, gemm_half_m=hm, gemm_half_n=hn, gemm_half_k=hk,
                           attention_fwd_tflops=att_fwd, attention_bwd_tflops=att_bwd, attention_half_seq=half_seq,
                           memory_gbps=memory_gbps, kernel_us=kernel_us, layer_overhead_us=0.0,
                           memory_gbps_by_kind=by_kind, memory_kernel_us=memory_kernel_us,
                           attention_fwd_us=att_fwd_us, attention_bwd_us=att_bwd_us)
    if samples.heads:
        curves = _fit_logits(curves, samples.heads, peak_memory_gbps, residuals)
    passes = {}
    if samples.layers:
        for direction in ("fwd", "bwd"):
            rows = [(curves.total_seconds(ops), t) for name, ops, t in samples.layers
                    if (" bwd " in f" {name} ") == (direction == "bwd")]
            if not rows:
                continue
            ops_s, meas = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])

            def pass_pred(x, ops_s=ops_s):
                return np.maximum(ops_s, x[0] * 1e-6) + x[1] * 1e-6

            # max() is flat in the floor wherever the operations exceed it, so a local solver started in the
            # wrong place never moves it: scan the floor over the measured times (overhead = the median
            # remainder at each), keep the best in relative error.
            best = None
            for floor in np.concatenate([[0.0], meas]):
                extra = max(0.0, float(np.median(meas - np.maximum(ops_s, floor))))
                x = np.array([floor * 1e6, extra * 1e6])
                err = float(np.sum(np.log(pass_pred(x) / meas) ** 2))
                if best is None or err < best[0]:
                    best = (err, x)
            x = best[1]
            polished = _solve(lambda x, pass_pred=pass_pred, meas=meas: np.log(pass_pred(x) / meas), x,
                              [0.0, 0.0], [1e6, 1e6])
            if float(np.sum(np.log(pass_pred(polished) / meas) ** 2)) < best[0]:
                x = polished
            passes[direction] = (float(x[0]), float(x[1]), pass_pred(x), meas)
        fwd = passes.get("fwd", (0.0, 0.0))
        bwd = passes.get("bwd", fwd)
        curves = replace(curves, layer_dispatch_us=fwd[0], layer_overhead_us=fwd[1], backward_dispatch_us=bwd[0],
                         backward_overhead_us=bwd[1])
        pred = np.concatenate([v[2] for v in passes.values()])
        meas = np.concatenate([v[3] for v in passes.values()])
        residuals["layers"] = _rel_rms(pred, meas)

    for name, value, bound in (("gemm_tflops", gemm_tflops, peak_tflops),
                               ("attention_fwd_tflops", att_fwd, peak_tflops),
                               ("attention_bwd_tflops", att_bwd, peak_tflops),
                               ("memory_gbps", memory_gbps, peak_memory_gbps),
                               *((f"memory_gbps_by_kind.{k}", v, peak_memory_gbps)
                                 for k, v in curves.memory_gbps_by_kind.items())):
        if value >= 0.995 * bound:
            warnings.append(f"{name} {value:.4g} sits at the chip's peak {bound:.4g}: not credible")
    for family, res in residuals.items():
        if not math.isfinite(res) or res > 0.25:
            warnings.append(f"{family}: the fitted curve misses its samples by {100 * res:.0f}% RMS")
    return ShapeFit(curves, residuals, tuple(warnings))


def _fit_logits(curves: ComputeCurves, heads, peak_memory_gbps: float, residuals: dict) -> ComputeCurves:
    """The achieved bandwidth of the loss's logits chain (fp32 upcast, log-softmax, gather and their backward:
    compute.LOGITS_BYTES per logit), fitted to timed loss-head chunks once the GEMM and norm curves are known:
    the head is the one unit no other family covers, and pricing its chain at the generic bandwidth left every
    measured H200 run's head ~8% short (benchmarks/RESULTS.md, "Attention at long sequences")."""
    meas = np.array([t for _, _, t in heads])

    def pred(y):
        trial = curves.with_module_gbps("logits", y[0])
        return np.array([trial.total_seconds(ops) for _, ops, _ in heads])

    y = _solve(lambda y: np.log(pred(y) / meas), [curves.memory_gbps], [1e-3], [peak_memory_gbps])
    residuals["heads"] = _rel_rms(pred(y), meas)
    return curves.with_module_gbps("logits", y[0])


def samples_to_json(samples: ShapeSamples) -> dict:
    """Raw samples as plain data (kept beside a fitted profile, so it can be refitted without a GPU). Memory-bound
    samples are timed forward only, so their ops' backward fields are not kept; layer ops are rebuilt from the
    model."""
    return {"gemm": [[op.m, op.n, op.k, t] for op, t in samples.gemm],
            "attention": [[op.batch, op.seq, op.heads, op.kv_heads, op.head_dim, op.backward, t]
                          for op, t in samples.attention],
            "elementwise": [[op.name, op.nbytes, op.kernels, t] for op, t in samples.elementwise],
            "layers": [[name, t] for name, _, t in samples.layers],
            "heads": [[*shape, t] for shape, _, t in samples.heads]}


def samples_from_json(data: dict) -> ShapeSamples:
    """Inverse of samples_to_json; layer passes are named '<model> fwd|bwd s<seq> b<batch>' and their
    operations are listed again from the model (a preset or config.json path)."""
    from slidedp.compute import backward_ops
    from slidedp.model_spec import load_model_spec

    s = ShapeSamples()
    s.gemm = [(Gemm(int(m), int(n), int(k)), float(t)) for m, n, k, t in data.get("gemm", [])]
    s.attention = [(Attention(int(b), int(q), int(h), int(kv), int(d), bool(bw)), float(t))
                   for b, q, h, kv, d, bw, t in data.get("attention", [])]
    s.elementwise = [(Elementwise(str(name), float(nb), int(k)), float(t))
                     for name, nb, k, t in data.get("elementwise", [])]
    for name, t in data.get("layers", []):
        try:
            model, direction, seq, batch = name.rsplit(" ", 3)
            ops = load_model_spec(model).layer_forward_ops(int(batch[1:]), int(seq[1:]))
        except (ValueError, SlideDPError):
            raise SlideDPError(f"layer sample {name!r}: expected '<model> fwd|bwd s<seq> b<batch>'") from None
        s.layers.append((name, ops if direction == "fwd" else backward_ops(ops), float(t)))
    for tokens, hidden, vocab, t in data.get("heads", []):
        s.heads.append(head_sample(int(tokens), int(hidden), int(vocab), float(t)))
    return s


def head_sample(tokens: int, hidden: int, vocab: int, seconds: float):
    """One timed loss-head chunk of ``tokens`` tokens against its forward + backward operations."""
    from slidedp.compute import loss_head_ops

    fwd, bwd = loss_head_ops(hidden, vocab, tokens, tokens)
    return (tokens, hidden, vocab), [*fwd, *bwd], seconds
