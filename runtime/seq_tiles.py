"""One decoder layer call, whole or over tiles of the sequence (Policy.seq_tile_tokens).

Untiled, the transformers layer runs as one call and autograd keeps every intermediate over the whole sequence;
at 256K tokens the MLP's (gate, up, their SwiGLU product: 8 x ffn bytes per token) dominate a layer's working
set. Tiled, the token-wise parts of the layer run over tiles of the flattened micro-batch: the first RMSNorm,
and the MLP block (second RMSNorm, gate/up, SwiGLU, down, residual). Each tile sits inside a non-reentrant
``torch.utils.checkpoint``, so autograd keeps only the tile's input and reruns the tile in backward; the
attention (projections, q/k norms, RoPE, SDPA with memory linear in the sequence) runs once over the whole
sequence, since every query reads every earlier key. The layer's own submodules are called (with the streamed
weights, through ``functional_call``), so the numerics are transformers' and any activation policy (keep,
recompute, offload) or packed mask works unchanged: the attention arguments pass straight through.

The byte counts this bounds are ModelSpec.sequence_activation_bytes_per_token and
tile_activation_bytes_per_token; what it cannot bound, the attention backward's transients over the whole
sequence, is attention_backward_bytes_per_token; the work a tile reruns is ModelSpec.tile_recompute_ops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

Params = Mapping[str, torch.Tensor]


def run_layer(layer: nn.Module, params: Params, x: torch.Tensor, attn_kwargs: dict, tile_tokens: int) -> torch.Tensor:
    """The decoder ``layer`` (a meta-device transformers module) on ``x`` [batch, seq, hidden] with ``params``:
    one call when ``tile_tokens`` is 0, else sequence-tiled as the module docstring says."""
    if tile_tokens <= 0:
        out = functional_call(layer, dict(params), (x,), attn_kwargs)
        return out[0] if isinstance(out, tuple) else out
    norm1 = _bound(layer.input_layernorm, params, "input_layernorm.")
    norm2 = _bound(layer.post_attention_layernorm, params, "post_attention_layernorm.")
    mlp = _bound(layer.mlp, params, "mlp.")
    normed = over_tiles(norm1, x, tile_tokens)
    attn = functional_call(layer.self_attn, _sub(params, "self_attn."), (normed,), attn_kwargs)
    h = x + (attn[0] if isinstance(attn, tuple) else attn)
    return over_tiles(lambda t: t + mlp(norm2(t)), h, tile_tokens)


def over_tiles(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile_tokens: int) -> torch.Tensor:
    """``fn`` (token-wise) applied to tiles of ``tile_tokens`` tokens of ``x`` [..., features], flattened over
    its leading dimensions; with autograd on, each tile is checkpointed (rerun in backward). One split and one
    concatenation, so backward gathers the tiles' input gradients once rather than per tile."""
    flat = x.reshape(-1, x.shape[-1])
    tiles = flat.split(tile_tokens)
    if torch.is_grad_enabled():
        outs = [checkpoint(fn, t, use_reentrant=False) for t in tiles]
    else:
        outs = [fn(t) for t in tiles]
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.view(*x.shape[:-1], out.shape[-1])


def _sub(params: Params, prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def _bound(module: nn.Module, params: Params, prefix: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module`` called with its share of ``params``; the closure holds the tensors, so a checkpoint's rerun
    in backward (after functional_call has restored the meta weights) still sees the streamed ones."""
    own = _sub(params, prefix)
    return lambda t: functional_call(module, own, (t,))
