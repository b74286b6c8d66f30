"""Shape of a decoder-only transformer and the per-layer quantities every other part derives from.

The analytical model, the simulator and the runtime all need the same counts: parameters per
unit, FLOPs per token, activation bytes per token. Keeping them here means the three can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

from slidedp import compute as c
from slidedp.config_io import quote, read_mapping
from slidedp.errors import SlideDPError

BF16_BYTES = 2
# Upper bounds on a model's sizes, far above any real model: a config asking for more is a mistake (or an
# attack), refused before anything is allocated from it.
SIZE_BOUNDS: dict[str, int] = {"layers": 4096, "hidden": 2**18, "ffn": 2**20, "heads": 2**12, "kv_heads": 2**12,
                               "head_dim": 2**12, "vocab": 2**24}


# The architectures whose decoder layer ModelSpec lists operation by operation and the runtime builds.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a Llama/Qwen-style decoder (RMSNorm, GQA attention, SwiGLU MLP)."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    qk_norm: bool = False
    attn_bias: bool = False

    def __post_init__(self) -> None:
        for field, bound in SIZE_BOUNDS.items():
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= bound:
                raise SlideDPError(f"model {quote(self.name)}: {field} must be a positive integer (at most "
                                   f"{bound}), got {quote(value)}")
        if self.heads % self.kv_heads != 0:
            raise SlideDPError(
                f"model {self.name!r}: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )

    # ---- parameter counts -------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @cached_property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, MLP and the two RMSNorms)."""
        h = self.hidden
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attn_bias:
            attn += self.q_dim + 2 * self.kv_dim
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * h * self.ffn
        return attn + mlp + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """Final norm plus lm_head; a tied head owns only the norm (its matrix is the embedding)."""
        return self.hidden + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @cached_property
    def total_params(self) -> int:
        return self.embedding_params + self.layers * self.layer_params + self.head_params

    # ---- FLOPs ------------------------------------------------------------------------------------
    def layer_linear_flops_per_token(self) -> float:
        """Forward matmul FLOPs of one decoder layer per token (2 per weight)."""
        return 2.0 * (self.layer_params - 2 * self.hidden)

    def layer_attention_flops_per_token(self, seq: int, span: float | None = None, attention: str = "sdpa") -> float:
        """Forward causal attention FLOPs per token: QK^T and PV over an average context of half the attended
        length: the row (``seq``), or for packed rows through the varlen kernel the examples' ``span``. Eager
        attention (a peer's kernel) multiplies every pair, the masked half too: the whole row."""
        attended = seq if span is None else span
        return 2.0 * 2.0 * self.q_dim * (attended if attention == "eager" else attended / 2.0)

    def head_flops_per_token(self) -> float:
        """Forward lm_head FLOPs per token (the loss itself is negligible)."""
        return 2.0 * self.vocab * self.hidden

    def train_flops_per_token(self, seq: int, span: float | None = None) -> float:
        """Model FLOPs per trained token (fwd + bwd = 3x fwd, no recompute): the TFLOPS numerator. ``span``:
        packed rows attending inside examples of this token-weighted mean length (None: whole rows)."""
        per_layer = self.layer_linear_flops_per_token() + self.layer_attention_flops_per_token(seq, span)
        return 3.0 * (self.layers * per_layer + self.head_flops_per_token())

    # ---- activations -----------------------------------------------------------------------------
    def checkpoint_bytes_per_token(self) -> int:
        """The layer input kept per layer when recomputing (bf16 hidden state)."""
        return BF16_BYTES * self.hidden

    def full_activation_bytes_per_token(self) -> int:
        """What autograd keeps for one layer's backward without recompute (HF implementation, bf16, SDPA).

        Each RMSNorm keeps its fp32 upcast input and bf16 output (8h B with the bf16 input); q/k norms
        keep fp32 copies of q and k; RoPE keeps rotated q and k; SDPA keeps q, k, v, its output and an fp32
        log-sum-exp per head; the SwiGLU MLP keeps gate, up, silu(gate) and their product. Measured on an
        H200 for Qwen3-4B (batch 4 x 4096, keep): within 5% of this count.
        """
        h, f, q, kv = self.hidden, self.ffn, self.q_dim, self.kv_dim
        norms = 2 * 8 * h
        qk_norm = 4 * (q + kv) if self.qk_norm else 0
        rope = BF16_BYTES * (q + kv)
        attention = BF16_BYTES * (2 * q + 2 * kv) + 4 * self.heads
        mlp = 4 * BF16_BYTES * f
        return norms + qk_norm + rope + attention + mlp

    def sequence_activation_bytes_per_token(self) -> int:
        """What a sequence-tiled layer still keeps for its backward over the whole sequence: the attention's
        share of :meth:`full_activation_bytes_per_token` (q/k norms, RoPE, SDPA), the first RMSNorm's bf16
        input and output (its tiles' checkpoints; the projections' input) and the MLP block's bf16 input
        (its tiles' checkpoints). Everything else lives one tile at a time."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        qk_norm = 4 * (q + kv) if self.qk_norm else 0
        rope = BF16_BYTES * (q + kv)
        attention = BF16_BYTES * (2 * q + 2 * kv) + 4 * self.heads
        return qk_norm + rope + attention + 3 * BF16_BYTES * h

    def tile_activation_bytes_per_token(self) -> int:
        """What one tile's recompute holds in a tiled layer's backward, per token of the tile: the second
        RMSNorm and the SwiGLU MLP, as counted in :meth:`full_activation_bytes_per_token` (the first RMSNorm's
        tiles are recomputed later, in the attention's backward, one at a time and smaller)."""
        return 8 * self.hidden + 4 * BF16_BYTES * self.ffn

    def attention_backward_bytes_per_token(self) -> int:
        """What the attention's backward allocates per token, over the whole sequence, beyond what the layer
        saved for it (flash attention as SDPA runs it, also for packed rows): the gradients of its output and
        of q, k and v (bf16), the kernel's fp32 accumulator of the query gradient, the key and value gradients
        expanded to every query head under grouped-query attention (bf16; summed to the kv heads afterwards)
        and an fp32 row term per head, plus the residual stream's gradient (bf16). In an untiled layer the
        MLP's saved tensors are freed by then and are larger; in a tiled one they are one tile, so at long
        sequences these transients, not the tile, bound the layer's working set (c17: 557,056 tokens went out
        of GPU memory on a 5.31 GiB request, one expanded key/value gradient, where the saved bytes alone
        fitted)."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        expanded = 2 * BF16_BYTES * q if self.kv_heads < self.heads else 0
        return BF16_BYTES * (h + 2 * q + 2 * kv) + 4 * q + expanded + 4 * self.heads

    def layer_backward_transient_bytes(self, tokens: int, tile: int) -> float:
        """GPU bytes one layer's backward allocates on top of what it kept (:meth:`layer_kept_bytes`) for
        ``tokens`` tokens: the larger of its two phases. Untiled, the attention's backward transients less
        the MLP block's saved tensors, freed before it (never negative); tiled, one tile's rerun
        (:meth:`tile_activation_bytes_per_token`) or the attention's backward over the whole sequence."""
        attention, mlp_block = self.attention_backward_bytes_per_token(), self.tile_activation_bytes_per_token()
        if tile <= 0:
            return float(max(0, attention - mlp_block) * tokens)
        return float(max(mlp_block * min(tile, tokens), attention * tokens))

    def layer_working_bytes(self, tokens: int, tile: int) -> float:
        """GPU bytes one layer's backward holds at its peak for ``tokens`` tokens of a micro-batch: what
        autograd kept (all of it when ``tile`` = 0, untiled; the sequence-wide part when tiled by
        Policy.seq_tile_tokens = ``tile``) plus the backward's own transients."""
        return self.layer_kept_bytes(tokens, tile) + self.layer_backward_transient_bytes(tokens, tile)

    def layer_kept_bytes(self, tokens: int, tile: int) -> float:
        """GPU bytes one layer keeps from its forward to its backward when the graph is kept (activation
        ``keep``): all of them untiled, the sequence-wide part when tiled (tiles are recomputed)."""
        per_token = self.full_activation_bytes_per_token() if tile <= 0 else self.sequence_activation_bytes_per_token()
        return float(per_token * tokens)

    # ---- operations (shape-aware compute: slidedp.compute) ----------------------------------------------
    @property
    def layer_linear_params(self) -> int:
        """Parameters of one decoder layer's projections (weights and biases), without its norms'."""
        return self.layer_params - 2 * self.hidden - (2 * self.head_dim if self.qk_norm else 0)

    @property
    def layer_linear_tensors(self) -> int:
        """Parameter tensors of one decoder layer's projections: 7 weights, and 3 biases where it has them."""
        return 7 + (3 if self.attn_bias else 0)

    @property
    def layer_tensors(self) -> int:
        """Parameter tensors of one decoder layer (q, k, v, o, gate, up, down, two norms, biases, q/k norms)."""
        return 9 + (3 if self.attn_bias else 0) + (2 if self.qk_norm else 0)

    def layer_forward_ops(self, batch: int, seq: int, span: float | None = None,
                          attention: str = "sdpa", precision: str = c.BF16) -> list[c.ComputeOp]:
        """One decoder layer's forward on ``batch`` sequences of ``seq`` tokens, as the HF layer runs it:
        RMSNorm, q/k/v projections (Qwen2's biases in their GEMMs: an op with backward work only), q/k norms
        (Qwen3), rotary, flash attention, output projection, residual, RMSNorm, gate/up projections, SwiGLU, down
        projection, residual, and the gradient sums at the layer's fan-outs (backward work only). ``span``: packed
        rows whose attention stays inside examples of this token-weighted mean length (None: whole rows).
        ``attention``: ``sdpa`` (flash; SlideDP and most peers) or ``eager`` (every score materialised:
        slidedp.compute.eager_attention_ops; whole rows only). ``precision``: ``amp-fp32`` adds what autocast over
        fp32 weights moves (slidedp.compute.amp_fp32_ops)."""
        t, h, q, kv = batch * seq, self.hidden, self.q_dim, self.kv_dim
        if c.check_attention(attention) == "eager":
            if span is not None:
                raise SlideDPError("eager attention has no packed-row (varlen) form")
            core = c.eager_attention_ops(batch, seq, self.heads, self.kv_heads, self.head_dim)
        else:
            core = [c.Attention(batch, seq, self.heads, self.kv_heads, self.head_dim) if span is None else
                    c.Attention(t / span, span, self.heads, self.kv_heads, self.head_dim)]
        ops: list[c.ComputeOp] = [
            self._rmsnorm_op(t, 1),
            c.Gemm(t, q, h), c.Gemm(t, kv, h, count=2),
        ]
        if self.attn_bias:
            ops.append(c.BIAS.op("qkv_bias", t * (q + 2 * kv), calls=3))
        if self.qk_norm:
            ops.append(c.RMSNORM.op("qk_norm", t * (q + kv), calls=2))
        ops += [
            c.ROTARY.op("rotary", t * (q + kv), calls=2),
            *core,
            c.Gemm(t, h, q),
            c.RESIDUAL.op("residual", t * h),
            *self._mlp_block_ops([(t, 1)]),
            c.GRADIENT_SUM.op("grad_sum", t * h * c.GRADIENT_SUMS_PER_LAYER, calls=c.GRADIENT_SUMS_PER_LAYER),
        ]
        if c.check_precision(precision) == c.AMP_FP32:
            ops += c.amp_fp32_ops(t, h, q + kv, self.qk_norm, self.layer_linear_params, self.layer_linear_tensors)
        return ops

    def layer_gradient_ops(self, accumulations: int, precision: str = c.BF16) -> list[c.ComputeOp]:
        """One decoder layer's per-step gradient bookkeeping on the GPU, for the numerics of its forward
        (:meth:`layer_forward_ops`): SlideDP's fp32 buffer passes over every parameter (slidedp.compute.gradient_ops,
        ``accumulations`` micro-batches into it), or under autocast over fp32 weights each projection's bf16
        gradient cast into its parameter's .grad (slidedp.compute.amp_gradient_ops)."""
        if c.check_precision(precision) == c.AMP_FP32:
            return c.amp_gradient_ops(self.layer_linear_params, self.layer_linear_tensors)
        return c.gradient_ops(self.layer_params, self.layer_tensors, accumulations)

    def _rmsnorm_op(self, tokens: int, passes: int) -> c.Elementwise:
        return c.RMSNORM.op("rmsnorm", tokens * self.hidden, passes)

    def _mlp_block_ops(self, pieces: list[tuple[int, int]]) -> list[c.ComputeOp]:
        """RMSNorm, gate/up projections, SwiGLU, down projection and residual run once per piece, where
        ``pieces`` lists (tokens per piece, number of such pieces): the whole sequence, or its tiles."""
        h, f = self.hidden, self.ffn
        t = sum(n * k for n, k in pieces)
        kernels = sum(k for _, k in pieces)
        gate_up = [c.Gemm(n, f, h, count=2 * k) for n, k in pieces]
        down = [c.Gemm(n, h, f, count=k) for n, k in pieces]
        return [self._rmsnorm_op(t, kernels), *gate_up,
                c.SWIGLU.op("swiglu", t * f, kernels), *down, c.RESIDUAL.op("residual", t * h, kernels)]

    def tile_recompute_ops(self, batch: int, seq: int, tile: int) -> list[c.ComputeOp]:
        """What a sequence-tiled layer (Policy.seq_tile_tokens = ``tile`` > 0) reruns in its backward beyond
        what the activation policy already does: each tile's first RMSNorm and its MLP block (RMSNorm,
        gate/up, SwiGLU, down, residual), whose intermediates were dropped after the tile's forward. The
        ``batch x seq`` tokens of a micro-batch are cut into tiles of ``tile`` tokens. Empty when untiled."""
        if tile <= 0:
            return []
        t = batch * seq
        full, rest = divmod(t, tile)
        pieces = [(tile, full)] if full else []
        if rest:
            pieces.append((rest, 1))
        return [self._rmsnorm_op(t, full + (1 if rest else 0)), *self._mlp_block_ops(pieces)]

    def head_ops(self, tokens: int, loss_chunk_tokens: int) -> tuple[list[c.ComputeOp], list[c.ComputeOp]]:
        """Forward and backward of the final norm, lm_head and cross-entropy over ``tokens`` tokens in chunks
        of ``loss_chunk_tokens`` (slidedp.compute.loss_head_ops)."""
        return c.loss_head_ops(self.hidden, self.vocab, tokens, loss_chunk_tokens)

    def embedding_ops(self, tokens: int) -> tuple[list[c.ComputeOp], list[c.ComputeOp]]:
        """The lookup (one row gathered per token) and its backward (rows scatter-added into the fp32 table:
        read the bf16 gradient, upcast, read-modify-write the row: 14 B per element)."""
        return ([c.Elementwise("embedding", tokens * self.hidden * c.EMBED_BYTES, c.EMBED_KERNELS)],
                [c.Elementwise("embedding_grad", tokens * self.hidden * 14.0, 2)])

    def to_dict(self) -> dict:
        return asdict(self)

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, cfg: dict, name: str = "custom") -> ModelSpec:
        """Build from a Hugging Face config.json dict (Llama, Mistral, Qwen2/2.5, Qwen3)."""
        if not isinstance(cfg, dict):
            raise SlideDPError(f"model {quote(name)}: config must be a JSON object")
        model_type = cfg.get("model_type")
        if model_type is None:  # it decides the layer's parts: q/k norms (Qwen3), qkv bias (Qwen2)
            raise SlideDPError(f"model {quote(name)}: config.json gives no model_type (supported: "
                               f"{', '.join(SUPPORTED_MODEL_TYPES)}); it decides which parts a layer has")
        if model_type not in SUPPORTED_MODEL_TYPES:
            # another architecture's layer is not the one priced here (nor one the runtime builds)
            raise SlideDPError(f"model {quote(name)}: model_type {quote(model_type)} is not supported "
                               f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        for flag in ("tie_word_embeddings", "attention_bias"):
            if cfg.get(flag) is not None and not isinstance(cfg[flag], bool):
                raise SlideDPError(f"model {quote(name)}: config.json's {flag} must be true or false, got "
                                   f"{quote(cfg[flag])}")
        filled = _transformers_defaults(cfg)
        cfg = {**filled, **{k: v for k, v in cfg.items() if v is not None}}
        def size(key: str) -> int:
            """A size as config.json must give it: an integer (JSON may write 4096.0), never true or 256.5."""
            value = cfg[key]
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SlideDPError(f"model {quote(name)}: config.json's {key} must be an integer, got "
                                   f"{quote(value)}")
            return value

        try:
            hidden = size("hidden_size")
            heads = size("num_attention_heads")
            if cfg.get("head_dim") is None and heads and hidden % heads:
                raise SlideDPError(f"model {quote(name)}: hidden_size {hidden} is not a multiple of "
                                   f"num_attention_heads {heads} and config.json gives no head_dim")
            spec = cls(
                name=name,
                layers=size("num_hidden_layers"),
                hidden=hidden,
                ffn=size("intermediate_size"),
                heads=heads,
                kv_heads=size("num_key_value_heads") if cfg.get("num_key_value_heads") else heads,
                # an explicit head_dim is what transformers uses, even 0 (refused below): never a silent default
                head_dim=size("head_dim") if cfg.get("head_dim") is not None else (hidden // heads if heads else 0),
                vocab=size("vocab_size"),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qk_norm=str(cfg.get("model_type", "")).startswith("qwen3"),
                attn_bias=bool(cfg.get("attention_bias", str(cfg.get("model_type", "")) == "qwen2")),
            )
            if spec.head_dim % 2:  # every supported layer rotates (q, k) pairs of dimensions: RoPE
                raise SlideDPError(f"model {quote(name)}: head_dim {spec.head_dim} is odd; rotary embeddings need "
                                   f"an even head dimension")
        except SlideDPError as exc:
            if not filled:
                raise
            said = ", ".join(f"{k} {v}" for k, v in filled.items())
            raise SlideDPError(f"{exc} ({said}: transformers' default for {cfg.get('model_type')}, which "
                               f"config.json does not set)") from None
        except KeyError as exc:
            raise SlideDPError(f"model {name!r}: config.json lacks required key {exc.args[0]!r}") from None
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: an infinite size
            raise SlideDPError(f"model {quote(name)}: config.json has a non-numeric size "
                               f"({str(exc)[:80]})") from None
        return spec


def _transformers_defaults(cfg: dict) -> dict:
    """num_key_value_heads and head_dim where config.json omits them, as transformers' config class of its
    model_type fills them in (they differ by type: Qwen3 defaults to 32 KV heads and head_dim 128, Llama to the
    attention heads), so the simulator prices the model that ``slidedp train`` builds. Empty where nothing is
    missing or transformers cannot build the config (the checks below then name what is wrong)."""
    missing = [k for k in ("num_key_value_heads", "head_dim") if cfg.get(k) is None]
    model_type = cfg.get("model_type")
    if not missing or not isinstance(model_type, str):
        return {}
    try:
        from transformers import CONFIG_MAPPING

        hf = CONFIG_MAPPING[model_type](**{k: v for k, v in cfg.items() if k != "model_type"})
    except Exception:  # an unknown type or a config transformers refuses: validated by the caller
        return {}
    return {k: v for k in missing if isinstance(v := getattr(hf, k, None), int) and not isinstance(v, bool)}


def config_json_path(name_or_path: str) -> Path:
    """The config.json a model argument that is not a preset names: the file itself, or a directory's
    config.json (a directory without one is refused here; a path that does not exist is left to the caller)."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise SlideDPError(f"model directory {name_or_path!r} has no config.json")
    return path


def load_model_spec(name_or_path: str) -> ModelSpec:
    """A preset name (e.g. ``qwen3-14b``), a config.json path, or a directory holding config.json."""
    from slidedp.presets.models import MODEL_PRESETS

    key = name_or_path.lower()
    if key in MODEL_PRESETS:
        return ModelSpec.from_hf_config(MODEL_PRESETS[key], name=key)
    path = config_json_path(name_or_path)
    if not path.exists():
        known = ", ".join(sorted(MODEL_PRESETS))
        raise SlideDPError(f"unknown model {name_or_path!r}: not a preset ({known}) nor an existing config.json")
    try:
        cfg = read_mapping(path, "model config")
    except SlideDPError as exc:
        raise SlideDPError(f"cannot read model config {str(path)!r}: {str(exc).split(': ', 1)[-1]}") from None
    # a directory's config.json is named by its directory, any other file by itself
    return ModelSpec.from_hf_config(cfg, name=(path.parent.name or path.stem) if path.name == "config.json"
                                    else path.stem)
