"""Packed rows through flash attention's variable-length kernel instead of a dense block-causal mask.

Packed rows (several examples per row, runtime/packing.py) must not attend across examples. A boolean
[b, 1, s, s] mask says so, but it keeps SDPA off its flash kernel and costs s^2 bytes per row: on the lent H100
the chat fine-tune (Qwen3-0.6B shape, seq 2048) ran 20% slower per token than the same tokens as plain causal
rows (benchmarks/RESULTS.md, 2026-12-05). torch's ``varlen_attn`` runs flash attention over the rows flattened
into one token stream with cumulative example offsets, causal inside each example, so a packed row costs what its
examples cost (less than a plain row of the same length: no attention across examples).

The decoder layers are transformers modules; their attention calls whatever function the config names. This
module registers one stateless function with transformers' ``AttentionInterface`` that takes the varlen path
when the layer call carries a kernel and the keywords transformers defines for packed inputs (``cu_seq_lens_q``
...), and is plain SDPA otherwise, so switching a model to it changes nothing for unpacked rows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch

ATTENTION_NAME = "slidedp_packed"
KERNEL_KEY = "slidedp_varlen_kernel"  # the layer-call keyword that carries the kernel to the attention function

# The varlen kernel: (q, k, v, cu_q, cu_k, max_q, max_k, *, scale) with q/k/v [tokens, heads, head_dim], causal.
VarlenKernel = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class VarlenRows:
    """Where each example of a micro-batch's flattened rows starts (int32, ends with the token count), the
    longest example, and the kernel to run: what attention needs in place of a mask."""

    cu_seq: torch.Tensor
    max_len: int
    kernel: VarlenKernel

    def layer_kwargs(self) -> dict:
        """The keywords a transformers decoder layer passes through to its attention function: transformers' own
        names for packed inputs, and the kernel (so the registered function holds no state of its own)."""
        return {"cu_seq_lens_q": self.cu_seq, "cu_seq_lens_k": self.cu_seq,
                "max_length_q": self.max_len, "max_length_k": self.max_len, KERNEL_KEY: self.kernel}


def _example_starts(segments: torch.Tensor) -> torch.Tensor:
    """Flat indices where an example of packed rows [b, s] starts (runtime/packing.py: an example's tokens share
    a segment id, its neighbours' differ, padding is a segment of its own), then the token count. A row's start
    is always a boundary, so no example runs across two rows."""
    b, s = segments.shape
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    begin = starts.reshape(-1).nonzero().squeeze(1)
    return torch.cat([begin, begin.new_tensor([b * s])])


def example_lengths(segments: torch.Tensor) -> list[int]:
    """Token counts of the examples (and padding runs) the varlen kernel attends over, row by row."""
    bounds = _example_starts(segments.cpu())
    return (bounds[1:] - bounds[:-1]).tolist()


def varlen_rows(segments: torch.Tensor, kernel: VarlenKernel) -> VarlenRows:
    """What the kernel needs for one micro-batch's packed rows; one device-to-host read (the longest example)."""
    cu = _example_starts(segments).to(torch.int32)
    return VarlenRows(cu, int((cu[1:] - cu[:-1]).max()), kernel)


def causal_varlen(varlen_attn: Callable) -> VarlenKernel:
    """A causal kernel over a ``torch.nn.attention.varlen.varlen_attn``-like function. Its causal switch changed
    after torch 2.10 (``is_causal=True``) to ``window_size=(-1, 0)``; both are handled. Grouped-query attention
    is passed as ``enable_gqa`` where the signature has it, else the key/value heads are expanded."""
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    gqa = "enable_gqa" in params

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale):
        if k.shape[1] != q.shape[1]:
            if gqa:
                return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, enable_gqa=True, **causal)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, **causal)
    return kernel


@cache
def torch_varlen_kernel() -> VarlenKernel | None:
    """torch's ``varlen_attn`` as a causal kernel, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return causal_varlen(varlen_attn)


def varlen_available(device: torch.device) -> bool:
    """Whether packed rows on ``device`` can take the varlen kernel (a CUDA device and a torch that has it)."""
    return device.type == "cuda" and torch_varlen_kernel() is not None


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The transformers attention function: the varlen kernel the call carries (with ``cu_seq_lens_q`` ...),
    else transformers' SDPA. Inputs [b, heads, s, d] as transformers passes them; output [b, s, heads, d]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kernel = kwargs.pop(KERNEL_KEY, None)
    if kernel is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    b, hq, s, d = query.shape

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).reshape(b * s, t.shape[1], d)
    out = kernel(flat(query), flat(key), flat(value), kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"],
                 kwargs["max_length_q"], kwargs["max_length_k"], scale=scaling)
    return out.view(b, s, hq, d), None


def use_packed_attention(config) -> None:
    """Make the decoder layers built from ``config`` call :func:`packed_attention`. The name is set on the config
    after the modules were built (they read it at each call); config.to_dict() leaves it out, so exported
    checkpoints are unaffected. Calls without a kernel are plain SDPA, as before."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    config._attn_implementation = ATTENTION_NAME
