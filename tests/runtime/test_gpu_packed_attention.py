"""torch's variable-length flash kernel on packed rows against SDPA with the block-causal mask, on a real GPU in
bf16 (forward and the gradients of q, k, v), grouped-query heads included. Run with `python -m pytest -m gpu`;
skipped elsewhere (CI). The CPU tests of the same path: tests/runtime/test_packed_attention.py."""

from __future__ import annotations

import pytest
import torch

from slidedp.runtime.packed_attention import packed_attention, torch_varlen_kernel, varlen_rows
from slidedp.runtime.packing import block_causal_mask

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (python -m pytest -m gpu)")]


class _Attn(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups


@pytest.mark.parametrize("heads, kv_heads", [(8, 8), (16, 4)])
def test_varlen_kernel_matches_the_masked_sdpa(heads, kv_heads):
    kernel = torch_varlen_kernel()
    assert kernel is not None, "this torch has no torch.nn.attention.varlen"
    g = torch.Generator(device="cuda").manual_seed(0)
    b, s, d = 2, 1024, 128
    lengths = [[300, 500, 224], [1000, 24]]  # the last "example" of each row stands for its padding
    segments = torch.cat([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r))[None] for r in lengths])
    segments = segments.cuda()

    def leaf(h):
        return torch.randn(b, h, s, d, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
    q, k, v = leaf(heads), leaf(kv_heads), leaf(kv_heads)
    w = torch.randn(b, s, heads, d, generator=g, device="cuda", dtype=torch.bfloat16)
    module, scale = _Attn(heads // kv_heads), d ** -0.5
    out_v, _ = packed_attention(module, q, k, v, None, scaling=scale, **varlen_rows(segments, kernel).layer_kwargs())
    grads_v = torch.autograd.grad((out_v.float() * w).sum(), (q, k, v))
    out_m, _ = packed_attention(module, q, k, v, block_causal_mask(segments), scaling=scale)
    grads_m = torch.autograd.grad((out_m.float() * w).sum(), (q, k, v))
    # Two bf16 kernels that sum in other orders: compared by the relative norm of the difference (bf16 keeps 8
    # bits, so ~0.4% per element; a wrong mask or layout gives differences of order 1).
    def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
        return float((a.float() - ref.float()).norm() / ref.float().norm())
    assert rel(out_v, out_m) < 1e-2
    for name, a, m in zip("qkv", grads_v, grads_m, strict=True):
        assert rel(a, m) < 2e-2, name
