"""A one-pass CPU AdamW for a bf16 gradient slot: read the gradient and fp32 state once, write the fp32
state and the new bf16 weights once (28 bytes per parameter of DRAM traffic).

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


BUILD_WAIT_S = 300.0  # how long a run waits for another process's build of the kernel before falling back


def build_directory() -> Path:
    """Where the kernel is built (under TORCH_EXTENSIONS_DIR, or torch's default cache)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    path = Path(root) / "slidedp_cpu_adam"
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

                _state["module"] = locked_build(lambda directory: load_inline(
                    name="slidedp_cpu_adam", cpp_sources=[_SOURCE], build_directory=directory,
                    extra_cflags=["-O3", "-march=native", "-fno-math-errno", "-fopenmp"], extra_ldflags=["-fopenmp"],
                    verbose=False))
            except Exception as exc:  # no compiler, no headers, a build that never ends: fall back, say why once
                _state["module"] = None
                _state["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return _state["module"]


def fused_kernel_error() -> str | None:
    return _state.get("error")  # type: ignore[return-value]
