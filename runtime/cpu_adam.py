"""A one-pass CPU AdamW for a bf16 gradient slot: read the gradient and fp32 state once, write the fp32
state and the new bf16 weights once (28 bytes per parameter of DRAM traffic).

torch's fused CPU AdamW needs an fp32 gradient and a separate fp32 -> bf16 cast, so the stock path
makes three passes (upcast, update, cast) over memory; on a host where DRAM bandwidth is the limit that
is the difference between hiding the update under compute and exposing it. The kernel is compiled on
first use with torch.utils.cpp_extension (g++ and OpenMP); where that fails the stock path is used.
"""

from __future__ import annotations

import threading

_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <cstdint>
#include <cstring>

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

void adamw_bf16(torch::Tensor param, torch::Tensor exp_avg, torch::Tensor exp_avg_sq, torch::Tensor grad_slot,
                double lr, double beta1, double beta2, double eps, double weight_decay, double step,
                double grad_scale) {
    TORCH_CHECK(param.is_contiguous() && exp_avg.is_contiguous() && exp_avg_sq.is_contiguous() &&
                grad_slot.is_contiguous(), "contiguous tensors expected");
    TORCH_CHECK(param.scalar_type() == at::kFloat && grad_slot.scalar_type() == at::kBFloat16, "dtype mismatch");
    const int64_t n = param.numel();
    float* p = param.data_ptr<float>();
    float* m = exp_avg.data_ptr<float>();
    float* v = exp_avg_sq.data_ptr<float>();
    uint16_t* g = reinterpret_cast<uint16_t*>(grad_slot.data_ptr<at::BFloat16>());
    const float b1 = beta1, b2 = beta2, one_minus_b1 = 1.0 - beta1, one_minus_b2 = 1.0 - beta2;
    const float decay = 1.0 - lr * weight_decay;
    const double bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
    const float step_size = lr / bc1;
    const float inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
    const float scale = grad_scale, e = eps;
    // Release the GIL: the trainer thread must keep launching GPU work while the update runs.
    pybind11::gil_scoped_release no_gil;
    #pragma omp parallel for simd schedule(static)
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("adamw_bf16", &adamw_bf16, "one-pass AdamW with a bf16 gradient/weight slot");
}
"""

_lock = threading.Lock()
_state: dict[str, object] = {}


def fused_kernel():
    """The compiled module, or None when no compiler is available (then callers use torch's path)."""
    with _lock:
        if "module" not in _state:
            try:
                from torch.utils.cpp_extension import load_inline

                _state["module"] = load_inline(name="slidedp_cpu_adam", cpp_sources=[_SOURCE],
                                               extra_cflags=["-O3", "-march=native", "-fno-math-errno", "-fopenmp"],
                                               extra_ldflags=["-fopenmp"], verbose=False)
            except Exception as exc:  # no compiler, no headers: fall back, and say why once
                _state["module"] = None
                _state["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return _state["module"]


def fused_kernel_error() -> str | None:
    return _state.get("error")  # type: ignore[return-value]
