"""SlideDP against what users would pick instead, on one GPU, one model, one batch sweep, in one invocation.

    python -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 2 4 8 16 --out DIR

Systems (benchmarks/peer_systems.py; each in its own process, run one after another so they never share the
GPU or host memory):
  slidedp            this runtime, policy from `slidedp tune` for each batch (profile --profile); the tuner may
                     hold leading units' optimizer state in spare GPU memory (Policy.gpu_state_units)
  slidedp-host       the same with every optimizer state on the host (`slidedp tune --no-gpu-state`): the
                     like-for-like setting against peers that offload the whole optimizer
  slidedp-compact    slidedp-host in the compact bf16+int8 host state (`--state bf16+int8`), run through
                     `slidedp train` per batch (the variants' search spaces: benchmarks/our_variants.py)
  slidedp-int8       the same with fp32 master weights and int8 moments (`--state fp32+int8`)
  fsdp2-offload      PyTorch FSDP2 `fully_shard` with CPUOffloadPolicy + bf16 MixedPrecisionPolicy, torch
                     AdamW on the CPU (fused kernel where DTensor allows it, foreach otherwise)
  deepspeed-offload  DeepSpeed ZeRO-2 with offload_optimizer cpu (DeepSpeedCPUAdam), bf16
  deepspeed-zero3-offload
                     DeepSpeed ZeRO-3 with offload_optimizer and offload_param cpu: bf16 partitions in
                     pinned host memory, fetched per module in forward and again in backward
  resident           plain GPU-resident training: fp32 weights on the GPU, bf16 autocast, fused AdamW
  slideformer        SlideFormer's own multi_gpu/scripts/main_dp.py on one GPU, run as an external program from
                     --peers-dir (benchmarks.peer_external; its differences from the setup below are in each row)
  megatrain          MegaTrain's own examples/sft/train.py (package infinity) likewise

With --gpus N every system runs N ranks on one host at the same global batch: SlideDP through
`slidedp train --nproc N` (one shared host state), the peers under torchrun (GPU-resident becomes FSDP2
without offload). Host memory is summed over the peers' ranks; SlideDP's is rank 0's RSS, since its ranks
map one shared state (summing would count it N times).

Every system trains the same transformers model (random init, SDPA attention) with per-layer activation
checkpointing, the same chunked cross-entropy (4096-token chunks, logits recomputed per chunk in backward,
so no system materialises the full logits), AdamW (lr 1e-5, betas 0.9/0.95) and global clipping at 1.0.
Batch = one micro-batch of `batch` sequences. Step time is wall clock around one full optimizer step with
`torch.cuda.synchronize()` at both ends (the CPU optimizer is part of the step), the median of the steps
after the first. Model TFLOP/s = `ModelSpec.train_flops_per_token(seq)` x tokens / step time
(3 x forward FLOPs: 2 x params x tokens for every linear incl. the LM head, plus causal attention; recompute
not counted). A batch that runs out of GPU memory is recorded as "oom" and larger batches are skipped.

Writes results.jsonl (one row per system x batch, appended as they finish), table.md, peer_compare.png/.svg
(built by slidedp.report.peers, which reads any session's rows), and one archive of raw outputs,
slidedp_runs.tar.gz (our runs as run directories for `slidedp validate`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.common import append_jsonl, log, pack, read_jsonl, run_in_own_session
from benchmarks.peer_external import DEFAULT_PEERS_DIR
from benchmarks.peer_systems import WORKERS
from slidedp.report.peers import OURS, SYSTEMS, load_rows, plot, table_markdown, title_for


def collate(out: Path, include: list[str] | None = None, device: str = "cuda") -> None:
    rows = load_rows(out)
    for path in include or []:  # other invocations' results (e.g. a second model), for one table and figure
        rows += read_jsonl(Path(path))
    if not rows:
        log("no results to collate")
        return
    (out / "table.md").write_text(table_markdown(rows))
    plot(rows, out, title_for(device))
    runs = out / "slidedp_runs"
    if runs.is_dir():
        pack(out / "slidedp_runs.tar.gz", [(runs, "slidedp_runs")])
    log((out / "table.md").read_text())


def drive(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    start = time.perf_counter()
    for i, system in enumerate(args.systems):
        launcher = [sys.executable]
        if args.gpus > 1 and system not in OURS:  # slidedp train --nproc launches its own ranks
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.gpus)]
        # As a module (torchrun's -m too), so the worker imports benchmarks.* as this driver does.
        cmd = [*launcher, "-m", "benchmarks.peer_compare", "--worker", system, "--model", args.model,
               "--seq", str(args.seq), "--batches", *map(str, args.batches), "--steps", str(args.steps),
               "--out", str(out), "--device", args.device, "--profile", args.profile, "--port", str(args.port + i),
               "--gpus", str(args.gpus), "--peers-dir", str(args.peers_dir),
               "--batch-timeout", str(args.batch_timeout),
               "--peer-inputs", str(args.peer_inputs or out / "peer_inputs")] + (["--phases"] if args.phases else [])
        if args.slidedp_gpu_budget is not None:
            cmd += ["--slidedp-gpu-budget", str(args.slidedp_gpu_budget)]
        if args.slidedp_in_process:
            cmd += ["--slidedp-in-process"]
        log(f"=== {system}: {' '.join(cmd[1:])}")
        t0 = time.perf_counter()
        limit = min(args.timeout, args.deadline - (time.perf_counter() - start))
        started = limit >= 30
        code = run_in_own_session(cmd, limit) if started else None  # its `slidedp train` runs end with it
        status = f"exit {code}" if code is not None else f"stopped at its time limit ({limit:.0f} s)" if started \
            else f"not started: {max(limit, 0):.0f} s of --deadline left, under the 30 s a system needs"
        log(f"=== {system}: {status} in {time.perf_counter() - t0:.1f} s")
        done = {(r["system"], r["batch"]) for r in load_rows(out)}
        for batch in args.batches:
            if (system, batch) not in done:
                append_jsonl(results, {"system": system, "model": args.model, "seq": args.seq, "batch": batch,
                                       "status": f"not run ({status})"})
    collate(out, device=args.device)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-4b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--steps", type=int, default=3, help="steps per batch; the first is warm-up")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--profile", default="h200-x1", help="hardware profile the tuner and simulator use")
    p.add_argument("--device", default="cuda")
    p.add_argument("--gpus", type=int, default=1, help="GPUs (ranks) per system; the batch is global")
    p.add_argument("--timeout", type=float, default=300, help="seconds per system at most")
    p.add_argument("--deadline", type=float, default=3600, help="seconds for the whole invocation at most")
    p.add_argument("--port", type=int, default=29611)
    p.add_argument("--slidedp-gpu-budget", type=float, metavar="GIB",
                   help="GPU memory the SlideDP tuner may plan for (default: its usual fraction of the GPU)")
    p.add_argument("--slidedp-in-process", action="store_true",
                   help="measure SlideDP's exact-state variants on one GPU in the worker's own process, on one host "
                        "state shared by every batch (saves its set-up per batch). Default: each batch is a fresh "
                        "`slidedp train` run, as each of the peers' batches is a fresh process")
    p.add_argument("--phases", action="store_true",
                   help="also time each phase of the peers' steps (synchronises at every phase: diagnosis only)")
    p.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR),
                   help="where benchmarks.peer_external_setup laid out the external peers' sources")
    p.add_argument("--batch-timeout", type=float, default=240,
                   help="seconds per batch at most for an external peer's run")
    p.add_argument("--peer-inputs", help="where the external peers' inputs (a checkpoint of the model) are prepared "
                   "and kept (default OUT/peer_inputs; keep it out of a folder that is copied back)")
    p.add_argument("--out", default="peer_results")
    p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--collate", action="store_true", help="only rebuild table and plot from --out")
    p.add_argument("--include", nargs="*", help="with --collate: more results.jsonl files to merge in")
    args = p.parse_args()
    if args.collate:
        collate(Path(args.out), args.include, args.device)
        return 0
    if args.worker is None:
        return drive(args)
    results = Path(args.out) / "results.jsonl"

    def emit(row: dict) -> None:
        append_jsonl(results, row)
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                 if k in ("system", "batch", "status", "step_time_s", "tokens_per_s", "model_tflops", "gpu_peak_gib",
                          "host_rss_peak_gib", "predicted_step_time_s", "limiter", "predicted_limiter", "error",
                          "phase_s")}
        log(f"  {shown}")

    WORKERS[args.worker](args, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
