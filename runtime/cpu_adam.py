"""A one-pass CPU AdamW for a bf16 gradient slot: read the gradient and fp32 state once, write the fp32
state and the new bf16 weights once (28 bytes per parameter of DRAM traffic). ``adamw_compact`` does the same
for compact state (bf16 master and/or bf16 or blockwise 8-bit moments, runtime/compact_adam.py says how and
is its bit-identical torch fallback): per block of INT8_BLOCK elements it dequantizes the moments into L1,
updates, writes the master (stochastically rounded when bf16) and the streamed weights, and quantizes back.

torch's fused CPU AdamW needs an fp32 gradient and a separate fp32 -> bf16 cast, so the stock path
makes three passes (upcast, update, cast) over memory; on a host where DRAM bandwidth is the limit that
is the difference between hiding the update under compute and exposing it. The kernel is compiled on
first use with torch.utils.cpp_extension (g++ and OpenMP); where that fails the stock path is used.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slidedp.state_precision import INT8_BLOCK

_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <optional>
#include <omp.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN stays NaN; branch-free
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    return static_cast<uint16_t>(((u & 0x7fffffffu) > 0x7f800000u) ? quiet_nan : rounded);
}

// ---- compact state -------------------------------------------------------------------------------------
// Every line is one IEEE fp32 operation in the order runtime/compact_adam.py uses (built without FMA
// contraction), so this kernel and the torch path agree bit for bit.
static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}

static inline uint32_t rounding_bits(uint32_t key, int64_t index) {
    return mix32(static_cast<uint32_t>(index) ^ mix32(static_cast<uint32_t>(index >> 32) ^ key));
}

static inline uint16_t f32_to_bf16_sr(float f, uint32_t bits) {  // stochastic rounding, NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t rounded = (u + (bits >> 16)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    return static_cast<uint16_t>(((u & 0x7fffffffu) > 0x7f800000u) ? quiet_nan : rounded);
}

enum { F32 = 0, BF16 = 1, Q8 = 2 };          // storage of master / moments / gradient
enum { W_NONE = 0, W_GRAD = 1, W_BF16 = 2 };  // streamed weights: none (bf16 master), into the gradient slot, apart

struct Compact {
    void* master; void* m; void* v; float* m_scale; float* v_scale; void* grad; uint16_t* weights;
    int64_t n, index0;
    float omb1, b2, omb2, decay, step_size, inv_sqrt_bc2, eps, scale;
    uint32_t key_p, key_m, key_v;
};

// The state's pointers of a Compact as restrict-qualified locals in every storage view (only the template's own
// kinds are used): through the struct, a store to the state could alias its fields and the compiler would neither
// hoist nor vectorize. The gradient may be the weights' slot too (W_GRAD), so it alone is not restrict.
#define SLIDEDP_STATE_POINTERS(a)                                              \
    float* __restrict__ p32 = static_cast<float*>((a).master);                 \
    uint16_t* __restrict__ p16 = static_cast<uint16_t*>((a).master);           \
    float* __restrict__ m32 = static_cast<float*>((a).m);                      \
    float* __restrict__ v32 = static_cast<float*>((a).v);                      \
    uint16_t* __restrict__ m16 = static_cast<uint16_t*>((a).m);                \
    uint16_t* __restrict__ v16 = static_cast<uint16_t*>((a).v);                \
    int8_t* __restrict__ m8 = static_cast<int8_t*>((a).m);                     \
    uint8_t* __restrict__ v8 = static_cast<uint8_t*>((a).v);                   \
    float* g32 = static_cast<float*>((a).grad);                                \
    uint16_t* g16 = static_cast<uint16_t*>((a).grad);                          \
    uint16_t* __restrict__ w16 = (a).weights

#if defined(__AVX2__)
// The 8-bit codes of a block, 32 elements at a time, the same operations as the loop in compact_block (which
// does the tail): gcc vectorizes that loop, but narrows float -> int8 with a mask, a pack and a lane fix-up per
// halving, and spills; here one mask per vector and 2 packs + 1 permute per 32 codes. Returns how many it did.
static inline int64_t quantize_avx2(const float* mb, const float* sb, float im, float iv, int64_t len,
                                    int8_t* m8, uint8_t* v8) {
    const __m256 vim = _mm256_set1_ps(im), viv = _mm256_set1_ps(iv);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
    const __m256 c127 = _mm256_set1_ps(127.0f), c255 = _mm256_set1_ps(255.0f), one = _mm256_set1_ps(1.0f);
    const __m256 zero = _mm256_setzero_ps();
    const __m256i low_byte = _mm256_set1_epi32(0xff);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the packs' per-lane interleave
    constexpr int round_mode = _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC;  // what nearbyint compiles to
    int64_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m256i qm[4], qv[4];
        for (int k = 0; k < 4; ++k) {
            const __m256 m = _mm256_load_ps(mb + i + 8 * k);
            const __m256 r = _mm256_and_ps(_mm256_mul_ps(m, vim), abs_mask);
            __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_sqrt_ps(r), c127), round_mode);
            q = _mm256_min_ps(c127, q);                                     // std::min(q, 127): NaN stays NaN
            q = _mm256_or_ps(q, _mm256_and_ps(m, sign_mask));                // copysign(q, m): q >= 0 or NaN
            qm[k] = _mm256_and_si256(_mm256_cvttps_epi32(q), low_byte);   // the int8 (two's complement) byte
            const __m256 sv = _mm256_load_ps(sb + i + 8 * k);
            __m256 w = _mm256_round_ps(_mm256_mul_ps(_mm256_sqrt_ps(_mm256_mul_ps(sv, viv)), c255), round_mode);
            w = _mm256_min_ps(c255, w);
            w = _mm256_max_ps(_mm256_and_ps(_mm256_cmp_ps(sv, zero, _CMP_GT_OQ), one), w);  // std::max(w, v > 0)
            qv[k] = _mm256_and_si256(_mm256_cvttps_epi32(w), low_byte);
        }
        const __m256i mq = _mm256_packus_epi16(_mm256_packus_epi32(qm[0], qm[1]), _mm256_packus_epi32(qm[2], qm[3]));
        const __m256i vq = _mm256_packus_epi16(_mm256_packus_epi32(qv[0], qv[1]), _mm256_packus_epi32(qv[2], qv[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(m8 + i), _mm256_permutevar8x32_epi32(mq, order));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(v8 + i), _mm256_permutevar8x32_epi32(vq, order));
    }
    return i;
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define SLIDEDP_AVX512 1
// A whole block (len == SLIDEDP_BLOCK, FLAT) with AVX-512 intrinsics: one loop does dequantize, update, the
// streamed weights and every stochastic rounding, 16 lanes at a time in registers; only the 8-bit codes need
// a second pass, after the block's absmax (compact_run interleaves it with the next block's loop). On a
// Sapphire Rapids VM: 1.7-2x the rate of compact_block at 16M parameters, 1.25-1.35x on L2-resident state,
// where the divider (3 sqrt + 1 divide per element with 8-bit moments) is near its limit. The same IEEE fp32
// operations in the same order as compact_block (mul, add, sub, div, sqrt, round: all exact-rounded, no FMA)
// and the same integer bit manipulations for bf16 rounding, so the same bits.
static inline __m512i mix32_x16(__m512i x) {
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

constexpr int64_t PREFETCH_AHEAD = 1024;  // elements: 4 blocks (1-4 KB a stream); 512..4096 measured alike

static inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }

static inline __m512 bf16x16_load(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

static inline __m512i quiet_nan_fix(__m512i u, __m512i r) {  // (u & 0x7fffffff) > 0x7f800000 ? (u >> 16) | 0x40 : r
    const __mmask16 nan = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(u), 0x81);  // quiet or signalling NaN
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

static inline void bf16x16_store_rne(uint16_t* p, __m512 f) {  // f32_to_bf16
#if defined(__AVX512BF16__)
    // vcvtneps2bf16 is this rounding (nearest-even, NaN -> (u >> 16) | 0x40) except that it reads a denormal as 0
    if (_mm512_fpclass_ps_mask(f, 0x20) == 0) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(f)));
        return;
    }
#endif
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(quiet_nan_fix(u, r)));
}

static inline void bf16x16_store_sr(uint16_t* p, __m512 f, __m512i bits) {  // f32_to_bf16_sr
    const __m512i u = _mm512_castps_si512(f);
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_srli_epi32(bits, 16)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(quiet_nan_fix(u, r)));
}

// The 8-bit codes of a block whose update is done: its m and sqrt(v) in L1 and the inverse scales.
struct Q8Pending {
    alignas(64) float mb[SLIDEDP_BLOCK];
    alignas(64) float sb[SLIDEDP_BLOCK];
    float im, iv;
    int8_t* m8;
    uint8_t* v8;
};

// Codes of elements [i, i + 16) of a pending block: the codes of the tail loop of compact_block, with the rounding
// and the clamps in integers where that is the same function: cvtps2dq rounds like nearbyint (the current mode)
// and is exact on min(x, 127) (round then clamp = clamp then round for a clamp at an integer); NaN (and only NaN)
// becomes 0x80000000, which a negation keeps, an unsigned max keeps and the byte store truncates to 0, the
// byte compact_block writes for NaN; negating the integer where m's sign bit is set is copysign.
static inline void quantize16(const Q8Pending& q8, int64_t i) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    const __m512 c127 = _mm512_set1_ps(127.0f), c255 = _mm512_set1_ps(255.0f);
    const __m512 m = _mm512_load_ps(q8.mb + i);
    const __m512i mr = _mm512_castps_si512(_mm512_mul_ps(m, _mm512_set1_ps(q8.im)));
    const __m512 r = _mm512_castsi512_ps(_mm512_and_si512(mr, abs_mask));
    __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(c127, _mm512_mul_ps(_mm512_sqrt_ps(r), c127)));  // NaN stays NaN
    q = _mm512_mask_sub_epi32(q, _mm512_movepi32_mask(_mm512_castps_si512(m)), _mm512_setzero_si512(), q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q8.m8 + i), _mm512_cvtepi32_epi8(q));
    const __m512 x = _mm512_load_ps(q8.sb + i);
    const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(q8.iv));
    __m512i w = _mm512_cvtps_epi32(_mm512_min_ps(c255, _mm512_mul_ps(_mm512_sqrt_ps(y), c255)));
    // std::max(w, v > 0 ? 1 : 0): a positive v never codes as 0
    w = _mm512_mask_max_epu32(w, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), w, _mm512_set1_epi32(1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q8.v8 + i), _mm512_cvtepi32_epi8(w));
}

static inline void quantize_block(const Q8Pending& q8) {
    for (int64_t i = 0; i < SLIDEDP_BLOCK; i += 16) quantize16(q8, i);
}

// The update of block blk; with 8-bit moments its m and sqrt(v) go to next's buffers and the codes are left to
// the caller, and prev (when given) is the previous block's pending codes, quantized here in the same loop: the
// divider (two sqrt per element there) then works beside the update's multiplies instead of after them.
template <int MK, int QK, int GK, int WK>
static inline void compact_block_avx512(const Compact& a, int64_t blk, Q8Pending* next, const Q8Pending* prev) {
    constexpr int64_t B = SLIDEDP_BLOCK;
    static_assert(B % 16 == 0, "block of whole vectors");
    const float omb1 = a.omb1, b2 = a.b2, omb2 = a.omb2, decay = a.decay, step_size = a.step_size;
    const float inv_sqrt_bc2 = a.inv_sqrt_bc2, eps = a.eps, scale = a.scale;
    SLIDEDP_STATE_POINTERS(a);
    const int64_t s = blk * B;
    const int64_t base = a.index0 + s;
    const uint32_t lo = static_cast<uint32_t>(base), hi = static_cast<uint32_t>(base >> 32);
    const __m512i hp = _mm512_set1_epi32(static_cast<int>(mix32(hi ^ a.key_p)));
    const __m512i hm = _mm512_set1_epi32(static_cast<int>(mix32(hi ^ a.key_m)));
    const __m512i hv = _mm512_set1_epi32(static_cast<int>(mix32(hi ^ a.key_v)));
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lo_v = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(lo)), iota);
    const __m512 vomb1 = _mm512_set1_ps(omb1), vb2 = _mm512_set1_ps(b2), vomb2 = _mm512_set1_ps(omb2);
    const __m512 vdecay = _mm512_set1_ps(decay), vstep = _mm512_set1_ps(step_size);
    const __m512 vibc2 = _mm512_set1_ps(inv_sqrt_bc2), veps = _mm512_set1_ps(eps), vscale = _mm512_set1_ps(scale);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    float* __restrict__ mb = QK == Q8 ? next->mb : nullptr;
    float* __restrict__ sb = QK == Q8 ? next->sb : nullptr;
    __m512 sm = _mm512_setzero_ps(), sv = _mm512_setzero_ps();
    if (QK == Q8) { sm = _mm512_set1_ps(a.m_scale[blk]); sv = _mm512_set1_ps(a.v_scale[blk]); }
    __m512 am = _mm512_setzero_ps(), av = _mm512_setzero_ps();
    constexpr int64_t D = PREFETCH_AHEAD;
    for (int64_t i = 0; i < B; i += 16) {
        if (QK == Q8 && prev) quantize16(*prev, i);
        const int64_t j = s + i;
        // Each stream PREFETCH_AHEAD elements on (the 8-bit ones once per line): one thread alone is latency bound
        // on the reads without it (1.4-1.8x on a Sapphire Rapids VM); only the 8-bit codes skip the repeats.
        prefetch(MK == F32 ? static_cast<const void*>(p32 + j + D) : p16 + j + D);
        prefetch(GK == F32 ? static_cast<const void*>(g32 + j + D) : g16 + j + D);
        if (QK == F32) { prefetch(m32 + j + D); prefetch(v32 + j + D); }
        if (QK == BF16) { prefetch(m16 + j + D); prefetch(v16 + j + D); }
        if (QK == Q8 && i % 64 == 0) { prefetch(m8 + j + D); prefetch(v8 + j + D); }
        __m512 m0, v0;
        if (QK == F32) {
            m0 = _mm512_loadu_ps(m32 + j); v0 = _mm512_loadu_ps(v32 + j);
        } else if (QK == BF16) {
            m0 = bf16x16_load(m16 + j); v0 = bf16x16_load(v16 + j);
        } else {
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(m8 + j)))), _mm512_set1_ps(1.0f / 127.0f));
            m0 = _mm512_mul_ps(_mm512_mul_ps(t, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(t),
                                                                                    abs_mask))), sm);
            const __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(v8 + j)))), _mm512_set1_ps(1.0f / 255.0f));
            const __m512 w2 = _mm512_mul_ps(w, w);
            v0 = _mm512_mul_ps(_mm512_mul_ps(w2, w2), sv);
        }
        const __m512 g = _mm512_mul_ps(GK == F32 ? _mm512_loadu_ps(g32 + j) : bf16x16_load(g16 + j), vscale);
        const __m512 mi = _mm512_add_ps(m0, _mm512_mul_ps(vomb1, _mm512_sub_ps(g, m0)));
        const __m512 vi = _mm512_add_ps(_mm512_mul_ps(vb2, v0), _mm512_mul_ps(_mm512_mul_ps(vomb2, g), g));
        const __m512 p = MK == F32 ? _mm512_loadu_ps(p32 + j) : bf16x16_load(p16 + j);
        const __m512 si = _mm512_sqrt_ps(vi);
        const __m512 pn = _mm512_sub_ps(_mm512_mul_ps(p, vdecay),
            _mm512_div_ps(_mm512_mul_ps(vstep, mi), _mm512_add_ps(_mm512_mul_ps(si, vibc2), veps)));
        const __m512i idx = _mm512_add_epi32(lo_v, _mm512_set1_epi32(static_cast<int>(i)));
        if (MK == F32) {
            _mm512_storeu_ps(p32 + j, pn);
            if (WK == W_GRAD) {
                if (GK == F32) _mm512_storeu_ps(g32 + j, pn);
                else bf16x16_store_rne(g16 + j, pn);
            } else if (WK == W_BF16) {
                bf16x16_store_rne(w16 + j, pn);
            }
        } else {
            bf16x16_store_sr(p16 + j, pn, mix32_x16(_mm512_xor_si512(idx, hp)));
        }
        if (QK == F32) {
            _mm512_storeu_ps(m32 + j, mi); _mm512_storeu_ps(v32 + j, vi);
        } else if (QK == BF16) {
            bf16x16_store_sr(m16 + j, mi, mix32_x16(_mm512_xor_si512(idx, hm)));
            bf16x16_store_sr(v16 + j, vi, mix32_x16(_mm512_xor_si512(idx, hv)));
        } else {
            _mm512_store_ps(mb + i, mi); _mm512_store_ps(sb + i, si);
            // std::max(am, |mi|): a NaN element leaves am as it was, like the scalar max
            am = _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(mi), abs_mask)), am);
            av = _mm512_max_ps(vi, av);
        }
    }
    if (QK == Q8) {
        const float amax = _mm512_reduce_max_ps(am), vmax = _mm512_reduce_max_ps(av);
        a.m_scale[blk] = amax;
        a.v_scale[blk] = vmax;
        if (next) {  // quantized by the caller, interleaved with the next block's update
            next->im = amax > 0.0f ? 1.0f / amax : 0.0f;
            next->iv = vmax > 0.0f ? 1.0f / std::sqrt(vmax) : 0.0f;
            next->m8 = m8 + s;
            next->v8 = v8 + s;
        }
    }
}
#endif

// One block of SLIDEDP_BLOCK elements as a few short loops over L1 buffers, each simple enough that gcc
// vectorizes it without spilling registers (measured on a 2-core AVX2 EPYC: one loop doing everything ran
// 1.2-1.5x slower): dequantize (8-bit), update, then per output one loop: the streamed bf16 weights (fp32
// master), the stochastically rounded master (bf16), the rounded moments (bf16) or the 8-bit codes, which
// need the block's absmax first. fp32 state is read and written by the update loop itself: a copy into and
// out of buffers costs a third of the fp32-moment time.
// With AVX-512 (SLIDEDP_AVX512) whole FLAT blocks take compact_block_avx512 instead; this handles the rest.
// FLAT: the block's global indices share their high 32 bits (every block but one that straddles a multiple
// of 2**32), so the hash of the high half is hoisted out of the loop and the per-element hash is 32-bit lane
// arithmetic, 8 lanes per AVX2 register (rounding_bits() per element works in 4 int64 lanes plus packing).
// The same bits either way.
template <int MK, int QK, int GK, int WK, bool FLAT>
static inline void compact_block(const Compact& a, int64_t blk) {
    // Everything the loops read is a local (SLIDEDP_STATE_POINTERS says why).
    constexpr int64_t B = SLIDEDP_BLOCK;
    const int64_t n = a.n, index0 = a.index0;
    const float omb1 = a.omb1, b2 = a.b2, omb2 = a.omb2, decay = a.decay, step_size = a.step_size;
    const float inv_sqrt_bc2 = a.inv_sqrt_bc2, eps = a.eps, scale = a.scale;
    const uint32_t key_p = a.key_p, key_m = a.key_m, key_v = a.key_v;
    SLIDEDP_STATE_POINTERS(a);
    float* __restrict__ ms = a.m_scale;
    float* __restrict__ vs = a.v_scale;
    const int64_t s = blk * B;
    const int64_t len = std::min(B, n - s);
    const int64_t base = index0 + s;
    const uint32_t lo = static_cast<uint32_t>(base), hi = static_cast<uint32_t>(base >> 32);
    const uint32_t hp = mix32(hi ^ key_p), hm = mix32(hi ^ key_m), hv = mix32(hi ^ key_v);
    const float sm = QK == Q8 ? ms[blk] : 0.0f, sv = QK == Q8 ? vs[blk] : 0.0f;
    // L1 buffers between the loops (one element where a mode has no use for one): mb holds m (8-bit: first
    // the dequantized, then the new m), sb v (bf16: the new v; 8-bit: first the dequantized v, then sqrt of the
    // new v, the update's denominator that v's 8-bit map reuses), pb the new master for the loops that round it.
    alignas(64) float mb[QK != F32 ? B : 1];
    alignas(64) float sb[QK != F32 ? B : 1];
    alignas(64) float pb[MK == BF16 || QK != F32 ? B : 1];
    if (QK == Q8) {
        #pragma omp simd
        for (int64_t i = 0; i < len; ++i) {
            const float t = static_cast<float>(m8[s + i]) * (1.0f / 127.0f);
            mb[i] = t * std::fabs(t) * sm;
            const float w = static_cast<float>(v8[s + i]) * (1.0f / 255.0f);
            const float w2 = w * w;
            sb[i] = w2 * w2 * sv;
        }
    }
    float am = 0.0f, av = 0.0f;
    #pragma omp simd reduction(max:am, av)
    for (int64_t i = 0; i < len; ++i) {
        const int64_t j = s + i;
        float m0, v0;
        if (QK == F32) {
            m0 = m32[j]; v0 = v32[j];
        } else if (QK == BF16) {
            m0 = bf16_to_f32(m16[j]); v0 = bf16_to_f32(v16[j]);
        } else {
            m0 = mb[i]; v0 = sb[i];
        }
        const float g = (GK == F32 ? g32[j] : bf16_to_f32(g16[j])) * scale;
        const float mi = m0 + omb1 * (g - m0);
        const float vi = b2 * v0 + (omb2 * g) * g;
        const float p = MK == F32 ? p32[j] : bf16_to_f32(p16[j]);
        const float si = std::sqrt(vi);
        const float pn = p * decay - (step_size * mi) / (si * inv_sqrt_bc2 + eps);
        if (MK == F32) p32[j] = pn;
        if (MK == BF16 || QK != F32) {
            pb[i] = pn;  // rounded to bf16 by a later loop
        } else if (WK == W_GRAD) {
            if (GK == F32) g32[j] = pn;
            else g16[j] = f32_to_bf16(pn);
        } else if (WK == W_BF16) {
            w16[j] = f32_to_bf16(pn);
        }
        if (QK == F32) {
            m32[j] = mi; v32[j] = vi;
        } else if (QK == BF16) {
            mb[i] = mi; sb[i] = vi;
        } else {
            mb[i] = mi; sb[i] = si;
            am = std::max(am, std::fabs(mi));
            av = std::max(av, vi);
        }
    }
    if (MK == F32 && QK != F32) {  // the streamed bf16 weights
        #pragma omp simd
        for (int64_t i = 0; i < len; ++i) {
            if (WK == W_GRAD) {
                if (GK == F32) g32[s + i] = pb[i];
                else g16[s + i] = f32_to_bf16(pb[i]);
            } else if (WK == W_BF16) {
                w16[s + i] = f32_to_bf16(pb[i]);
            }
        }
    }
    if (MK == BF16) {  // the bf16 master, stochastically rounded
        #pragma omp simd
        for (int64_t i = 0; i < len; ++i) {
            const uint32_t bits = FLAT ? mix32((lo + static_cast<uint32_t>(i)) ^ hp) : rounding_bits(key_p, base + i);
            p16[s + i] = f32_to_bf16_sr(pb[i], bits);
        }
    }
    if (QK == BF16) {
        #pragma omp simd
        for (int64_t i = 0; i < len; ++i) {
            const uint32_t bm = FLAT ? mix32((lo + static_cast<uint32_t>(i)) ^ hm) : rounding_bits(key_m, base + i);
            const uint32_t bv = FLAT ? mix32((lo + static_cast<uint32_t>(i)) ^ hv) : rounding_bits(key_v, base + i);
            m16[s + i] = f32_to_bf16_sr(mb[i], bm);
            v16[s + i] = f32_to_bf16_sr(sb[i], bv);
        }
    }
    if (QK == Q8) {
        const float im = am > 0.0f ? 1.0f / am : 0.0f;
        const float iv = av > 0.0f ? 1.0f / std::sqrt(av) : 0.0f;
        int64_t i0 = 0;
#if defined(__AVX2__)
        i0 = quantize_avx2(mb, sb, im, iv, len, m8 + s, v8 + s);
#endif
        #pragma omp simd
        for (int64_t i = i0; i < len; ++i) {
            const float r = mb[i] * im;
            float q = std::nearbyint(std::sqrt(std::fabs(r)) * 127.0f);
            q = std::min(q, 127.0f);
            m8[s + i] = static_cast<int8_t>(std::copysign(q, mb[i]));
            float qv = std::nearbyint(std::sqrt(sb[i] * iv) * 255.0f);  // (v / absmax) ** (1/4)
            qv = std::min(qv, 255.0f);
            qv = std::max(qv, sb[i] > 0.0f ? 1.0f : 0.0f);  // a positive v never codes as 0 (sqrt(v) > 0 iff v > 0)
            v8[s + i] = static_cast<uint8_t>(qv);
        }
        ms[blk] = am;
        vs[blk] = av;
    }
}

// Threads take blocks in runs of RUN_BLOCKS from a shared counter (OpenMP's dynamic schedule), not an equal
// share each: on the lent cloud hosts the vCPUs ran 1.8x apart alone (c24: a vector loop at 2,295-4,200 per s
// on one host), and the trainer's own thread takes a core beside the worker's, so with equal shares the whole
// update waited for the slowest thread. A run is 65,536 elements, about 80 us of one thread's work: one claim
// costs far less. Which thread updates a block changes nothing in its bits (the rounding is counter-based).
constexpr int64_t RUN_BLOCKS = 65536 / SLIDEDP_BLOCK;

template <int MK, int QK, int GK, int WK>
static void compact_run(const Compact& a) {
    constexpr int64_t B = SLIDEDP_BLOCK;
    const int64_t n = a.n, index0 = a.index0;
    const int64_t blocks = (n + B - 1) / B;
#if defined(SLIDEDP_AVX512)
    if (QK == Q8) {  // a run's blocks in order through two codes buffers, flushed at the run's end
        const int64_t runs = (blocks + RUN_BLOCKS - 1) / RUN_BLOCKS;
        #pragma omp parallel
        {
            Q8Pending bufs[2];
            #pragma omp for schedule(dynamic, 1) nowait
            for (int64_t r = 0; r < runs; ++r) {
                const int64_t b0 = r * RUN_BLOCKS, b1 = std::min(blocks, b0 + RUN_BLOCKS);
                Q8Pending* pending = nullptr;
                for (int64_t blk = b0; blk < b1; ++blk) {
                    const int64_t first = index0 + blk * B, last = index0 + std::min(n, blk * B + B) - 1;
                    if ((first >> 32) == (last >> 32) && last - first + 1 == B) {
                        Q8Pending* next = pending == &bufs[0] ? &bufs[1] : &bufs[0];
                        if (pending) compact_block_avx512<MK, QK, GK, WK>(a, blk, next, pending);
                        else compact_block_avx512<MK, QK, GK, WK>(a, blk, next, nullptr);
                        pending = next;
                        continue;
                    }
                    if (pending) quantize_block(*pending);
                    pending = nullptr;
                    if ((first >> 32) == (last >> 32)) compact_block<MK, QK, GK, WK, true>(a, blk);
                    else compact_block<MK, QK, GK, WK, false>(a, blk);
                }
                if (pending) quantize_block(*pending);
            }
        }
        return;
    }
#endif
    #pragma omp parallel for schedule(dynamic, RUN_BLOCKS)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t first = index0 + blk * B, last = index0 + std::min(n, blk * B + B) - 1;
        if ((first >> 32) == (last >> 32)) {
#if defined(SLIDEDP_AVX512)
            if (last - first + 1 == B) { compact_block_avx512<MK, QK, GK, WK>(a, blk, nullptr, nullptr); continue; }
#endif
            compact_block<MK, QK, GK, WK, true>(a, blk);
        } else {
            compact_block<MK, QK, GK, WK, false>(a, blk);
        }
    }
}

static int kind_of(const torch::Tensor& t) {
    switch (t.scalar_type()) {
        case at::kFloat: return F32;
        case at::kBFloat16: return BF16;
        case at::kChar: return Q8;
        default: TORCH_CHECK(false, "unsupported state dtype");
    }
    return F32;
}

template <int MK, int QK>
static void dispatch_gw(const Compact& a, int gk, int wk) {
    if (MK == BF16) {
        TORCH_CHECK(wk == W_NONE, "a bf16 master is the streamed weight");
        if (gk == F32) compact_run<MK, QK, F32, W_NONE>(a); else compact_run<MK, QK, BF16, W_NONE>(a);
    } else if (wk == W_GRAD) {
        if (gk == F32) compact_run<MK, QK, F32, W_GRAD>(a); else compact_run<MK, QK, BF16, W_GRAD>(a);
    } else {
        TORCH_CHECK(wk == W_BF16 && gk == F32, "separate weights are bf16 with an fp32 gradient");
        compact_run<MK, QK, F32, W_BF16>(a);
    }
}

void adamw_compact(torch::Tensor master, torch::Tensor exp_avg, torch::Tensor exp_avg_sq,
                   std::optional<torch::Tensor> m_scale, std::optional<torch::Tensor> v_scale, torch::Tensor grad,
                   std::optional<torch::Tensor> weights, double lr, double beta1, double beta2, double eps,
                   double weight_decay, double step, double grad_scale, int64_t key_p, int64_t key_m,
                   int64_t key_v, int64_t index0) {
    for (auto* t : {&master, &exp_avg, &exp_avg_sq, &grad})
        TORCH_CHECK(t->is_contiguous(), "contiguous tensors expected");
    const int64_t n = master.numel();
    TORCH_CHECK(exp_avg.numel() == n && exp_avg_sq.numel() == n && grad.numel() == n, "size mismatch");
    const int mk = kind_of(master), qk = kind_of(exp_avg), gk = kind_of(grad);
    TORCH_CHECK(mk != Q8 && gk != Q8, "master and gradient are fp32 or bf16");
    Compact a{};
    a.master = master.data_ptr(); a.m = exp_avg.data_ptr(); a.v = exp_avg_sq.data_ptr(); a.grad = grad.data_ptr();
    a.m_scale = nullptr; a.v_scale = nullptr; a.weights = nullptr;
    if (qk == Q8) {
        TORCH_CHECK(exp_avg_sq.scalar_type() == at::kByte && m_scale && v_scale,
                    "8-bit moments need uint8 v and scales");
        const int64_t blocks = (n + SLIDEDP_BLOCK - 1) / SLIDEDP_BLOCK;
        TORCH_CHECK(m_scale->numel() >= blocks && v_scale->numel() >= blocks && m_scale->is_contiguous() &&
                    v_scale->is_contiguous() && m_scale->scalar_type() == at::kFloat, "scale size mismatch");
        a.m_scale = m_scale->data_ptr<float>(); a.v_scale = v_scale->data_ptr<float>();
    } else {
        TORCH_CHECK(exp_avg_sq.scalar_type() == exp_avg.scalar_type(), "moment dtypes differ");
    }
    int wk = W_NONE;
    if (weights) {
        TORCH_CHECK(weights->numel() == n && weights->is_contiguous(), "weights size mismatch");
        if (weights->data_ptr() == grad.data_ptr()) {
            wk = W_GRAD;
        } else {
            TORCH_CHECK(weights->scalar_type() == at::kBFloat16, "separate weights must be bf16");
            wk = W_BF16;
            a.weights = reinterpret_cast<uint16_t*>(weights->data_ptr<at::BFloat16>());
        }
    }
    a.n = n; a.index0 = index0;
    a.omb1 = 1.0 - beta1; a.b2 = beta2; a.omb2 = 1.0 - beta2;
    a.decay = 1.0 - lr * weight_decay;
    const double bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
    a.step_size = lr / bc1;
    a.inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
    a.eps = eps; a.scale = grad_scale;
    a.key_p = static_cast<uint32_t>(key_p);
    a.key_m = static_cast<uint32_t>(key_m);
    a.key_v = static_cast<uint32_t>(key_v);
    pybind11::gil_scoped_release no_gil;
    const int code = mk * 3 + qk;
    switch (code) {
        case F32 * 3 + F32: dispatch_gw<F32, F32>(a, gk, wk); break;
        case F32 * 3 + BF16: dispatch_gw<F32, BF16>(a, gk, wk); break;
        case F32 * 3 + Q8: dispatch_gw<F32, Q8>(a, gk, wk); break;
        case BF16 * 3 + F32: dispatch_gw<BF16, F32>(a, gk, wk); break;
        case BF16 * 3 + BF16: dispatch_gw<BF16, BF16>(a, gk, wk); break;
        default: dispatch_gw<BF16, Q8>(a, gk, wk); break;
    }
}

#if !defined(SLIDEDP_AVX512)
static void adamw_bf16_loop(torch::Tensor param, torch::Tensor exp_avg, torch::Tensor exp_avg_sq,
                            torch::Tensor grad_slot, double lr, double beta1, double beta2, double eps,
                            double weight_decay, double step, double grad_scale) {
    const int64_t n = param.numel();
    float* p = param.data_ptr<float>();
    float* m = exp_avg.data_ptr<float>();
    float* v = exp_avg_sq.data_ptr<float>();
    uint16_t* g = reinterpret_cast<uint16_t*>(grad_slot.data_ptr<at::BFloat16>());
    const float b2 = beta2, one_minus_b1 = 1.0 - beta1, one_minus_b2 = 1.0 - beta2;
    const float decay = 1.0 - lr * weight_decay;
    const double bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
    const float step_size = lr / bc1;
    const float inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
    const float scale = grad_scale, e = eps;
    // Release the GIL: the trainer thread must keep launching GPU work while the update runs.
    pybind11::gil_scoped_release no_gil;
    #pragma omp parallel for simd schedule(simd:dynamic, 65536)  // compact_run's RUN_BLOCKS says why
    for (int64_t i = 0; i < n; ++i) {
        const float gi = bf16_to_f32(g[i]) * scale;
        const float mi = m[i] + one_minus_b1 * (gi - m[i]);
        const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
        const float pi = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + e);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        g[i] = f32_to_bf16(pi);  // the slot now holds the next step's bf16 weights
    }
}

#endif

// The exact update (fp32 master and moments, the bf16 gradient slot rewritten with the new weights). Where the
// CPU has AVX-512 it is adamw_compact's fp32/fp32 case: the same operations in the same order (so the same bits,
// tests/runtime/test_runtime_equivalence.py), but one fused 16-lane loop per block with each stream prefetched
// ahead: 1.29-1.33x the simple loop's rate at 1-2 threads on the development machine (16M and 64M parameters,
// 2026-12-06); elsewhere the simple loop, which gcc vectorizes for AVX2.
void adamw_bf16(torch::Tensor param, torch::Tensor exp_avg, torch::Tensor exp_avg_sq, torch::Tensor grad_slot,
                double lr, double beta1, double beta2, double eps, double weight_decay, double step,
                double grad_scale) {
    TORCH_CHECK(param.is_contiguous() && exp_avg.is_contiguous() && exp_avg_sq.is_contiguous() &&
                grad_slot.is_contiguous(), "contiguous tensors expected");
    TORCH_CHECK(param.scalar_type() == at::kFloat && exp_avg.scalar_type() == at::kFloat &&
                exp_avg_sq.scalar_type() == at::kFloat && grad_slot.scalar_type() == at::kBFloat16, "dtype mismatch");
    const int64_t n = param.numel();
    TORCH_CHECK(exp_avg.numel() == n && exp_avg_sq.numel() == n && grad_slot.numel() == n, "size mismatch");
#if defined(SLIDEDP_AVX512)
    adamw_compact(param, exp_avg, exp_avg_sq, std::nullopt, std::nullopt, grad_slot, grad_slot, lr, beta1, beta2,
                  eps, weight_decay, step, grad_scale, 0, 0, 0, 0);
#else
    adamw_bf16_loop(param, exp_avg, exp_avg_sq, grad_slot, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("adamw_bf16", &adamw_bf16, "one-pass AdamW with a bf16 gradient/weight slot");
    m.def("adamw_compact", &adamw_compact, "one-pass AdamW on compact (bf16 / blockwise 8-bit) host state");
}
"""

KERNEL_NAME = "slidedp_cpu_adam_v8"  # a new name per source revision: an old build is never loaded
_lock = threading.Lock()
_state: dict[str, object] = {}


BUILD_WAIT_S = 300.0  # how long a run waits for another process's build of the kernel before falling back


def build_directory() -> Path:
    """Where the kernel is built (under TORCH_EXTENSIONS_DIR, or torch's default cache)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    path = Path(root) / KERNEL_NAME
    path.mkdir(parents=True, exist_ok=True)
    return path


def locked_build(build: Callable[[str], object], wait_s: float = BUILD_WAIT_S):
    """Run ``build(directory)`` under an exclusive flock of the build directory, waiting at most ``wait_s``.

    torch's own build lock is a plain file that a builder killed mid-compile leaves behind, after which every
    later build waits forever. A flock is released by the kernel when its holder dies, so holding ours means
    no other slidedp process is building, and a torch lock file found then is stale: it is removed."""
    directory = build_directory()
    fd = os.open(directory / "slidedp-build.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has been building the kernel in {directory} for over "
                                       f"{wait_s:.0f} s") from None
                time.sleep(0.2)
        (directory / "lock").unlink(missing_ok=True)  # torch's FileBaton, left by a builder that was killed
        return build(str(directory))
    finally:
        os.close(fd)


def fused_kernel():
    """The compiled module, or None when it cannot be built now (no compiler, or another build holds the lock
    too long): then callers use torch's path, and fused_kernel_error() says why."""
    with _lock:
        if "module" not in _state:
            try:
                from torch.utils.cpp_extension import load_inline

                # No FMA contraction: the compact update must round exactly like its torch fallback.
                source = f"#define SLIDEDP_BLOCK {INT8_BLOCK}\n" + _SOURCE
                _state["module"] = locked_build(lambda directory: load_inline(
                    name=KERNEL_NAME, cpp_sources=[source], build_directory=directory,
                    extra_cflags=["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fopenmp"],
                    extra_ldflags=["-fopenmp"], verbose=False))
            except Exception as exc:  # no compiler, no headers, a build that never ends: fall back, say why once
                _state["module"] = None
                _state["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return _state["module"]


def fused_kernel_error() -> str | None:
    return _state.get("error")  # type: ignore[return-value]
