"""AdamW on compact host state (bf16 master and/or bf16 or 8-bit moments): the torch path, its rounding rules
and the 8-bit maps. The C++ kernel in runtime/cpu_adam.py does the same arithmetic in one pass; this module is
its fallback where no compiler exists and the reference it is tested against bit for bit.

Bit-identical by construction: every step below is one IEEE fp32 operation (+, -, *, /, sqrt, round half to
even) in a fixed order, with fp32-representable constants, and the kernel is built without FMA contraction.
Both sides round fp32 -> bf16 the same ways (nearest-even for the streamed weights, stochastic for state).

Stochastic rounding (bf16 master and bf16 moments): add 16 random bits below the bf16 mantissa and truncate,
so E[round(x)] = x and tiny updates (lr * update < half a bf16 ulp) are not lost. The bits come from a
counter-based hash of (seed, step, which tensor, global parameter index): no generator state, so results do
not depend on thread count or chunking, and a resumed run draws the same bits as an uninterrupted one.

8-bit moments, blockwise: each block of INT8_BLOCK elements stores one fp32 absmax scale per moment and
  exp_avg     int8  q = round(127 * sqrt(|m| / absmax)) * sign(m),  m = absmax * (q/127) * |q/127|
  exp_avg_sq  uint8 q = round(255 * (v / absmax) ** (1/4)),       v = absmax * (q/255) ** 4
(a positive v never stores as 0: it would turn m / sqrt(v) into m / eps). Levels are decoded by multiplying
with fp32 1/127 and 1/255 (no divide), and v's code reuses sqrt(v) of the update: on a CPU whose vector
sqrt and divide are slow these are most of the arithmetic. Power maps spend the 8 bits where
the Adam update needs them: the update divides by sqrt(v), so small v need fine steps, and most elements of a
block are far below its absmax.
Measured on Adam-like moment blocks (benchmarks/quant_maps.py; results in benchmarks/RESULTS.md, "Compact host
state"): the relative RMS error of the update direction m / sqrt(v) after a round trip is 1.4% / 3.2% with these
maps at 256 blocks (element scales spread by sigma 0.5 / 1 in log space), against 3.2% / ~900x (small v rounded
to 0) with a linear m and a sqrt-map v. Blocks: 64 gives 1.2% / 2.4% for 4x the scale bytes (6% of a moment's
bytes instead of 1.6%), 2048 gives 1.8% / 4.5% and 2.2x as many elements off by > 25%; 256 is the knee.
Like bitsandbytes, the update itself uses the fp32 m and v of this step
(dequantized, then updated); only the stored copies are 8-bit. The maps are computed with sqrt, multiplies and
one divide per block (vectorizable, correctly rounded in both implementations), not looked up in a table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slidedp.state_precision import INT8_BLOCK

M_LEVELS = 127.0  # int8 levels of |m| (signed power-2 map)
V_LEVELS = 255.0  # uint8 levels of v (power-4 map)
_MASK32 = 0xFFFFFFFF
STREAM_MASTER, STREAM_EXP_AVG, STREAM_EXP_AVG_SQ = 1, 2, 3  # which tensor a rounding bit belongs to


def mix32(x: int) -> int:
    """A 32-bit integer hash (lowbias32): the counter-based generator of the stochastic rounding."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    x ^= x >> 16
    return x


def rounding_key(seed: int, step: int, stream: int) -> int:
    """The hash key of one tensor's rounding bits at one optimizer step."""
    return mix32(mix32(mix32(seed) ^ stream) ^ (step & _MASK32))


def _mix32_t(x: torch.Tensor) -> torch.Tensor:
    """mix32 over an int64 tensor of 32-bit values (products stay below 2**63)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def rounding_bits(key: int, index0: int, n: int) -> torch.Tensor:
    """32 random bits for global parameter indices index0 .. index0 + n - 1 (int64 tensor)."""
    idx = torch.arange(index0, index0 + n, dtype=torch.int64)
    return _mix32_t((idx & _MASK32) ^ _mix32_t((idx >> 32) ^ key))


def bf16_stochastic(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 with stochastic rounding from ``bits`` (the top 16 are used); NaN stays NaN."""
    u = x.view(torch.int32).to(torch.int64) & _MASK32
    r = ((u + (bits >> 16)) >> 16) & 0xFFFF
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = torch.where(nan, (u >> 16) | 0x40, r)
    r = torch.where(r >= 0x8000, r - 0x10000, r)
    return r.to(torch.int16).view(torch.bfloat16)


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 sqrt (what the kernel's sqrtf gives): torch's vectorized fp32 sqrt is not always
    (~16% of random inputs differ by an ulp), a float64 sqrt rounded to fp32 is (double rounding is innocuous
    for sqrt at these widths)."""
    return torch.sqrt(x.to(torch.float64)).to(torch.float32)


def _f32(x: float) -> float:
    """A Python float rounded to the nearest fp32 (what the kernel's float arguments become)."""
    return torch.tensor(x, dtype=torch.float32).item()


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """[blocks, block] view of x, zero-padded at the end (zeros change neither absmax nor any element)."""
    pad = (-x.numel()) % block
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.view(-1, block)


def _inverse(absmax: torch.Tensor) -> torch.Tensor:
    return torch.where(absmax > 0, 1.0 / absmax, torch.zeros_like(absmax))


def quantize_m(m: torch.Tensor, block: int = INT8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 first moment -> (int8 codes, fp32 absmax per block), signed power-2 map."""
    n = m.numel()
    mb = _blocks(m, block)
    absmax = mb.abs().amax(dim=1)
    r = mb * _inverse(absmax)[:, None]
    q = torch.round(_sqrt(r.abs()) * M_LEVELS).clamp_(max=M_LEVELS)
    q = torch.where(mb < 0, -q, q)
    return q.reshape(-1)[:n].to(torch.int8), absmax


def dequantize_m(q: torch.Tensor, absmax: torch.Tensor, block: int = INT8_BLOCK) -> torch.Tensor:
    n = q.numel()
    t = _blocks(q.to(torch.float32), block) * _f32(1.0 / M_LEVELS)
    return (t * t.abs() * absmax[:, None]).reshape(-1)[:n]


def quantize_v(v: torch.Tensor, block: int = INT8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 second moment (>= 0) -> (uint8 codes, fp32 absmax per block), power-4 map, computed as
    sqrt(sqrt(v) / sqrt(absmax)): the kernel reuses sqrt(v) from the update's denominator (one sqrt less)."""
    n = v.numel()
    vb = _blocks(v, block)
    absmax = vb.amax(dim=1)
    inv = torch.where(absmax > 0, 1.0 / _sqrt(absmax), torch.zeros_like(absmax))
    q = torch.round(_sqrt(_sqrt(vb) * inv[:, None]) * V_LEVELS).clamp_(max=V_LEVELS)
    q = torch.where((q == 0) & (vb > 0), torch.ones_like(q), q)
    return q.reshape(-1)[:n].to(torch.uint8), absmax


def dequantize_v(q: torch.Tensor, absmax: torch.Tensor, block: int = INT8_BLOCK) -> torch.Tensor:
    n = q.numel()
    t = _blocks(q.to(torch.float32), block) * _f32(1.0 / V_LEVELS)
    t2 = t * t
    return (t2 * t2 * absmax[:, None]).reshape(-1)[:n]


@dataclass(frozen=True)
class AdamScalars:
    """The per-step scalars of the update, as the kernel receives them (fp32 where the kernel uses fp32)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    step: int
    grad_scale: float
    seed: int


@dataclass
class CompactRange:
    """Views of one update range of the host state: master (fp32|bf16), moments (fp32|bf16|int8/uint8 with
    their block scales, None otherwise), the gradient (bf16|fp32) and where the new streamed weights go
    (None with a bf16 master: the master is the streamed weight)."""

    master: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    exp_avg_scale: torch.Tensor | None
    exp_avg_sq_scale: torch.Tensor | None
    grad: torch.Tensor
    weights: torch.Tensor | None
    index0: int  # global index of the range's first parameter (the rounding bits' counter)


def load_moments(r: CompactRange) -> tuple[torch.Tensor, torch.Tensor]:
    """The range's moments in fp32."""
    if r.exp_avg.dtype == torch.int8:
        return dequantize_m(r.exp_avg, r.exp_avg_scale), dequantize_v(r.exp_avg_sq, r.exp_avg_sq_scale)
    return r.exp_avg.to(torch.float32), r.exp_avg_sq.to(torch.float32)


def store_moments(r: CompactRange, m: torch.Tensor, v: torch.Tensor, s: AdamScalars | None) -> None:
    """Write fp32 moments into the range's storage: 8-bit codes + scales, or bf16 (stochastic with ``s``,
    nearest-even without: a write-back from outside the update), or fp32."""
    if r.exp_avg.dtype == torch.int8:
        qm, sm = quantize_m(m)
        qv, sv = quantize_v(v)
        r.exp_avg.copy_(qm)
        r.exp_avg_sq.copy_(qv)
        r.exp_avg_scale.copy_(sm)
        r.exp_avg_sq_scale.copy_(sv)
    elif r.exp_avg.dtype == torch.bfloat16 and s is not None:
        n = m.numel()
        r.exp_avg.copy_(bf16_stochastic(m, rounding_bits(rounding_key(s.seed, s.step, STREAM_EXP_AVG), r.index0, n)))
        r.exp_avg_sq.copy_(bf16_stochastic(v, rounding_bits(rounding_key(s.seed, s.step, STREAM_EXP_AVG_SQ),
                                                            r.index0, n)))
    else:
        r.exp_avg.copy_(m)
        r.exp_avg_sq.copy_(v)


def compact_adamw_(r: CompactRange, s: AdamScalars) -> None:
    """One AdamW step of the range in torch: the kernel's arithmetic, operation by operation."""
    import math

    n = r.master.numel()
    if n == 0:
        return
    b2 = _f32(s.beta2)
    omb1, omb2 = _f32(1.0 - s.beta1), _f32(1.0 - s.beta2)
    decay = _f32(1.0 - s.lr * s.weight_decay)
    bc1, bc2 = 1.0 - math.pow(s.beta1, s.step), 1.0 - math.pow(s.beta2, s.step)
    step_size, inv_sqrt_bc2 = _f32(s.lr / bc1), _f32(1.0 / math.sqrt(bc2))
    eps, scale = _f32(s.eps), _f32(s.grad_scale)
    m, v = load_moments(r)
    g = r.grad.to(torch.float32) * scale
    m = m + omb1 * (g - m)
    v = b2 * v + (omb2 * g) * g
    p = r.master.to(torch.float32) * decay - (step_size * m) / (_sqrt(v) * inv_sqrt_bc2 + eps)
    if r.master.dtype == torch.bfloat16:
        r.master.copy_(bf16_stochastic(p, rounding_bits(rounding_key(s.seed, s.step, STREAM_MASTER), r.index0, n)))
    else:
        r.master.copy_(p)
    if r.weights is not None:
        r.weights.copy_(p)  # nearest-even into a bf16 slot, exact into an fp32 one
    store_moments(r, m, v, s)


def compact_update(kernel, r: CompactRange, s: AdamScalars) -> None:
    """One step of the range with the compiled kernel (runtime/cpu_adam.py), or the torch path when ``kernel``
    is None: the same bits either way."""
    if kernel is None:
        compact_adamw_(r, s)
        return
    keys = [rounding_key(s.seed, s.step, k) for k in (STREAM_MASTER, STREAM_EXP_AVG, STREAM_EXP_AVG_SQ)]
    kernel.adamw_compact(r.master, r.exp_avg, r.exp_avg_sq, r.exp_avg_scale, r.exp_avg_sq_scale, r.grad, r.weights,
                         s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, float(s.step), s.grad_scale, *keys, r.index0)
