"""What the peer systems of `benchmarks.peer_compare` share: the same model, the same chunked loss, the same
init and the same timing loop (see peer_compare's docstring for the setup), and the chunked loss's self-check.
The workers themselves are in `benchmarks.peer_systems`.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from benchmarks.common import log, oom_fields, rss_gib

if TYPE_CHECKING:
    from slidedp.model_spec import ModelSpec

LOSS_CHUNK_TOKENS = 4096
LR, BETAS, EPS, CLIP = 1e-5, (0.9, 0.95), 1e-8, 1.0
# The status of a batch's row that is not run because a batch no larger ran out of GPU memory (BatchesAfterOom).
SKIPPED_AFTER_OOM = "skipped (oom at smaller)"


@dataclass
class BatchesAfterOom:
    """Which batches of one system's run are rows without runs (status SKIPPED_AFTER_OOM) because a batch ran out
    of GPU memory. A larger batch needs more memory still, so only batches at least as large as the smallest one
    that ran out are skipped; smaller ones still run, in whatever order they come (device scripts pass orders like
    ``--batches 1 4 8 1``, and a descending order must not lose the small batches). A smaller batch run after an
    out-of-memory in the same process may carry the failed step's partial gradients into its first step, which is
    warm-up and not timed (every worker zeroes its gradients after each optimizer step)."""

    smallest: int | None = None  # the smallest batch that ran out of GPU memory so far

    def ran_out(self, batch: int) -> None:
        """``batch`` ran out of GPU memory."""
        if self.smallest is None or batch < self.smallest:
            self.smallest = batch

    def skips(self, batch: int) -> bool:
        """Whether ``batch`` is a row without a run: a batch no larger ran out of GPU memory."""
        return self.smallest is not None and batch >= self.smallest


@dataclass(frozen=True)
class Ranks:
    """This worker's place in a torchrun group (rank 0 of 1 when run directly)."""

    rank: int
    world: int
    device: str

    @classmethod
    def from_env(cls, device: str) -> Ranks:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if device.startswith("cuda") and world > 1:
            import torch

            local = int(os.environ.get("LOCAL_RANK", 0))
            torch.cuda.set_device(local)
            device = f"cuda:{local}"
        return cls(rank, world, device)

    def init_group(self, port: int) -> None:
        """NCCL for GPU tensors and gloo for CPU ones (FSDP2 offload clips over CPU DTensors)."""
        import torch.distributed as dist

        backend = "cpu:gloo,cuda:nccl" if self.device.startswith("cuda") else "gloo"
        if self.world > 1:
            dist.init_process_group(backend)  # env:// from torchrun
        else:
            dist.init_process_group(backend, rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")

    def total(self, value: float) -> float:
        """Sum of ``value`` over the ranks (host memory of the whole group)."""
        if self.world == 1:
            return value
        import torch
        import torch.distributed as dist

        # DeepSpeed's group is NCCL only: the sum then travels on the GPU.
        where = self.device if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor([value], dtype=torch.float64, device=where)
        dist.all_reduce(t)
        return float(t.item())


def chunked_lm_loss(hidden, weight, labels, chunk: int = LOSS_CHUNK_TOKENS, dtype=None):
    """Mean next-token cross-entropy with the logits built one token chunk at a time and recomputed in
    backward (activation checkpointing per chunk): the peers get the memory saving SlideDP's head has."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    def chunk_loss(h, w, y):
        return F.cross_entropy(F.linear(h, w).float(), y, reduction="sum")

    dtype = dtype or torch.bfloat16  # the compute dtype of every system compared
    h = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
    w = weight.to(dtype)
    y = labels.reshape(-1)
    total = None
    for s in range(0, h.shape[0], chunk):
        part = checkpoint(chunk_loss, h[s:s + chunk], w, y[s:s + chunk], use_reentrant=False)
        total = part if total is None else total + part
    return total / y.numel()


def build_lm(model: str, device: str):
    """The transformers causal LM on the meta device (shapes only), gradient checkpointing on."""
    import torch
    from transformers import AutoModelForCausalLM

    from slidedp.runtime.hf_adapter import load_hf_config

    cfg = load_hf_config(model)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(cfg)
    lm.config.use_cache = False
    if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.2x renamed it
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()  # transformers only checkpoints in training mode
    return cfg, lm


def wrap_with_loss(lm):
    """A module whose forward returns the loss, so wrappers that hook forward (FSDP2, DeepSpeed) see the
    embedding, final norm and LM head inside one forward call."""
    from torch import nn

    class CausalLMWithChunkedLoss(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.lm = inner

        def forward(self, input_ids, labels):
            hidden = self.lm.model(input_ids=input_ids).last_hidden_state
            return chunked_lm_loss(hidden, self.lm.lm_head.weight, labels)

    return CausalLMWithChunkedLoss(lm)


# Measured peers that trained a tied model with an untied head before benchmarks.peer_setup.materialise_ tied it
# again (2026-12-07): the single-GPU GPU-resident system and DeepSpeed. Rows written since carry "head_as_configured".
UNTIED_BEFORE_FIX = ("resident", "deepspeed-offload", "deepspeed-zero3-offload")


def spec_as_trained(spec: ModelSpec, row: dict) -> ModelSpec:
    """The ModelSpec a measured peer row trained: ``spec`` (its model as configured), with the head untied where
    the benchmark untied it."""
    from dataclasses import replace

    untied = (spec.tied_embeddings and not row.get("head_as_configured") and row.get("system") in UNTIED_BEFORE_FIX
              and not (row.get("system") == "resident" and row.get("gpus", 1) > 1))  # several: FSDP2, tied
    return replace(spec, tied_embeddings=False, name=f"{spec.name} (head untied)") if untied else spec


def materialise_(module, cfg, device: str, seed: int = 0) -> None:
    """Random init in place as transformers does (normal(0, initializer_range) for matrices, ones for norms),
    drawn on ``device`` in fp32 and copied into each parameter's (possibly sharded, possibly CPU) storage;
    the rotary embedding is rebuilt on ``device`` (to_empty leaves its buffer uninitialised).

    A tied head is tied again first: ``Module.to_empty`` gives the embedding and the head a tensor each (FSDP2's
    sharded module keeps them one), so until 2026-12-07 the single-GPU resident system and DeepSpeed trained every
    tied model (Qwen3-0.6B to 4B, the Llama-3.2-3B and Qwen2.5-3B shapes) with an untied head: 0.2-0.4 B parameters
    more than the model."""
    import torch

    inner = module.lm if hasattr(module, "lm") else module
    if getattr(cfg, "tie_word_embeddings", False) \
            and inner.lm_head.weight is not inner.model.embed_tokens.weight:
        inner.lm_head.weight = inner.model.embed_tokens.weight

    gen = torch.Generator(device=device).manual_seed(seed)
    std = float(getattr(cfg, "initializer_range", 0.02))
    with torch.no_grad():
        for name, p in module.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("bias"):
                local.zero_()
            elif local.dim() == 1:
                local.fill_(1.0)
            else:
                src = torch.empty(local.shape, dtype=torch.float32, device=device).normal_(0.0, std, generator=gen)
                local.copy_(src)
    inner.model.rotary_emb = type(inner.model.rotary_emb)(config=cfg).to(device)


class PhaseClock:
    """Seconds of each phase of a step (forward, backward, clip, optimizer step, ...), with a device
    synchronisation at every mark; off (no synchronisation, nothing recorded) unless ``--phases`` asked for it,
    since the extra synchronisations can hide overlap the timed steps would otherwise have."""

    def __init__(self, on: bool, cuda: bool):
        self.on, self.cuda = on, cuda
        self.steps: list[dict[str, float]] = []
        self._t = 0.0

    def start(self) -> None:
        if self.on:
            self._sync()
            self.steps.append({})
            self._t = time.perf_counter()

    def mark(self, phase: str) -> None:
        if self.on:
            self._sync()
            now = time.perf_counter()
            self.steps[-1][phase] = now - self._t
            self._t = now

    def medians(self, warmup: int = 1) -> dict[str, float]:
        """Each phase's median over the steps after the ``warmup`` first (or the last, with too few steps)."""
        timed = self.steps[warmup:] or self.steps[-1:]
        return {k: statistics.median(s[k] for s in timed if k in s) for k in (timed[0] if timed else {})}

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def steady_step(times: list[float], warmup: int = 1) -> float:
    """The median step after the ``warmup`` first ones (with too few steps, the last one)."""
    return statistics.median(times[warmup:]) if len(times) > warmup else times[-1]


def time_batches(system: str, args, ranks: Ranks, vocab: int, step_fn, emit, extra: dict | None = None,
                 clock: PhaseClock | None = None, warmup: int = 1) -> None:
    """Run ``args.steps`` steps per global batch through ``step_fn(input_ids, labels)``, each rank on its
    ``batch / world`` sequences; rank 0 emits one row per batch (host memory summed over the ranks), its step time
    the median after ``warmup`` steps of each batch (DeepSpeed ZeRO-3 needs two in a process's first batch). Rows
    run after an out-of-memory in the same process carry ``after_oom_in_process`` (the batch that ran out): their
    peaks may include what the failed step left in the allocator."""
    import gc

    import torch

    from benchmarks.common import synthetic_tokens
    from slidedp.model_spec import load_model_spec

    spec = load_model_spec(args.model)
    cuda = ranks.device.startswith("cuda")
    seq = args.seq
    after_oom = BatchesAfterOom()
    oom_row: dict = {}  # the last OOM's row, which is the smallest batch's (a larger one would have been skipped)
    for batch in args.batches:
        if after_oom.skips(batch):  # one rank only (several end the group at an OOM); the OOM row's fields
            emit({**oom_row, "batch": batch, "tokens_per_step": batch * seq, "status": SKIPPED_AFTER_OOM})
            continue
        row = {"system": system, "model": args.model, "seq": seq, "batch": batch, "tokens_per_step": batch * seq,
               "gpus": ranks.world, "head_as_configured": True, **(extra or {})}
        if after_oom.smallest is not None:  # the process's memory went through an out-of-memory: say so in the row
            row["after_oom_in_process"] = after_oom.smallest
        if batch % ranks.world:
            if ranks.rank == 0:
                emit({**row, "status": f"skipped (batch not divisible by {ranks.world} ranks)"})
            continue
        per_rank = batch // ranks.world
        tokens = synthetic_tokens(vocab, batch, seq)
        mine = tokens[ranks.rank * per_rank:(ranks.rank + 1) * per_rank]
        x, y = mine[:, :-1].to(ranks.device), mine[:, 1:].to(ranks.device)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        times, loss = [], float("nan")
        if clock is not None:
            clock.steps.clear()
        try:
            for _ in range(args.steps):
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                loss = step_fn(x, y)
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        except torch.OutOfMemoryError as exc:
            row.update(status="oom", error=str(exc).splitlines()[0][:200], rank=ranks.rank, **oom_fields(str(exc)))
            emit(row)
            if ranks.world > 1:  # the other ranks wait in a collective: end the group (torchrun stops them)
                raise SystemExit(1) from None
            after_oom.ran_out(batch)
            oom_row = row
        if row.get("status") == "oom":  # outside the handler, whose exception holds the failed step's tensors;
            gc.collect()  # the next batch empties the allocator's cache before it runs
            continue
        step = steady_step(times, warmup)
        rss, rss_peak = ranks.total(rss_gib()), ranks.total(rss_gib("VmHWM"))
        row.update(status="ok", step_times_s=times, warmup_steps=warmup, step_time_s=step,
                   tokens_per_s=batch * seq / step,
                   model_tflops=spec.train_flops_per_token(seq) * batch * seq / step / 1e12,
                   gpu_peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                   gpu_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else float("nan"),
                   host_rss_gib=rss, host_rss_peak_gib=rss_peak, final_loss=float(loss))
        if clock is not None and clock.steps:
            row["phase_s"] = clock.medians(warmup)
        if ranks.rank == 0:
            emit(row)


# ---- the systems ----------------------------------------------------------------------------------------
def self_check() -> None:
    """The peers' chunked loss (logits recomputed per chunk) has the plain loss's value and gradients, in
    float64 on the CPU with a chunk that does not divide the tokens (the last chunk is short)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 10, 16, generator=g, dtype=torch.float64).requires_grad_()
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, 50, (2, 10), generator=g)
    ref = F.cross_entropy((hidden.reshape(-1, 16) @ weight.T).float(), labels.reshape(-1))
    ref_grads = torch.autograd.grad(ref, [hidden, weight])

    loss = chunked_lm_loss(hidden, weight, labels, chunk=7, dtype=torch.float64)
    grads = torch.autograd.grad(loss, [hidden, weight])
    loss_err = abs(loss.item() - ref.item())
    assert loss_err <= 1e-6 * abs(ref.item()), f"chunked loss {loss.item()} != cross-entropy {ref.item()}"
    for a, b in zip(grads, ref_grads, strict=True):
        assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-7), "chunked loss gradients differ"
    log(f"self-check ok: chunked loss {loss.item():.6f} (cross-entropy {ref.item():.6f}), gradients agree")
