"""Sequence-tiled layers (#19) compute what whole layers compute: the same loss and gradients (fp32, CPU) under
every activation policy, with micro-batches, tiles that do not divide the tokens, and packed rows; a tiled layer
keeps no sequence-wide MLP activations for backward, and what it keeps is what the memory model counts."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

from slidedp.model_spec import ModelSpec
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


def _saved(config: dict, tile: int, tokens: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], float]:
    """The tensors autograd keeps for backward while one layer of ``config`` runs forward on ``tokens`` tokens,
    and their bytes per token: distinct storages, without the weights and the rotary tables (shared by every
    layer). A tile's own activations are kept by its checkpoint out of sight, to be rerun in backward."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        cfg = load_hf_config(str(path))
    adapter = ModelAdapter(cfg)
    unit = adapter.units[1]
    g = torch.Generator().manual_seed(0)
    params = {p.name: (torch.randn(p.shape, generator=g) * 0.05).to(dtype).requires_grad_() for p in unit.params}
    x = torch.randn(1, tokens, cfg.hidden_size, generator=g).to(dtype).requires_grad_()
    pos = torch.arange(tokens).unsqueeze(0)
    pe = adapter.rotary(torch.device("cpu"))(x, pos)
    shared = {t.untyped_storage().data_ptr() for t in (*params.values(), *pe)}
    kept: list[torch.Tensor] = []
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in shared:
            kept.append(t)
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    kwargs = {"attention_mask": None, "position_embeddings": pe, "position_ids": pos}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run_layer(adapter.layer_module(unit), params, x, kwargs, tile)
    out.float().square().sum().backward()  # the tiles' reruns work
    return kept, sum(storages.values()) / tokens


def test_tiled_layer_keeps_no_sequence_wide_mlp_activations():
    ffn = TINY["qwen3"]["intermediate_size"]
    whole, _ = _saved(TINY["qwen3"], 0, 48, torch.float32)
    tiled, _ = _saved(TINY["qwen3"], 8, 48, torch.float32)
    assert any(t.shape[-1] == ffn and t.numel() == 48 * ffn for t in whole)  # gate, up, their product
    assert not any(t.shape[-1] == ffn for t in tiled)  # each tile's are rerun in backward


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(8, 2, 64), (8, 4, 32)])
def test_kept_bytes_per_token_are_the_memory_models(heads, kv_heads, head_dim):
    """Measured on the CPU in bf16, as the GPU runs: what a whole layer keeps is
    ModelSpec.full_activation_bytes_per_token, what a tiled one keeps over the sequence is
    sequence_activation_bytes_per_token (within 1%: the RMSNorms' fp32 rsqrt per token is not counted)."""
    config = dict(TINY["qwen3"], hidden_size=256, intermediate_size=768, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=256)
    spec = ModelSpec.from_hf_config(config)
    _, whole = _saved(config, 0, 256, torch.bfloat16)
    _, tiled = _saved(config, 64, 256, torch.bfloat16)
    assert whole == pytest.approx(spec.full_activation_bytes_per_token(), rel=0.01)
    assert tiled == pytest.approx(spec.sequence_activation_bytes_per_token(), rel=0.01)
    assert tiled < 0.55 * whole
