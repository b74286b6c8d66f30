"""The systems `benchmarks.peer_compare` times, one worker function each, and what they share: the same model,
the same chunked loss, the same init, the same timing loop (see peer_compare's docstring for the setup).

A worker runs in its own process (under torchrun for several ranks) and reports one row per batch
through ``emit``.

    python -m benchmarks.peer_systems --self-check   # the chunked loss equals plain cross-entropy (CPU)
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.common import log, rss_gib

LOSS_CHUNK_TOKENS = 4096
LR, BETAS, EPS, CLIP = 1e-5, (0.9, 0.95), 1e-8, 1.0


# ---- shared by the peers ---------------------------------------------------------------------------------
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


def materialise_(module, cfg, device: str, seed: int = 0) -> None:
    """Random init in place as transformers does (normal(0, initializer_range) for matrices, ones for norms),
    drawn on ``device`` in fp32 and copied into each parameter's (possibly sharded, possibly CPU) storage;
    the rotary embedding is rebuilt on ``device`` (to_empty leaves its buffer uninitialised)."""
    import torch

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
    inner = module.lm if hasattr(module, "lm") else module
    inner.model.rotary_emb = type(inner.model.rotary_emb)(config=cfg).to(device)


def time_batches(system: str, args, ranks: Ranks, vocab: int, step_fn, emit, extra: dict | None = None) -> None:
    """Run ``args.steps`` steps per global batch through ``step_fn(input_ids, labels)``, each rank on its
    ``batch / world`` sequences; rank 0 emits one row per batch (host memory summed over the ranks)."""
    import torch

    from benchmarks.common import synthetic_tokens
    from slidedp.model_spec import load_model_spec

    spec = load_model_spec(args.model)
    cuda = ranks.device.startswith("cuda")
    seq = args.seq
    for i, batch in enumerate(args.batches):
        row = {"system": system, "model": args.model, "seq": seq, "batch": batch, "tokens_per_step": batch * seq,
               "gpus": ranks.world, **(extra or {})}
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
            row.update(status="oom", error=str(exc).splitlines()[0][:200], rank=ranks.rank)
            emit(row)
            if ranks.world > 1:  # the other ranks wait in a collective: end the group (torchrun stops them)
                raise SystemExit(1) from None
            for later in args.batches[i + 1:]:
                emit({**row, "batch": later, "tokens_per_step": later * seq, "status": "skipped (oom at smaller)"})
            return
        step = statistics.median(times[1:]) if len(times) > 1 else times[0]
        rss, rss_peak = ranks.total(rss_gib()), ranks.total(rss_gib("VmHWM"))
        row.update(status="ok", step_times_s=times, step_time_s=step, tokens_per_s=batch * seq / step,
                   model_tflops=spec.train_flops_per_token(seq) * batch * seq / step / 1e12,
                   gpu_peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                   gpu_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else float("nan"),
                   host_rss_gib=rss, host_rss_peak_gib=rss_peak, final_loss=float(loss))
        if ranks.rank == 0:
            emit(row)


# ---- the systems ----------------------------------------------------------------------------------------
def run_resident(args, emit) -> None:
    """One GPU: plain training (fp32 weights, bf16 autocast, fused AdamW). Several: FSDP2 without offload."""
    import torch

    ranks = Ranks.from_env(args.device)
    if ranks.world > 1:
        run_fsdp2(args, emit, ranks, offload=False)
        return
    cfg, lm = build_lm(args.model, ranks.device)
    module = wrap_with_loss(lm)
    module.to_empty(device=ranks.device)
    materialise_(module, cfg, ranks.device)
    cuda = ranks.device.startswith("cuda")
    opt = torch.optim.AdamW(module.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, fused=cuda)

    def step(x, y):
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16):
            loss = module(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    time_batches("resident", args, ranks, cfg.vocab_size, step, emit,
                 {"optimizer": "torch AdamW fused" if cuda else "torch AdamW"})


def run_fsdp2_offload(args, emit) -> None:
    run_fsdp2(args, emit, Ranks.from_env(args.device), offload=True)


def run_fsdp2(args, emit, ranks: Ranks, offload: bool) -> None:
    """FSDP2 `fully_shard` per decoder layer and on the root, bf16 compute with fp32 reduction; with
    CPUOffloadPolicy the shards, their gradients and AdamW live on the CPU."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    cuda = ranks.device.startswith("cuda")
    ranks.init_group(args.port)
    cfg, lm = build_lm(args.model, ranks.device)
    module = wrap_with_loss(lm)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy = {"offload_policy": CPUOffloadPolicy(pin_memory=cuda)} if offload else {}
    for layer in lm.model.layers:
        fully_shard(layer, mp_policy=mp, **policy)
    fully_shard(module, mp_policy=mp, **policy)
    module.to_empty(device="cpu" if offload else ranks.device)
    materialise_(module, cfg, ranks.device, seed=ranks.rank)
    params = list(module.parameters())
    where = "CPU" if offload else "GPU"
    state = {"opt": torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, fused=True),
             "kind": f"torch AdamW fused ({where})"}

    def step(x, y):
        loss = module(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        try:
            state["opt"].step()
        except (RuntimeError, NotImplementedError) as exc:  # fused AdamW over these DTensors not available
            log(f"fsdp2: fused AdamW failed ({str(exc).splitlines()[0][:120]}); using foreach")
            state["opt"] = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, foreach=True)
            state["kind"] = f"torch AdamW foreach ({where})"
            state["opt"].step()
        state["opt"].zero_grad(set_to_none=True)
        return loss.detach()

    def emit_kind(row):
        emit({**row, "optimizer": state["kind"], "implementation": "FSDP2" + (" CPUOffloadPolicy" if offload else "")})

    try:
        time_batches("fsdp2-offload" if offload else "resident", args, ranks, cfg.vocab_size, step, emit_kind)
    finally:
        dist.destroy_process_group()


def run_deepspeed_offload(args, emit) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(args.port))):
        os.environ.setdefault(key, value)  # torchrun sets them for several ranks
    import deepspeed

    ranks = Ranks.from_env(args.device)
    cfg, lm = build_lm(args.model, ranks.device)
    module = wrap_with_loss(lm)
    module.to_empty(device=ranks.device)
    materialise_(module, cfg, ranks.device)
    config = {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
        "bf16": {"enabled": True}, "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "overlap_comm": True, "contiguous_gradients": True,
                              "reduce_bucket_size": 200_000_000, "allgather_bucket_size": 200_000_000},
    }
    t0 = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config)
    log(f"deepspeed-offload: initialize (incl. CPU Adam JIT build) {time.perf_counter() - t0:.1f} s")

    def step(x, y):
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        return loss.detach()

    time_batches("deepspeed-offload", args, ranks, cfg.vocab_size, step, emit,
                 {"optimizer": "DeepSpeedCPUAdam (ZeRO-2 offload_optimizer cpu)", "deepspeed": deepspeed.__version__})


def slidedp_space(host_state_only: bool):
    """The tuner's search space: everything, or all optimizer state kept on the host (gpu_state_units = 0),
    the like-for-like setting against peers that offload the whole optimizer."""
    from slidedp.tune import TuneSpace

    return TuneSpace(gpu_state=not host_state_only)


def run_slidedp(args, emit, host_state_only: bool = False) -> None:
    if args.gpus > 1:
        run_slidedp_ranks(args, emit, host_state_only)
        return
    import torch

    from benchmarks.streaming_measure import StreamingModel, measure_policy, save_run_dir
    from slidedp.hardware import GIB, load_hardware
    from slidedp.problem import resolve_budget
    from slidedp.runtime.device import Device
    from slidedp.tune import tune

    system = "slidedp-host" if host_state_only else "slidedp"
    hw = load_hardware(args.profile)
    budget = resolve_budget(hw, args.slidedp_gpu_budget, hw.host.memory_gib)
    sm = StreamingModel.open(args.model, Device(args.device), log)
    runs = Path(args.out) / "slidedp_runs"
    for i, batch in enumerate(args.batches):
        # Out of memory at the tuned policy (the memory model errs by up to ~20%): tune again for 85% of the
        # budget, twice at most, and say so in the row.
        row, oom = None, []
        for attempt in range(3):
            plan_budget = replace(budget, gpu_bytes=budget.gpu_bytes * 0.85 ** attempt)
            tuned = tune(sm.spec, hw, args.seq, batch, plan_budget, slidedp_space(host_state_only), refine_top=4)
            try:
                row, trace = measure_policy(sm, hw, tuned.best.policy, args.seq, batch, args.steps)
                break
            except torch.OutOfMemoryError as exc:
                oom.append(f"{plan_budget.gpu_bytes / GIB:.0f} GiB budget: {str(exc).splitlines()[0][:120]}")
                gc.collect()
                torch.cuda.empty_cache()
        if row is None:
            emit({"system": system, "model": args.model, "seq": args.seq, "batch": batch, "status": "oom",
                  "error": " | ".join(oom)})
            for later in args.batches[i + 1:]:
                emit({"system": system, "model": args.model, "seq": args.seq, "batch": later,
                      "status": "skipped (oom at smaller)"})
            break
        row.update(system=system, predicted_gpu_peak_gib=tuned.best.memory.gpu_peak / GIB,
                   planned_gpu_budget_gib=plan_budget.gpu_bytes / GIB, oom_retries=oom,
                   optimizer="SlideDP one-pass CPU AdamW" + ("" if host_state_only else " + GPU AdamW for held units"))
        save_run_dir(runs, f"{Path(args.model).stem}-s{args.seq}-b{batch}-{system}", row, trace, sm.spec)
        emit(row)
    sm.close()


def run_slidedp_ranks(args, emit, host_state_only: bool = False) -> None:
    """Several GPUs: `slidedp train --nproc N` per batch (one shared host state for all ranks), with the
    policy `slidedp tune` picks for N GPUs; the row comes from the run directory's summary."""
    from benchmarks.common import train_run
    from slidedp.hardware import load_hardware
    from slidedp.model_spec import load_model_spec
    from slidedp.problem import resolve_budget
    from slidedp.tune import tune

    hw = load_hardware(args.profile).with_gpus(args.gpus)
    spec = load_model_spec(args.model)
    budget = resolve_budget(hw, args.slidedp_gpu_budget, hw.host.memory_gib)
    system = "slidedp-host" if host_state_only else "slidedp"
    runs = Path(args.out) / "slidedp_runs"
    runs.mkdir(parents=True, exist_ok=True)
    for batch in args.batches:
        base = {"system": system, "model": args.model, "seq": args.seq, "batch": batch,
                "tokens_per_step": batch * args.seq, "gpus": args.gpus}
        try:
            policy = tune(spec, hw, args.seq, batch, budget, slidedp_space(host_state_only), refine_top=2).best.policy
        except Exception as exc:  # noqa: BLE001 - a batch that does not divide or fit is a row, not a crash
            emit({**base, "status": f"not tuned ({str(exc).splitlines()[0][:160]})"})
            continue
        label = f"{Path(args.model).stem}-s{args.seq}-b{batch}-g{args.gpus}-{system}"
        policy_path = runs / f"{label}.yaml"
        policy.save(policy_path)
        code, s = train_run(args.model, args.seq, policy_path, args.steps, runs / label, batch=batch,
                            nproc=args.gpus, hardware=args.profile,
                            device="auto" if args.device.startswith("cuda") else "cpu")
        if code != 0 or s is None:
            emit({**base, "status": f"failed (exit {code})", "policy": policy.to_dict()})
            continue
        emit({**base, "status": "ok", "policy": s.policy, "step_time_s": s.step_time_s,
              "tokens_per_s": s.tokens_per_s, "model_tflops": s.model_tflops_per_gpu * args.gpus,
              "gpu_peak_gib": s.gpu_peak_gib or float("nan"), "host_rss_peak_gib": s.host_rss_peak_gib,
              "limiter": s.limiter, "predicted_step_time_s": s.predicted_step_time_s,
              "predicted_limiter": s.predicted_limiter if "predicted_limiter" in s.given else "",
              "final_loss": s.final_loss,
              "optimizer": "SlideDP one-pass CPU AdamW"})


WORKERS = {"slidedp": run_slidedp, "slidedp-host": lambda args, emit: run_slidedp(args, emit, host_state_only=True),
           "fsdp2-offload": run_fsdp2_offload, "deepspeed-offload": run_deepspeed_offload,
           "resident": run_resident}


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


def main() -> int:
    p = argparse.ArgumentParser(description="The peer systems' shared parts (workers run through peer_compare)")
    p.add_argument("--self-check", action="store_true", help="check the chunked loss against plain cross-entropy")
    args = p.parse_args()
    if not args.self_check:
        p.print_help()
        return 2
    self_check()
    return 0


if __name__ == "__main__":
    sys.exit(main())
