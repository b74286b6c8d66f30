"""The systems `benchmarks.peer_compare` times, one worker function each; what they share (model, chunked loss,
init, timing loop) is `benchmarks.peer_setup`.

A worker runs in its own process (under torchrun for several ranks) and reports one row per batch
through ``emit``.

    python -m benchmarks.peer_systems --self-check   # the chunked loss equals plain cross-entropy (CPU)
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import log, model_label
from benchmarks.our_variants import VARIANT_SPACES, variant_space
from benchmarks.peer_external import EXTERNAL, run_external_peer
from benchmarks.peer_setup import (
    BETAS,
    CLIP,
    EPS,
    LR,
    SKIPPED_AFTER_OOM,
    BatchesAfterOom,
    PhaseClock,
    Ranks,
    build_lm,
    materialise_,
    self_check,
    time_batches,
    wrap_with_loss,
)


def resident_trainer(model: str, device: str, clock: PhaseClock | None = None):
    """One GPU's plain training (fp32 weights, bf16 autocast, AdamW fused on CUDA, global clipping): the model's
    config, its optimizer and ``step(input_ids, labels)``, which returns the detached loss; ``clock`` (--phases)
    times its forward, backward, clip, optimizer and zero_grad."""
    import torch

    clock = clock or PhaseClock(False, False)

    cfg, lm = build_lm(model, device)
    module = wrap_with_loss(lm)
    module.to_empty(device=device)
    materialise_(module, cfg, device)
    cuda = device.startswith("cuda")
    opt = torch.optim.AdamW(module.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, fused=cuda)

    def step(x, y):
        clock.start()
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16):
            loss = module(x, y)
        clock.mark("forward")
        loss.backward()
        clock.mark("backward")
        torch.nn.utils.clip_grad_norm_(module.parameters(), CLIP)
        clock.mark("clip")
        opt.step()
        clock.mark("optimizer")
        opt.zero_grad(set_to_none=True)
        clock.mark("zero_grad")
        return loss.detach()

    return cfg, opt, step


def run_resident(args, emit) -> None:
    """One GPU: plain training (resident_trainer). Several: FSDP2 without offload."""
    ranks = Ranks.from_env(args.device)
    if ranks.world > 1:
        run_fsdp2(args, emit, ranks, offload=False)
        return
    clock = PhaseClock(getattr(args, "phases", False), ranks.device.startswith("cuda"))
    cfg, _, step = resident_trainer(args.model, ranks.device, clock)
    time_batches("resident", args, ranks, cfg.vocab_size, step, emit,
                 {"optimizer": "torch AdamW fused" if ranks.device.startswith("cuda") else "torch AdamW"}, clock=clock)


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

    clock = PhaseClock(getattr(args, "phases", False), cuda)

    def step(x, y):
        clock.start()
        loss = module(x, y)
        clock.mark("forward")
        loss.backward()
        clock.mark("backward")
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        clock.mark("clip")
        try:
            state["opt"].step()
        except (RuntimeError, NotImplementedError) as exc:  # fused AdamW over these DTensors not available
            log(f"fsdp2: fused AdamW failed ({str(exc).splitlines()[0][:120]}); using foreach")
            state["opt"] = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, foreach=True)
            state["kind"] = f"torch AdamW foreach ({where})"
            state["opt"].step()
        clock.mark("optimizer")
        state["opt"].zero_grad(set_to_none=True)
        clock.mark("zero_grad")
        return loss.detach()

    def emit_kind(row):
        emit({**row, "optimizer": state["kind"], "implementation": "FSDP2" + (" CPUOffloadPolicy" if offload else "")})

    try:
        time_batches("fsdp2-offload" if offload else "resident", args, ranks, cfg.vocab_size, step, emit_kind,
                     clock=clock)
    finally:
        dist.destroy_process_group()


# DeepSpeed's ZeRO settings of the measured runs, by stage: ZeRO-2 offloads the optimizer (bf16 weights stay on
# the GPU); ZeRO-3 offloads parameters too (bf16 partitions in pinned host memory, fetched per module). Bucket
# sizes as slidedp.peers.systems.ZERO_BUCKET_PARAMS says; every other stage-3 key at DeepSpeed's default.
DEEPSPEED_STAGES = {"deepspeed-offload": 2, "deepspeed-zero3-offload": 3}


def deepspeed_config(stage: int) -> dict:
    """The DeepSpeed config a measured run passes to ``deepspeed.initialize`` (bf16, global clipping, AdamW on
    the CPU; micro batch 1 is what the engine is told, the batch is the tensor's first dimension)."""
    from slidedp.peers.systems import ZERO_BUCKET_PARAMS

    if stage not in (2, 3):
        raise ValueError(f"ZeRO stage {stage} is not a measured peer (2 or 3)")
    zero = {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": ZERO_BUCKET_PARAMS}
    if stage == 2:
        zero["allgather_bucket_size"] = ZERO_BUCKET_PARAMS
    else:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
            "bf16": {"enabled": True}, "gradient_clipping": CLIP,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                      "weight_decay": 0.0}},
            "zero_optimization": zero}


def run_deepspeed_offload(args, emit, system: str = "deepspeed-offload") -> None:
    """DeepSpeed ZeRO-Offload at ``system``'s stage (DEEPSPEED_STAGES): the model built on the GPU as every peer
    builds it, then handed to ``deepspeed.initialize``, which partitions it (and at stage 3 moves the bf16
    partitions to pinned host memory)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(args.port))):
        os.environ.setdefault(key, value)  # torchrun sets them for several ranks
    import deepspeed

    stage = DEEPSPEED_STAGES[system]
    ranks = Ranks.from_env(args.device)
    cfg, lm = build_lm(args.model, ranks.device)
    module = wrap_with_loss(lm)
    module.to_empty(device=ranks.device)
    materialise_(module, cfg, ranks.device)
    if stage == 3:  # the loss reads the head's weight outside the head's own forward (DeepSpeed's documented rule)
        deepspeed.zero.register_external_parameter(module, lm.lm_head.weight)
    t0 = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                           config=deepspeed_config(stage))
    log(f"{system}: initialize (incl. CPU Adam JIT build) {time.perf_counter() - t0:.1f} s")

    clock = PhaseClock(getattr(args, "phases", False), ranks.device.startswith("cuda"))

    def step(x, y):
        clock.start()
        loss = engine(x, y)
        clock.mark("forward")
        engine.backward(loss)
        clock.mark("backward")
        engine.step()
        clock.mark("optimizer")
        return loss.detach()

    offloaded = "offload_optimizer cpu" + (", offload_param cpu" if stage == 3 else "")
    # ZeRO-3 records its module trace in the first step and runs the second slow too (c44: 3.4, 4.2, then 0.85 s
    # a step), so its steady step starts at the third.
    time_batches(system, args, ranks, cfg.vocab_size, step, emit,
                 {"optimizer": f"DeepSpeedCPUAdam (ZeRO-{stage} {offloaded})", "deepspeed": deepspeed.__version__},
                 clock=clock, warmup=2 if stage == 3 else 1)


# Out of memory at the tuned policy: tune again for slidedp.problem.REPLAN_BUDGET_FRACTION of the budget, at most
# OOM_ATTEMPTS plans in all, and say so in the row. Both SlideDP drivers follow it.
OOM_ATTEMPTS = 3


def plan_budgets(budget):
    """The budgets SlideDP is planned for, one per attempt: the budget, then REPLAN_BUDGET_FRACTION of the last."""
    from slidedp.problem import REPLAN_BUDGET_FRACTION

    return [replace(budget, gpu_bytes=budget.gpu_bytes * REPLAN_BUDGET_FRACTION ** i) for i in range(OOM_ATTEMPTS)]


def run_slidedp(args, emit, system: str = "slidedp") -> None:
    """One `slidedp train` run per batch, a fresh process each, as the peers' batches are. With
    ``--slidedp-in-process`` (one GPU, exact state only): the streaming runtime in this process on one pinned fp32
    host state reused by every batch. That saves the state's set-up, but on the H100 (2026-12-06, c14) the second
    batch measured that way updated on the CPU at half its machine's rate, for no cause found (RESULTS, c19)."""
    in_process = getattr(args, "slidedp_in_process", False)
    if not in_process or args.gpus > 1 or variant_space(system).states != ("fp32",):
        run_slidedp_train(args, emit, system)
        return
    import torch

    from benchmarks.streaming_measure import StreamingModel, measure_policy, save_run_dir
    from slidedp.hardware import GIB, load_hardware
    from slidedp.problem import resolve_budget
    from slidedp.runtime.device import Device, cuda_memory_gib
    from slidedp.tune import tune

    hw = load_hardware(args.profile)
    budget = resolve_budget(hw, args.slidedp_gpu_budget, hw.host.memory_gib, cuda_memory_gib(args.device))
    sm = StreamingModel.open(args.model, Device(args.device), log)
    runs = Path(args.out) / "slidedp_runs"
    after_oom = BatchesAfterOom()
    for batch in args.batches:
        if after_oom.skips(batch):
            emit({"system": system, "model": args.model, "seq": args.seq, "batch": batch, "status": SKIPPED_AFTER_OOM})
            continue
        row, oom = None, []
        for plan_budget in plan_budgets(budget):  # again for less after running out of memory
            tuned = tune(sm.spec, hw, args.seq, batch, plan_budget, variant_space(system), refine_top=4)
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
            after_oom.ran_out(batch)
            continue
        row.update(system=system, predicted_gpu_peak_gib=tuned.best.memory.gpu_peak / GIB,
                   planned_gpu_budget_gib=plan_budget.gpu_bytes / GIB, oom_retries=oom,
                   optimizer=_optimizer_label(tuned.best.policy))
        save_run_dir(runs, f"{model_label(args.model)}-s{args.seq}-b{batch}-{system}", row, trace, sm.spec)
        emit(row)
    sm.close()


def _optimizer_label(policy) -> str:
    """What updates the weights under ``policy``: the row's ``optimizer`` field."""
    held = " + GPU AdamW for held units" if policy.gpu_state_units else ""
    return f"SlideDP one-pass CPU AdamW, {policy.state} host state{held}"


def run_slidedp_train(args, emit, system: str) -> None:
    """`slidedp train --nproc N` per batch (one shared host state for all ranks), with the policy `slidedp
    tune` picks for N GPUs in ``system``'s search space; the row comes from the run directory's summary."""
    from benchmarks.common import train_run
    from slidedp.errors import OutOfGpuMemory
    from slidedp.hardware import GIB, load_hardware
    from slidedp.model_spec import load_model_spec
    from slidedp.problem import resolve_budget
    from slidedp.runtime.device import cuda_memory_gib
    from slidedp.tune import tune

    hw = load_hardware(args.profile).with_gpus(args.gpus)
    spec = load_model_spec(args.model)
    budget = resolve_budget(hw, args.slidedp_gpu_budget, hw.host.memory_gib, cuda_memory_gib(args.device))
    runs = Path(args.out) / "slidedp_runs"
    runs.mkdir(parents=True, exist_ok=True)
    after_oom = BatchesAfterOom()
    for batch in args.batches:
        base = {"system": system, "model": args.model, "seq": args.seq, "batch": batch,
                "tokens_per_step": batch * args.seq, "gpus": args.gpus}
        if after_oom.skips(batch):  # larger batches need more memory still: rows, not runs
            emit({**base, "status": SKIPPED_AFTER_OOM})
            continue
        oom: list[str] = []
        for attempt, plan_budget in enumerate(plan_budgets(budget)):  # again for less after an out-of-memory
            try:
                policy = tune(spec, hw, args.seq, batch, plan_budget, variant_space(system), refine_top=2).best.policy
            except Exception as exc:  # noqa: BLE001 - a batch that does not divide or fit is a row, not a crash
                code, s = None, None
                status = "oom" if oom else f"not tuned ({str(exc).splitlines()[0][:160]})"
                break
            label = f"{model_label(args.model)}-s{args.seq}-b{batch}-g{args.gpus}-{system}" + \
                (f"-retry{attempt}" if attempt else "")  # a run directory of its own per attempt
            policy_path = runs / f"{label}.yaml"
            policy.save(policy_path)
            code, s = train_run(args.model, args.seq, policy_path, args.steps, runs / label, batch=batch,
                                nproc=args.gpus, hardware=args.profile,
                                device="auto" if args.device.startswith("cuda") else "cpu")
            status = "ok" if code == 0 and s is not None else f"failed (exit {code})"
            if code != OutOfGpuMemory.exit_code:
                break
            oom.append(f"{plan_budget.gpu_bytes / GIB:.0f} GiB budget: out of GPU memory")
            status = "oom"
        if status != "ok":
            emit({**base, "status": status, **({"error": " | ".join(oom)} if oom else {}),
                  **({"policy": policy.to_dict()} if code is not None else {})})
            if status == "oom":
                after_oom.ran_out(batch)
            continue
        emit({**base, "status": "ok", "policy": s.policy, "step_time_s": s.step_time_s,
              "tokens_per_s": s.tokens_per_s, "model_tflops": s.model_tflops_per_gpu * args.gpus,
              "gpu_peak_gib": s.gpu_peak_gib or float("nan"), "host_rss_peak_gib": s.host_rss_peak_gib,
              "limiter": s.limiter, "predicted_step_time_s": s.predicted_step_time_s,
              "predicted_limiter": s.predicted_limiter if "predicted_limiter" in s.given else "",
              "final_loss": s.final_loss, "planned_gpu_budget_gib": plan_budget.gpu_bytes / GIB, "oom_retries": oom,
              "optimizer": _optimizer_label(policy)})


WORKERS = {**{name: (lambda args, emit, name=name: run_slidedp(args, emit, name)) for name in VARIANT_SPACES},
           "fsdp2-offload": run_fsdp2_offload,
           **{name: (lambda args, emit, name=name: run_deepspeed_offload(args, emit, name))
              for name in DEEPSPEED_STAGES},
           "resident": run_resident,
           # Other projects' programs, run from the ignored .peers folder (benchmarks.peer_external).
           **{name: (lambda args, emit, peer=peer: run_external_peer(args, emit, peer))
              for name, peer in EXTERNAL.items()}}


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
