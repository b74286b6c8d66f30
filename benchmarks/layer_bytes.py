"""The memory-bound bytes of an HF decoder layer as its aten operations move them, beside the compute model's count.

    python -m benchmarks.layer_bytes [--tokens 512 1024]

Runs one random-init decoder layer (Qwen3, Llama, Qwen2 at a small width) on the CPU under a TorchDispatchMode that
adds up every aten operation's input and output bytes, outside GEMMs and attention, in forward and in backward,
for bf16 weights and for fp32 weights under autocast (slidedp.compute.AMP_FP32, what plain GPU-resident training
runs). The per-token slope between two sequence lengths leaves out the per-parameter work (weight casts). The
aten operations are the ones the layer dispatches on any device, so the counts check the byte model
(ModelSpec.layer_forward_ops, slidedp.compute.backward_ops) without a GPU; what they cannot see is how CUDA
kernels fuse or how fast each runs (benchmarks.resident_kernels times those on a GPU). A biased projection is
one addmm, counted with the GEMMs: Qwen2's q/k/v biases move nothing of their own in forward (the byte model's
``qkv_bias`` is 0 B there); their gradients, summed over tokens in backward, do show and are counted.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from slidedp import compute as c
from slidedp.model_spec import ModelSpec

# A small layer: wide enough that per-token bytes dominate, small enough for a CPU in a second.
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 4, 2, 64
MODEL_TYPES = ("qwen3", "llama", "qwen2")
# Operations priced as GEMMs or attention, and aten calls that move no bytes of their own (views, allocations).
COMPUTE_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
                         "_scaled_dot_product_flash_attention_for_cpu_backward"})
NO_TRAFFIC = frozenset({"detach", "view", "_unsafe_view", "t", "transpose", "expand", "unsqueeze", "squeeze",
                        "permute", "slice", "select", "alias", "split", "split_with_sizes", "as_strided",
                        "empty", "empty_like", "new_empty", "new_empty_strided", "zeros_like", "ones_like"})


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size() if value.dim() > 0 else 0
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class _ByteCount(TorchDispatchMode):
    """Input + output bytes of every memory-bound aten call made under it."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.calls = 0  # those that move bytes: one kernel each, as eager CUDA runs them

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name not in COMPUTE_OPS and name not in NO_TRAFFIC:
            moved = _tensor_bytes(list(args) + list(kwargs.values())) + _tensor_bytes(out)
            self.total += moved
            self.calls += moved > 0
        return out


def model_spec(model_type: str) -> ModelSpec:
    """The compute model's spec of the layer that run_layer builds."""
    return ModelSpec(model_type, 1, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, 128, qk_norm=model_type == "qwen3",
                     attn_bias=model_type == "qwen2")


def run_layer(model_type: str, precision: str, tokens: int) -> tuple[_ByteCount, _ByteCount]:
    """Counted forward and backward bytes and calls of one decoder layer over ``tokens`` tokens."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    cfg = AutoConfig.for_model(model_type, hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS,
                               num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=128, num_hidden_layers=1,
                               attn_implementation="sdpa")
    layer_class = {"qwen3": Qwen3DecoderLayer, "llama": LlamaDecoderLayer, "qwen2": Qwen2DecoderLayer}[model_type]
    torch.manual_seed(0)
    amp = c.check_precision(precision) == c.AMP_FP32
    dtype = torch.float32 if amp else torch.bfloat16
    layer = layer_class(cfg, 0).to(dtype)
    x = torch.randn(1, tokens, HIDDEN, dtype=dtype, requires_grad=True)
    positions = torch.arange(tokens)[None]
    forward, backward = _ByteCount(), _ByteCount()
    with torch.autocast("cpu", torch.bfloat16, enabled=amp):
        cos_sin = LlamaRotaryEmbedding(cfg)(x, positions)  # computed once per model, not per layer
        with forward:
            y = layer(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)
    y = y[0] if isinstance(y, tuple) else y
    grad = torch.randn_like(y)
    with backward:
        y.backward(grad)
    return forward, backward


@dataclass(frozen=True)
class LayerBytes:
    """Bytes per token and hidden element, and memory-bound kernels per layer (weight casts included): counted from
    aten calls, and as the compute model prices them."""
    model_type: str
    precision: str
    counted_fwd: float
    counted_bwd: float
    model_fwd: float
    model_bwd: float
    counted_kernels: tuple[int, int] = (0, 0)
    model_kernels: tuple[int, int] = (0, 0)


def per_token(model_type: str, precision: str, tokens: tuple[int, int] = (512, 1024)) -> LayerBytes:
    """The slope between two lengths (the per-parameter casts cancel), per hidden element; kernels at the longer."""
    (f0, b0), (f1, b1) = (run_layer(model_type, precision, t) for t in tokens)
    scale = (tokens[1] - tokens[0]) * HIDDEN
    m, t = model_spec(model_type), tokens[1] - tokens[0]

    def elementwise(ops) -> float:  # per-token ops only: the weight casts are per parameter
        return sum(op.nbytes for op in ops if isinstance(op, c.Elementwise) and op.name != "amp_weight_cast")

    def kernels(ops) -> int:
        return sum(op.kernels for op in ops if isinstance(op, c.Elementwise))

    fwd = m.layer_forward_ops(1, t, precision=precision)
    bwd = c.backward_ops(fwd)
    grads = c.amp_gradient_ops(m.layer_linear_params, m.layer_linear_tensors) if precision == c.AMP_FP32 else []
    return LayerBytes(model_type, precision, (f1.total - f0.total) / scale, (b1.total - b0.total) / scale,
                      elementwise(fwd) / scale, elementwise(bwd) / scale, (f1.calls, b1.calls),
                      (kernels(fwd), kernels(bwd) + kernels(grads)))


def module_bytes(dtype: torch.dtype = torch.bfloat16, tokens: int = 1024) -> dict[str, tuple[float, float]]:
    """Forward and backward bytes of each eager module alone (per element of its input; rotary per q/k element),
    with inputs that are not leaves, so that no .grad is written: backward up to its inputs (and RMSNorm's weight)
    only, as slidedp.compute's EagerModule constants count them. The layer's count less these is the traffic
    between modules (gradients summed where a tensor feeds several consumers: GRADIENT_SUM)."""
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    def count(fn, *shapes, per_all_inputs: bool = False, params=()) -> tuple[float, float]:
        xs = [torch.randn(*shape, dtype=dtype, requires_grad=True) * 1 for shape in shapes]
        forward, backward = _ByteCount(), _ByteCount()
        with forward:
            y = fn(*xs)
        y = torch.cat([t.reshape(-1) for t in y]) if isinstance(y, tuple) else y
        grad = torch.randn_like(y)
        with backward:
            torch.autograd.grad(y, [*xs, *params], grad)
        elements = sum(torch.Size(shape).numel() for shape in (shapes if per_all_inputs else shapes[:1]))
        return forward.total / elements, backward.total / elements

    norm = Qwen3RMSNorm(HIDDEN).to(dtype)
    cos, sin = torch.randn(1, tokens, HEAD_DIM, dtype=dtype), torch.randn(1, tokens, HEAD_DIM, dtype=dtype)

    hidden = (1, tokens, HIDDEN)
    return {"rmsnorm": count(norm, hidden, params=tuple(norm.parameters())),
            "swiglu": count(lambda g, u: F.silu(g) * u, hidden, hidden),
            "residual": count(lambda a, b: a + b, hidden, hidden),
            "rotary": count(lambda q, k: apply_rotary_pos_emb(q, k, cos, sin), (1, HEADS, tokens, HEAD_DIM),
                            (1, KV_HEADS, tokens, HEAD_DIM), per_all_inputs=True)}


def _pair(kernels: tuple[int, int]) -> str:
    return f"{kernels[0]}/{kernels[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs=2, default=(512, 1024), metavar=("SHORT", "LONG"))
    args = parser.parse_args(argv)
    if not 0 < args.tokens[0] < args.tokens[1] <= 16384:
        parser.error("--tokens: two lengths, 0 < SHORT < LONG <= 16384")
    print("memory-bound aten calls (counted) and the compute model's count: bytes per token and hidden element,")
    print("kernels per layer (forward / backward)")
    print(f"{'layer':<7} {'precision':<9} {'fwd counted':>11} {'model':>6} {'bwd counted':>11} {'model':>6} "
          f"{'kernels':>7} {'model':>7}")
    for model_type in MODEL_TYPES:
        for precision in c.PRECISIONS:
            r = per_token(model_type, precision, tuple(args.tokens))
            print(f"{r.model_type:<7} {r.precision:<9} {r.counted_fwd:>11.1f} {r.model_fwd:>6.1f} "
                  f"{r.counted_bwd:>11.1f} {r.model_bwd:>6.1f} {_pair(r.counted_kernels):>7} "
                  f"{_pair(r.model_kernels):>7}")
    print("\neach module alone, bytes per input element (rotary: per q/k element): forward, backward, ratio")
    for dtype in (torch.bfloat16, torch.float32):
        for name, (fwd, bwd) in module_bytes(dtype, args.tokens[1]).items():
            print(f"{str(dtype).removeprefix('torch.'):<9} {name:<9} {fwd:>7.1f} {bwd:>7.1f} {bwd / fwd:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
