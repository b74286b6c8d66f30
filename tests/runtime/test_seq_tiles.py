"""Sequence-tiled layers (#19) compute what whole layers compute: the same loss and gradients (fp32, CPU) under
every activation policy, with micro-batches, tiles that do not divide the tokens, and packed rows; and the tiled
layer really keeps only tile-sized MLP activations for backward."""

from __future__ import annotations

import pytest
import torch

from slidedp.policy import Policy
from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
from slidedp.runtime.packing import pack_examples
from slidedp.runtime.seq_tiles import run_layer
from tests.builders import TINY, write_config
from tests.runtime.helpers import batches, make_engine
from tests.runtime.test_packing import examples

SEQ = 32


def step(tmp_path, name: str, policy: Policy, rows):
    """Loss and the step's gradient (next_forward: the update waits, so the slot still holds the gradient)."""
    engine, _, host = make_engine(write_config(tmp_path, name), policy, SEQ)
    try:
        return engine.step(rows).loss, host.grad_buffer.clone()
    finally:
        engine.close()


@pytest.mark.parametrize(("name", "activation", "tile"), [
    ("qwen3", "keep", 12), ("qwen3", "recompute", 8), ("qwen3", "offload", 12), ("llama", "recompute", 12)])
def test_tiled_layers_give_the_same_loss_and_gradients(tmp_path, name, activation, tile):
    """64 tokens per micro-batch: 8 tiles of 8, or 5 of 12 and a remainder of 4."""
    data = batches(TINY[name]["vocab_size"], SEQ, 2, 1, seed=3)[0]
    whole = Policy(activation=activation, micro_batch=2)
    loss_w, grad_w = step(tmp_path, name, whole, data)
    loss_t, grad_t = step(tmp_path, name, whole.with_(seq_tile_tokens=tile), data)
    assert float(grad_w.abs().sum()) > 0
    assert abs(loss_t - loss_w) < 1e-6 * max(1.0, abs(loss_w))
    torch.testing.assert_close(grad_t, grad_w, rtol=1e-5, atol=1e-7)


def test_tiled_packed_rows_give_the_same_loss_and_gradients(tmp_path):
    packed, _ = pack_examples(examples(), SEQ, pad_id=0)
    assert packed.position_ids is not None  # several examples in one row: block mask and restarted positions
    loss_w, grad_w = step(tmp_path, "qwen3", Policy(), packed)
    loss_t, grad_t = step(tmp_path, "qwen3", Policy(seq_tile_tokens=8), packed)
    assert abs(loss_t - loss_w) < 1e-6 * max(1.0, abs(loss_w))
    torch.testing.assert_close(grad_t, grad_w, rtol=1e-5, atol=1e-7)


def _saved_rows_of_width(config_path: str, tile: int, width: int) -> list[int]:
    """Rows (tokens) of every tensor of last dimension ``width`` that autograd keeps for backward while one tiny
    Qwen3 layer runs forward on 64 tokens (a tile's checkpoint keeps its own, which it drops, out of sight)."""
    cfg = load_hf_config(config_path)
    adapter = ModelAdapter(cfg)
    unit = adapter.units[1]
    g = torch.Generator().manual_seed(0)
    params = {p.name: (torch.randn(p.shape, generator=g) * 0.1).requires_grad_() for p in unit.params}
    x = torch.randn(2, 32, cfg.hidden_size, generator=g, requires_grad=True)
    pos = torch.arange(32).unsqueeze(0)
    rot = adapter.rotary(torch.device("cpu"))
    kwargs = {"attention_mask": None, "position_embeddings": rot(x, pos), "position_ids": pos}
    rows: list[int] = []

    def pack(t: torch.Tensor):
        if t.dim() >= 2 and t.shape[-1] == width:
            rows.append(t.numel() // width)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run_layer(adapter.layer_module(unit), params, x, kwargs, tile)
    out.square().sum().backward()
    return rows


def test_tiled_layer_keeps_only_tile_sized_mlp_activations(tmp_path):
    ffn, path = TINY["qwen3"]["intermediate_size"], write_config(tmp_path, "qwen3")
    whole = _saved_rows_of_width(path, 0, ffn)
    tiled = _saved_rows_of_width(path, 8, ffn)
    assert whole and max(whole) == 64  # gate, up and their product over all 64 tokens
    assert tiled == []  # none over the sequence: each tile's are rerun in backward
