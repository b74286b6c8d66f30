"""The trained weights as a Hugging Face model directory that ``from_pretrained`` loads as is.

Written: ``config.json`` (its dtype field states the tensors' dtype, bf16), ``generation_config.json``
(the model's bos/eos/pad ids), the tokenizer's files when the run used an HF tokenizer, and the weights as
safetensors shards of at most ``shard_bytes`` with ``model.safetensors.index.json`` (one file and no index
when everything fits in one shard, as transformers itself writes). Each file goes through a temporary
name, so an interrupted export never leaves a truncated shard under the final name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from slidedp.runtime.hf_adapter import ModelAdapter
from slidedp.runtime.host_state import HostState

SHARD_BYTES = 5 * 2**30  # transformers' default max_shard_size


def _shards(adapter: ModelAdapter, itemsize: int, shard_bytes: int) -> list[list[tuple[str, tuple, int, int]]]:
    """Parameters (hf name, shape, flat start, numel) grouped in model order into shards of <= shard_bytes."""
    shards: list[list[tuple[str, tuple, int, int]]] = [[]]
    size = 0
    for unit in adapter.units:
        for p in unit.params:
            nbytes = p.numel * itemsize
            if shards[-1] and size + nbytes > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append((p.hf_name, p.shape, unit.offset + p.offset, p.numel))
            size += nbytes
    return shards


def export_hf(host: HostState, adapter: ModelAdapter, directory: Path, tokenizer_path: str | None, config,
              dtype: torch.dtype = torch.bfloat16, shard_bytes: int = SHARD_BYTES) -> None:
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shards = _shards(adapter, torch.empty((), dtype=dtype).element_size(), shard_bytes)
    names = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map, total = {}, 0
    for name, shard in zip(names, shards, strict=True):
        weights = host.full_weights()
        tensors = {hf: weights[start:start + n].view(shape).to(dtype).clone() for hf, shape, start, n in shard}
        tmp = directory / (name + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.replace(directory / name)
        for hf, t in tensors.items():
            weight_map[hf] = name
            total += t.numel() * t.element_size()
    stale = directory / "model.safetensors.index.json"
    if len(shards) > 1:
        _write_json(stale, {"metadata": {"total_size": total}, "weight_map": weight_map})
    elif stale.exists():
        stale.unlink()  # an earlier, sharded export in the same directory
    config = type(config).from_dict(config.to_dict())
    name = str(dtype).replace("torch.", "")
    if "dtype" in getattr(config, "__dict__", {}) or isinstance(getattr(type(config), "dtype", None), property):
        config.dtype = name  # transformers >= 4.56 (it writes "dtype")
    else:
        config.torch_dtype = name
    config.architectures = [type(adapter.skeleton).__name__]
    config.save_pretrained(str(directory))
    gen = GenerationConfig(bos_token_id=getattr(config, "bos_token_id", None),
                           eos_token_id=getattr(config, "eos_token_id", None),
                           pad_token_id=getattr(config, "pad_token_id", None))
    from slidedp.runtime.text_tokenizers import BYTE_TOKENIZER, HFTokenizer

    if tokenizer_path and tokenizer_path != BYTE_TOKENIZER:
        tok = HFTokenizer(tokenizer_path, adapter.config.vocab_size)
        tok.save(directory)
        gen.eos_token_id = gen.eos_token_id if gen.eos_token_id is not None else tok.eos_token_id
        gen.pad_token_id = gen.pad_token_id if gen.pad_token_id is not None else tok.pad_token_id
    gen.save_pretrained(str(directory))


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
