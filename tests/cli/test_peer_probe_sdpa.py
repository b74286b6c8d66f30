"""peer_probe's SDPA translation of flash-attn's 2-D padding mask: MegaTrain hands that mask to each decoder layer,
which transformers' SDPA path rejects (2026-12-06, on the GPU machine: "Expected attn_mask dtype to be bool or
float ... but got long int"). The translation must attend exactly as causal attention over the unpadded keys."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from benchmarks.peer_external import MEGATRAIN, SLIDEFORMER, peer_env
from benchmarks.peer_probe import sdpa_taking_padding_masks
from tests.builders import REPO


def _qkv(batch: int = 2, heads: int = 2, tokens: int = 6, dim: int = 8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, heads, tokens, dim, generator=g) for _ in range(3)]


def test_an_all_ones_padding_mask_attends_causally_as_no_mask_does():
    module = SimpleNamespace(is_causal=True)
    q, k, v = _qkv()
    want, _ = sdpa_attention_forward(module, q, k, v, None)
    got, _ = sdpa_taking_padding_masks(sdpa_attention_forward)(module, q, k, v, torch.ones(2, 6, dtype=torch.long))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_padded_keys_are_masked_and_the_kept_rows_match_causal_attention_on_the_unpadded_tokens():
    module = SimpleNamespace(is_causal=True)
    q, k, v = _qkv()
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    attend = sdpa_taking_padding_masks(sdpa_attention_forward)
    got, _ = attend(module, q, k, v, mask)
    full, _ = sdpa_attention_forward(module, q[:1], k[:1], v[:1], None)
    short, _ = sdpa_attention_forward(module, q[1:, :, :4], k[1:, :, :4], v[1:, :, :4], None)
    # transformers returns [batch, tokens, heads, dim]
    torch.testing.assert_close(got[:1], full, rtol=0, atol=1e-6)
    torch.testing.assert_close(got[1:, :4], short, rtol=0, atol=1e-6)
    assert torch.isfinite(got).all()  # padded query rows attend to every key: no all-masked row
    again, _ = attend(module, q, k, v, mask)  # the same mask object: its kept translation
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    mask[1, 3:] = 0  # changed in place: translated again, not the kept one
    shorter, _ = attend(module, q, k, v, mask)
    want, _ = sdpa_attention_forward(module, q[1:, :, :3], k[1:, :, :3], v[1:, :, :3], None)
    torch.testing.assert_close(shorter[1:, :3], want, rtol=0, atol=1e-6)


def test_a_non_causal_layer_keeps_full_attention_over_the_unpadded_keys():
    module = SimpleNamespace(is_causal=False)
    q, k, v = _qkv()
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    got, _ = sdpa_taking_padding_masks(sdpa_attention_forward)(module, q, k, v, mask)
    want, _ = sdpa_attention_forward(module, q[1:, :, :4], k[1:, :, :4], v[1:, :, :4], None)
    torch.testing.assert_close(got[1:, :4], want, rtol=0, atol=1e-6)


def test_megatrain_runs_with_the_translation_and_slideformer_without(tmp_path):
    assert peer_env(MEGATRAIN, tmp_path, 29500)["PEER_PROBE_SDPA_PADDING_MASK"] == "1"
    assert "PEER_PROBE_SDPA_PADDING_MASK" not in peer_env(SLIDEFORMER, tmp_path, 29500)


def test_a_qwen3_layer_under_the_probe_takes_the_2d_mask(tmp_path):
    script = tmp_path / "layer.py"
    script.write_text(textwrap.dedent("""
        import torch
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding
        cfg = Qwen3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, num_hidden_layers=1, vocab_size=64, attn_implementation="sdpa")
        torch.manual_seed(0)
        layer, rope = Qwen3DecoderLayer(cfg, 0), Qwen3RotaryEmbedding(cfg)
        x = torch.randn(2, 5, 32)
        pos = torch.arange(5)[None].expand(2, -1)
        emb = rope(x, pos)
        out = lambda m: layer(x, attention_mask=m, position_ids=pos, position_embeddings=emb)
        out = [o[0] if isinstance(o, tuple) else o for o in (out(None), out(torch.ones(2, 5, dtype=torch.long)))]
        print("DIFF", float((out[0] - out[1]).abs().max()))
    """))
    env = {"PEER_PROBE_SDPA_PADDING_MASK": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "peer_probe.py"), str(script)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    diff = next(line for line in proc.stdout.splitlines() if line.startswith("DIFF"))
    assert float(diff.split()[1]) == 0.0
