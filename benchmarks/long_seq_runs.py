"""Sequence-length sweep of `slidedp train` on one GPU for a Qwen3-14B-shaped model.

    python -m benchmarks.long_seq_runs --layers 8 --seqs 32768 65536 131072 262144 --out DIR

The model is Qwen3-14B's width (hidden 5120, MLP 17408, 40 heads, 8 KV heads, vocab 151936) at reduced
depth: a full 14.8 B-parameter model needs 206 GB of host state at 14 B/param, more than the lent host's
128 GiB, while every per-layer quantity that decides whether a sequence fits on the GPU (one layer's
recompute working set, the logits chunk, the per-layer checkpoint) is the same as the full model's; only
the number of checkpoints (one per layer) scales with depth and is reported. Each sequence runs as its own
`slidedp train` process (preflight, policy recompute, micro-batch 1, synthetic tokens, no checkpoint), and
DIR/results.jsonl collects each run's summary; run directories (without traces) go into DIR/long_seq.tar.gz.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common import append_jsonl, pack, train_run
from slidedp.presets.models import MODEL_PRESETS

POLICY = "activation: recompute\nmicro_batch: 1\naccumulation: 1\nchunks_per_layer: 8\nprefetch_depth: 2\n"


def model_config(base: str, layers: int, max_seq: int) -> dict:
    cfg = dict(MODEL_PRESETS[base]) if base in MODEL_PRESETS else json.loads(Path(base).read_text())
    cfg.update(num_hidden_layers=layers, max_position_embeddings=max(max_seq, cfg.get("max_position_embeddings", 0)))
    return cfg


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="qwen3-14b", help="preset or config.json whose width is kept")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seqs", type=int, nargs="+", default=[32768, 65536, 131072, 262144])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--hardware", default="h200-x1")
    p.add_argument("--gpu-budget", type=float, default=130.0, help="GiB (the H200 has 139 GiB)")
    p.add_argument("--deadline", type=float, default=1e9, help="start no run after this many seconds")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="long_seq")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = out / f"{Path(args.base).stem}-shaped-{args.layers}l.json"
    config.write_text(json.dumps(model_config(args.base, args.layers, max(args.seqs))))
    policy = out / "recompute.yaml"
    policy.write_text(POLICY)
    start = time.perf_counter()
    results = out / "results.jsonl"
    for seq in args.seqs:
        run = out / f"run{seq}"
        if time.perf_counter() - start > args.deadline:
            append_jsonl(results, {"seq": seq, "status": "not run (deadline)"})
            continue
        t0 = time.perf_counter()
        code, summary = train_run(str(config), seq, policy, args.steps, run, hardware=args.hardware,
                                  device=args.device, extra=("--gpu-budget", str(args.gpu_budget)))
        row = {"seq": seq, "layers": args.layers, "exit": code, "wall_s": time.perf_counter() - t0}
        if summary is not None:
            row.update(summary.to_dict(), status="ok")
        else:
            row["status"] = f"failed (exit {code})"
        append_jsonl(results, row)
        (run / "trace.parquet").unlink(missing_ok=True)  # keep the transfer small
    pack(out / "long_seq.tar.gz", [(run, run.name) for run in sorted(out.glob("run*"))])
    return 0


if __name__ == "__main__":
    sys.exit(main())
