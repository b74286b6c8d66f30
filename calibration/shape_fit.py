"""Fit shape-aware compute curves (slidedp.compute.ComputeCurves) to micro-benchmarks over a grid of shapes.

Each family is fitted to its own samples, in relative error, so a fast small kernel counts as much as a
slow big one: GEMMs give the asymptotic rate, the three half-efficiency dimensions and the per-kernel
cost; attention its forward and backward rates and half-efficiency sequence length (kernel cost held);
memory-bound modules the achieved bandwidth (kernel cost held); whole decoder layers of a calibration
model the per-pass overhead that the operations leave unexplained. Every fitted value is checked against
what a GPU can physically do; a value that is not credible is reported, not silently kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from slidedp.compute import Attention, ComputeCurves, ComputeOp, Elementwise, Gemm
from slidedp.errors import SlideDPError


@dataclass
class ShapeSamples:
    """Measured seconds per operation (or op list, for whole layers), as the micro-benchmarks record them."""

    gemm: list[tuple[Gemm, float]] = field(default_factory=list)
    attention: list[tuple[Attention, float]] = field(default_factory=list)
    elementwise: list[tuple[Elementwise, float]] = field(default_factory=list)
    # (name, ops of one pass, seconds): whole units of calibration models, forward or backward
    layers: list[tuple[str, list[ComputeOp], float]] = field(default_factory=list)


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
    if samples.attention:
        a_ops = [op for op, _ in samples.attention]
        a_t = np.array([t for _, t in samples.attention])
        a_f = np.array([op.flops for op in a_ops])
        a_seq = np.array([op.seq for op in a_ops], dtype=float)
        a_bwd = np.array([op.backward for op in a_ops])

        def att_pred(x):
            rate = np.where(a_bwd, x[1], x[0])
            return a_f / (rate * 1e12 * a_seq / (a_seq + x[2])) + kernel_us * 1e-6

        r0 = float(np.median(a_f / a_t)) / 1e12
        if a_bwd.any() and not a_bwd.all():
            x = _solve(lambda x: np.log(att_pred(x) / a_t), [r0, r0, 256.0], [1e-6, 1e-6, 0],
                       [peak_tflops, peak_tflops, 1e6])
        else:  # one direction measured: both get its rate
            x1 = _solve(lambda x: np.log(att_pred([x[0], x[0], x[1]]) / a_t), [r0, 256.0], [1e-6, 0],
                        [peak_tflops, 1e6])
            x = [x1[0], x1[0], x1[1]]
            warnings.append("attention: only one direction measured; forward and backward share its rate")
        att_fwd, att_bwd, half_seq = (float(v) for v in x)
        residuals["attention"] = _rel_rms(att_pred(x), a_t)

    memory_gbps = peak_memory_gbps * 0.7
    if samples.elementwise:
        e_b = np.array([op.nbytes for op, _ in samples.elementwise])
        e_k = np.array([op.kernels for op, _ in samples.elementwise], dtype=float)
        e_t = np.array([t for _, t in samples.elementwise])

        def mem_pred(x):
            return e_b / (x[0] * 1e9) + e_k * kernel_us * 1e-6

        x = _solve(lambda x: np.log(mem_pred(x) / e_t), [float(np.median(e_b / e_t)) / 1e9], [1e-3],
                   [peak_memory_gbps])
        memory_gbps = float(x[0])
        residuals["elementwise"] = _rel_rms(mem_pred(x), e_t)

    curves = ComputeCurves(gemm_tflops, hm, hn, hk, att_fwd, att_bwd, half_seq, memory_gbps, kernel_us, 0.0)
    overhead_us = 0.0
    if samples.layers:
        unexplained = [t - curves.total_seconds(ops) for _, ops, t in samples.layers]
        overhead_us = max(0.0, float(np.median(unexplained)) * 1e6)
        curves = ComputeCurves(gemm_tflops, hm, hn, hk, att_fwd, att_bwd, half_seq, memory_gbps, kernel_us,
                               overhead_us)
        pred = np.array([curves.total_seconds(ops) + overhead_us * 1e-6 for _, ops, _ in samples.layers])
        residuals["layers"] = _rel_rms(pred, np.array([t for _, _, t in samples.layers]))

    for name, value, bound in (("gemm_tflops", gemm_tflops, peak_tflops),
                               ("attention_fwd_tflops", att_fwd, peak_tflops),
                               ("attention_bwd_tflops", att_bwd, peak_tflops),
                               ("memory_gbps", memory_gbps, peak_memory_gbps)):
        if value >= 0.995 * bound:
            warnings.append(f"{name} {value:.4g} sits at the chip's peak {bound:.4g}: not credible")
    for family, res in residuals.items():
        if not math.isfinite(res) or res > 0.25:
            warnings.append(f"{family}: the fitted curve misses its samples by {100 * res:.0f}% RMS")
    return ShapeFit(curves, residuals, tuple(warnings))
