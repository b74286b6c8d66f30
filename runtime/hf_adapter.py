"""Hugging Face decoder models as a list of streamable units over one flat parameter vector.

The runtime never instantiates a real model on the GPU: it builds the transformers module tree on the
meta device (no memory), reads its parameter names and shapes, and calls each decoder layer with
``torch.func.functional_call`` on weights that were just streamed in. This keeps the exact numerics of
the transformers implementation (attention, RoPE, norms) without owning its memory management.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from slidedp.config_io import quote, read_mapping
from slidedp.errors import SlideDPError
from slidedp.model_spec import ModelSpec, config_json_path


@dataclass(frozen=True)
class ParamSlot:
    name: str  # name inside the unit's module (e.g. "self_attn.q_proj.weight")
    hf_name: str  # name in the full model's state dict (e.g. "model.layers.3.self_attn.q_proj.weight")
    shape: tuple[int, ...]
    offset: int  # element offset inside the unit's flat vector

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class UnitLayout:
    index: int
    name: str
    kind: str  # embed | layer | head
    params: tuple[ParamSlot, ...]
    offset: int  # element offset of the unit inside the whole model's flat vector

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)


def load_hf_config(source: str, attn_implementation: str = "sdpa"):
    """A transformers config from a preset name, a config.json file, or a checkpoint directory."""
    from transformers import CONFIG_MAPPING

    from slidedp.presets.models import MODEL_PRESETS

    if source.lower() in MODEL_PRESETS:
        data = dict(MODEL_PRESETS[source.lower()])
    else:
        path = config_json_path(source)
        if not path.is_file():
            raise SlideDPError(f"model {source!r}: not a preset nor a directory/config.json that exists")
        try:
            data = read_mapping(path, "model config")
        except SlideDPError as exc:
            raise SlideDPError(f"model {source!r}: cannot read config.json ({str(exc).split(': ', 1)[-1]})") from None
    # the simulator's validation (model_type among the supported ones, sizes, flags, an even head_dim) first
    ModelSpec.from_hf_config(data, name=str(source))
    model_type = data["model_type"]
    for key, low in (("rope_theta", 0.0), ("rms_norm_eps", 0.0)):  # a zero or negative one trains NaN
        value = data.get(key)
        if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low):
            raise SlideDPError(f"model {source!r}: {key} must be a finite number > {low:g}, got {quote(value)}")
    fields = {k: v for k, v in data.items() if k != "model_type"}
    try:
        cfg = CONFIG_MAPPING[model_type](**fields)
    except Exception as exc:  # transformers validates with several exception types of its own
        # transformers' validators put the reason on the lines after a "Class validation error ...:" heading
        said = " ".join(str(exc).split())
        said = said if len(said) <= 240 else said[:239] + "…"
        raise SlideDPError(f"model {source!r}: invalid config ({type(exc).__name__}: {said})") from None
    from transformers.activations import ACT2FN

    act = getattr(cfg, "hidden_act", None)
    if act is not None and (not isinstance(act, str) or act not in ACT2FN):  # the model build would raise KeyError
        raise SlideDPError(f"model {source!r}: hidden_act {quote(act)} is not an activation transformers knows "
                           f"(e.g. silu, gelu)")
    cfg._attn_implementation = attn_implementation
    return cfg


class ModelAdapter:
    """The meta-device skeleton of a causal LM and its units: embedding, decoder layers, final norm + head."""

    def __init__(self, config):
        from transformers import AutoModelForCausalLM

        self.config = config
        with torch.device("meta"):
            self.skeleton = AutoModelForCausalLM.from_config(config)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.units = self._layout()

    def _layout(self) -> tuple[UnitLayout, ...]:
        base = self.skeleton.model
        groups: list[tuple[str, str, list[tuple[str, str, torch.Size]]]] = [
            ("embed", "embed", [("weight", "model.embed_tokens.weight", base.embed_tokens.weight.shape)])]
        for i, layer in enumerate(base.layers):
            groups.append((f"layer{i}", "layer", [(n, f"model.layers.{i}.{n}", p.shape)
                                                  for n, p in layer.named_parameters()]))
        head = [("norm.weight", "model.norm.weight", base.norm.weight.shape)]
        if not self.tied:
            head.append(("lm_head.weight", "lm_head.weight", self.skeleton.lm_head.weight.shape))
        groups.append(("head", "head", head))
        units, offset = [], 0
        for index, (name, kind, params) in enumerate(groups):
            slots, inner = [], 0
            for pname, hf_name, shape in params:
                slot = ParamSlot(pname, hf_name, tuple(shape), inner)
                slots.append(slot)
                inner += slot.numel
            units.append(UnitLayout(index, name, kind, tuple(slots), offset))
            offset += inner
        return tuple(units)

    @property
    def total_params(self) -> int:
        return sum(u.numel for u in self.units)

    def layer_module(self, unit: UnitLayout) -> nn.Module:
        return self.skeleton.model.layers[int(unit.name[len("layer"):])]

    def rotary(self, device: torch.device) -> nn.Module:
        """A real (non-meta) rotary embedding module: it only holds inv_freq."""
        rot = type(self.skeleton.model.rotary_emb)(config=self.config)
        return rot.to(device)

    def init_unit_(self, unit: UnitLayout, flat: torch.Tensor, generator: torch.Generator) -> None:
        """Random init of one unit in fp32, as transformers does: normal(0, initializer_range) for matrices,
        ones for norm weights, zeros for biases."""
        std = float(getattr(self.config, "initializer_range", 0.02))
        for p in unit.params:
            view = flat[p.offset:p.offset + p.numel]
            if p.name.endswith("bias"):
                view.zero_()
            elif len(p.shape) == 1:
                view.fill_(1.0)
            else:
                view.normal_(0.0, std, generator=generator)
