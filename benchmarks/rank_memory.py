"""Host memory of a group of data-parallel ranks against one rank (#18): one host state shared by all ranks.

For each rank count N, ``slidedp train`` runs N ranks on one machine (``--ranks-per-gpu N`` on one GPU, or on the
CPU) at the same global batch, and the run's summary gives every rank's peak RSS and end-of-run PSS. RSS counts
the mapped shared state in every rank; PSS splits shared pages between the ranks that map them, so the PSS sum
is what the group really holds. Written beside the numbers: the host state's size by the memory model, so a
reader sees "one copy plus per-rank overhead", not "N copies".

    python -m benchmarks.rank_memory --model qwen3-0.6b --ranks 1 2 3 --device cuda --out DIR

Writes DIR/results.jsonl (one row per N) and prints a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import append_jsonl, exit_code, train_run
from slidedp.hardware import GIB
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy


def measure(model: str, ranks: int, seq: int, batch: int, steps: int, device: str, out: Path) -> dict:
    """One run of ``ranks`` ranks sharing the machine (and its one GPU) at global batch ``batch``."""
    policy = Policy(micro_batch=1, accumulation=batch // ranks, chunks_per_layer=2)
    path = out / f"policy-{ranks}.yaml"
    policy.save(path)
    extra = ("--log", "none", "--ranks-per-gpu", str(ranks)) if device.startswith("cuda") and ranks > 1 else \
        ("--log", "none")
    rc, summary = train_run(model, seq, path, steps, out / f"ranks{ranks}", batch=batch, nproc=ranks,
                            device=device, extra=extra)
    row = {"ranks": ranks, "rc": rc, "model": model, "seq": seq, "batch": batch}
    if summary is not None:
        rss, pss = summary.host_rss_peak_gib_by_rank or [], summary.host_pss_gib_by_rank or []
        state = summary.host_state_bytes_per_param or 0.0
        params = ModelSpec(**summary.model_spec).total_params if summary.model_spec else 0
        row.update(step_time_s=summary.step_time_s, rss_gib_by_rank=rss, pss_gib_by_rank=pss,
                   rss_sum_gib=sum(rss), pss_sum_gib=sum(pss), state_gib=state * params / GIB)
    append_jsonl(out / "results.jsonl", row)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-0.6b", help="preset or config.json")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=6, help="global batch (divisible by every rank count)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    bad = [n for n in args.ranks if n < 1 or args.batch % n]
    if bad:
        print(f"rank_memory: error: --batch {args.batch} is not divisible by rank count(s) {bad}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [measure(args.model, n, args.seq, args.batch, args.steps, args.device, args.out) for n in args.ranks]
    print(f"{'ranks':>5} {'state GiB':>9} {'RSS sum':>8} {'PSS sum':>8}  PSS by rank (GiB)")
    for r in rows:
        if "pss_sum_gib" in r:
            by_rank = " ".join(f"{v:.2f}" for v in r["pss_gib_by_rank"])
            sizes = f"{r['state_gib']:>9.2f} {r['rss_sum_gib']:>8.2f} {r['pss_sum_gib']:>8.2f}"
            print(f"{r['ranks']:>5} {sizes}  {by_rank}")
        else:
            print(f"{r['ranks']:>5} exit {r['rc']}")
    return exit_code(rows, "ranks")


if __name__ == "__main__":
    sys.exit(main())
