"""The smallest GPU that holds a GPU-resident training step: the allocator's fragmentation under pressure.

    python -m benchmarks.gpu_fit_probe --out DIR [--model qwen3-4b] [--seq 4096] [--batches 1 2 4 8] [--steps 2]

Why: ``torch.cuda.max_memory_allocated`` (what the peers' memory model predicts) is not what must fit on the card.
Qwen3-4B at batch 8 allocates 74.2 GiB at its peak (H200) and still ran out of an H100's 79.2 GiB (c42, 2026-12-07):
the caching allocator's free blocks inside segments it cannot release are the difference. Unconstrained, its
reserved peak says little (it keeps whatever it cached, 8-27 GiB above the allocated peak); under pressure it frees
what it can and retries. So, per batch, this probe bisects ``torch.cuda.set_per_process_memory_fraction`` for the
smallest cap under which ``--steps`` steps run from an emptied cache (the weights and AdamW moments allocated first,
as in a fresh run; the gradients are freed between steps) and reports it beside the allocated peak: ``needed -
allocated`` is the fragmentation a card must hold on top of what the memory model counts. ``--deadline`` also stops
a bisection under way (the row then says its cap is an upper bound).

Runs the peers' GPU-resident system (benchmarks.peer_systems.resident_trainer: fp32 weights, bf16 autocast, the
chunked loss, fused AdamW, clip). One row per batch in DIR/fit_probe.jsonl.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

from benchmarks.common import append_jsonl, log, oom_fields, require_cuda, synthetic_tokens
from benchmarks.peer_systems import resident_trainer

GIB = 2**30


def smallest_cap(try_cap, low: float, high: float, resolution: float,
                 out_of_time=lambda: False) -> tuple[float, int, bool]:
    """The smallest cap in (low, high] for which ``try_cap(cap)`` is True, to ``resolution``, assuming it is
    monotone and ``high`` known to pass. Returns it, the number of trials, and whether the resolution was reached
    (False: ``out_of_time()`` stopped the bisection; the cap is then an upper bound)."""
    trials = 0
    while high - low > resolution:
        if out_of_time():
            return high, trials, False
        mid = (low + high) / 2
        trials += 1
        if try_cap(mid):
            high = mid
        else:
            low = mid
    return high, trials, True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="qwen3-4b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--steps", type=int, default=2, help="steps per trial (the second runs on the first's cache)")
    p.add_argument("--resolution", type=float, default=0.25, help="GiB to which the cap is bisected")
    p.add_argument("--deadline", type=float, default=300, help="seconds for the whole probe at most")
    args = p.parse_args(argv)
    require_cuda("gpu_fit_probe")
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    total = torch.cuda.get_device_properties(0).total_memory
    cfg, opt, step = resident_trainer(args.model, "cuda")

    # The moments exist from the first step on: allocate them unconstrained, as in a run's first step.
    tokens = synthetic_tokens(cfg.vocab_size, 1, args.seq).cuda()
    step(tokens[:, :-1], tokens[:, 1:])
    torch.cuda.synchronize()
    persistent = torch.cuda.memory_allocated()
    free, device_total = torch.cuda.mem_get_info()
    context = device_total - free - torch.cuda.memory_reserved()
    for batch in args.batches:
        if time.monotonic() - t_start > args.deadline:
            append_jsonl(out / "fit_probe.jsonl", {"model": args.model, "seq": args.seq, "batch": batch,
                                                   "status": "not started"})
            continue
        tokens = synthetic_tokens(cfg.vocab_size, batch, args.seq).cuda()
        x, y = tokens[:, :-1], tokens[:, 1:]

        last_oom: dict[str, float] = {}

        def fits(cap_bytes: float, x=x, y=y, last_oom=last_oom) -> bool:
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total))
            torch.cuda.reset_peak_memory_stats()
            try:
                for _ in range(args.steps):
                    step(x, y)
                torch.cuda.synchronize()
                return True
            except torch.OutOfMemoryError as exc:
                last_oom.clear()
                last_oom.update(oom_fields(str(exc)))
                return False
            finally:
                gc.collect()  # nothing of a failed step may hold memory into the next trial

        # Unconstrained first: the allocated peak (the bisection's lower bound) and the reserved peak.
        free_run = fits(total)
        allocated = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
        row = {"model": args.model, "seq": args.seq, "batch": batch, "card_gib": total / GIB,
               "persistent_gib": persistent / GIB, "context_gib": context / GIB}
        if not free_run:
            row.update(status="oom", note="out of memory with the whole card", **last_oom)
        else:
            needed, trials, exact = smallest_cap(fits, allocated, total, args.resolution * GIB,
                                                 lambda: time.monotonic() - t_start > args.deadline)
            row.update(status="ok" if exact else "ok (deadline: needed is an upper bound)",
                       allocated_peak_gib=allocated / GIB, reserved_peak_gib=reserved / GIB,
                       needed_gib=needed / GIB, fragmentation_gib=(needed - allocated) / GIB,
                       transient_gib=(allocated - persistent) / GIB, trials=trials)
        torch.cuda.set_per_process_memory_fraction(1.0)
        log(json.dumps(row))
        append_jsonl(out / "fit_probe.jsonl", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
