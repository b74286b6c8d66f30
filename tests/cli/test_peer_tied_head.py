"""The peers train the model as configured: a tied head stays tied after the meta model is materialised
(``Module.to_empty`` unties it; until 2026-12-07 the resident peer and DeepSpeed trained untied heads)."""

import json

import pytest

from benchmarks.peer_setup import build_lm, materialise_, wrap_with_loss

TINY = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000,
        "max_position_embeddings": 512}


@pytest.mark.parametrize("tied", [True, False])
def test_materialised_peer_model_keeps_the_configured_tying(tmp_path, tied):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, "tie_word_embeddings": tied}))
    cfg, lm = build_lm(str(path), "cpu")
    module = wrap_with_loss(lm)
    module.to_empty(device="cpu")
    materialise_(module, cfg, "cpu")
    assert (lm.lm_head.weight is lm.model.embed_tokens.weight) == tied
    embedding = 1000 * 64
    counted = sum(p.numel() for p in module.parameters())
    assert counted == sum(p.numel() for p in lm.model.parameters()) + (0 if tied else embedding)


def test_rows_measured_before_the_fix_are_predicted_as_the_untied_model_they_trained():
    from benchmarks.peer_setup import spec_as_trained
    from slidedp.model_spec import load_model_spec

    tied = load_model_spec("qwen3-4b")
    assert spec_as_trained(tied, {"system": "fsdp2-offload"}) == tied
    for system in ("resident", "deepspeed-offload", "deepspeed-zero3-offload"):
        untied = spec_as_trained(tied, {"system": system, "gpus": 1})
        assert not untied.tied_embeddings and untied.total_params == tied.total_params + tied.vocab * tied.hidden
        assert spec_as_trained(tied, {"system": system, "head_as_configured": True}) == tied
    assert spec_as_trained(tied, {"system": "resident", "gpus": 4}) == tied  # FSDP2 on several GPUs
    eight = load_model_spec("qwen3-8b")  # untied as configured
    assert spec_as_trained(eight, {"system": "resident"}) == eight
