"""Model fits: transfer latency + size/bandwidth, and GPU layer time vs tokens and sequence length.

Each fit returns its parameters and the relative RMS residual, so a profile says how well it explains
the measurements it came from.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit, nnls

from slidedp.errors import SlideDPError
from slidedp.hardware import layer_forward_seconds


@dataclass(frozen=True)
class LinkFit:
    latency_s: float
    bandwidth_Bps: float
    residual: float  # relative RMS of time


@dataclass(frozen=True)
class ComputeFit:
    matmul_tflops: float
    half_efficiency_tokens: float
    attention_tflops: float
    overhead_s: float
    residual: float


def _relative_rms(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.sqrt(np.mean(((predicted - measured) / measured) ** 2)))


def fit_link(sizes_bytes, seconds) -> LinkFit:
    """t = latency + size / bandwidth, by non-negative least squares weighted to relative error."""
    x, t = np.asarray(sizes_bytes, dtype=float), np.asarray(seconds, dtype=float)
    if len(x) < 2 or np.any(t <= 0) or np.any(x <= 0):
        raise SlideDPError("a link fit needs at least two positive (size, time) samples")
    a = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    (lat, inv_bw), _ = nnls(a, np.ones_like(t))
    if inv_bw <= 0:
        raise SlideDPError("link fit: times do not grow with size")
    pred = lat + x * inv_bw
    return LinkFit(float(lat), float(1.0 / inv_bw), _relative_rms(pred, t))


def layer_time(x, matmul_tflops, half_tokens, attention_tflops, overhead_s):
    """The GPUSpec compute model (``slidedp.hardware.layer_forward_seconds``) in curve_fit's calling convention:
    ``x`` = (linear FLOPs, attention FLOPs, tokens) arrays, then the four fitted parameters."""
    linear_flops, attention_flops, tokens = x
    return layer_forward_seconds(linear_flops, attention_flops, tokens, matmul_tflops, half_tokens, attention_tflops,
                                 overhead_s)


def fit_compute(linear_flops, attention_flops, tokens, seconds) -> ComputeFit:
    x = (np.asarray(linear_flops, float), np.asarray(attention_flops, float), np.asarray(tokens, float))
    t = np.asarray(seconds, float)
    if len(t) < 4:
        raise SlideDPError("a compute fit needs at least four samples (tokens and sequence lengths varied)")
    rate = float(np.median((x[0] + x[1]) / t)) / 1e12  # start from the observed rate: a GPU or a laptop CPU
    guess = (rate, 128.0, rate, 1e-5)
    try:
        with warnings.catch_warnings():  # the covariance is not used; an unidentifiable term only widens it
            warnings.simplefilter("ignore", OptimizeWarning)
            params, _ = curve_fit(layer_time, x, t, p0=guess, sigma=t,
                                  bounds=([1e-6, 0, 1e-6, 0], [1e4, 1e5, 1e4, 1.0]), maxfev=20000)
    except (RuntimeError, ValueError) as exc:
        raise SlideDPError(f"compute fit failed: {exc}") from None
    pred = layer_time(x, *params)
    return ComputeFit(*(float(p) for p in params), _relative_rms(pred, t))


@dataclass(frozen=True)
class BackwardFit:
    linear_ratio: float
    attention_ratio: float
    residual: float


def fit_backward_ratios(linear_s, attention_s, backward_s, overhead_s: float) -> BackwardFit:
    """backward = a x linear forward time + b x attention forward time + overhead, by non-negative least
    squares weighted to relative error. When one of the two is not identifiable (e.g. every sample has the
    same share of attention) both get one common ratio."""
    lin, att, t = (np.asarray(v, dtype=float) for v in (linear_s, attention_s, backward_s))
    if len(t) < 2 or np.any(t <= 0):
        raise SlideDPError("a backward fit needs at least two positive timings")
    target = np.maximum(t - overhead_s, 1e-12)
    a = np.stack([lin, att], axis=1) / target[:, None]
    (ra, rb), _ = nnls(a, np.ones_like(t))
    if ra <= 0 or rb <= 0:  # attention (or linears) not identifiable: one common ratio
        common = float(np.sum(target * (lin + att)) / np.sum((lin + att) ** 2))
        ra = rb = common
    pred = ra * lin + rb * att + overhead_s
    return BackwardFit(float(ra), float(rb), _relative_rms(pred, t))


def thread_curve(threads, rates) -> dict[int, float]:
    """Measured rate per thread count, made non-decreasing (more threads never predicted slower)."""
    pairs = sorted(zip((int(t) for t in threads), (float(r) for r in rates), strict=True))
    curve: dict[int, float] = {}
    best = 0.0
    for th, rate in pairs:
        best = max(best, rate)
        curve[th] = best
    return curve
