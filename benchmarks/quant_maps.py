"""Round-trip error of 8-bit Adam moment maps and block sizes: the measurement behind the choice in
runtime/compact_adam.py (maps) and slidedp/state_precision.py (INT8_BLOCK).

Moments are made the way Adam makes them: an EMA (beta1 0.9, beta2 0.95, 30 steps) of heavy-tailed gradients
(normal / uniform(0.05, 1): a tail like Student-t with ~1 degree of freedom) whose scale varies log-normally
from element to element (sigma in natural-log units: 0.5 ~ a factor 1.6, 2 ~ a factor 7 per standard
deviation). The figure of merit is what the update uses, the direction m / (sqrt(v) + eps): its relative RMS
error after a round trip of m and v through the map, over all elements (every element's update has size ~lr,
so each counts alike), and the share of elements whose update is off by more than 25%.

    python -m benchmarks.quant_maps [--n 1048576] [--out results.md]
"""

from __future__ import annotations

import argparse

import torch

from slidedp.runtime import compact_adam as ca


def moments(n: int, sigma: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(n, generator=g) * sigma) * 1e-3
    m, v = torch.zeros(n), torch.zeros(n)
    for _ in range(30):
        grad = torch.randn(n, generator=g) / (torch.rand(n, generator=g) * 0.95 + 0.05) * scale
        m = 0.9 * m + 0.1 * grad
        v = 0.95 * v + 0.05 * grad * grad
    return m, v


def power_map(x: torch.Tensor, block: int, power: float, levels: int) -> torch.Tensor:
    """Round trip through a signed power map x = absmax * sign * (q / levels) ** power, q integer (power 1:
    linear; 2: the sqrt map; 4 for v: the chosen one)."""
    n = x.numel()
    pad = (-n) % block
    xb = torch.cat([x, x.new_zeros(pad)]).view(-1, block)
    absmax = xb.abs().amax(1, keepdim=True).clamp_min(1e-38)
    q = torch.round((xb.abs() / absmax) ** (1 / power) * levels)
    return (torch.sign(xb) * (q / levels) ** power * absmax).reshape(-1)[:n]


def direction_error(m: torch.Tensor, v: torch.Tensor, mq: torch.Tensor, vq: torch.Tensor) -> tuple[float, float]:
    eps = 1e-8
    exact = m / (v.sqrt() + eps)
    approx = mq / (vq.sqrt() + eps)
    rel = float((approx - exact).norm() / exact.norm())
    off = float(((approx - exact).abs() > 0.25 * exact.abs().clamp_min(1e-3)).float().mean())
    return rel, off


def chosen(m: torch.Tensor, v: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    return ca.dequantize_m(*ca.quantize_m(m, block), block), ca.dequantize_v(*ca.quantize_v(v, block), block)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    maps = {"linear m, linear v": (1, 1), "linear m, sqrt v": (1, 2), "sqrt m, sqrt v": (2, 2),
            "sqrt m, power-4 v": (2, 4)}
    lines = ["| element scale sigma | block | maps | rel. RMS error of m/sqrt(v) | elements off > 25% |",
             "|---|---|---|---|---|"]
    for sigma in (0.5, 1.0, 2.0):
        m, v = moments(args.n, sigma)
        for block in (64, 256, 2048):
            for name, (pm, pv) in maps.items():
                rel, off = direction_error(m, v, power_map(m, block, pm, 127), power_map(v, block, pv, 255))
                lines.append(f"| {sigma} | {block} | {name} | {rel:.4f} | {off:.4f} |")
            rel, off = direction_error(m, v, *chosen(m, v, block))
            lines.append(f"| {sigma} | {block} | sqrt m, power-4 v (runtime/compact_adam.py) | {rel:.4f} | {off:.4f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
