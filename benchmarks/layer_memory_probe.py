"""One decoder layer's measured GPU working set against the memory model's (not a test; needs a GPU).

The memory model counts what a layer saves for its backward (ModelSpec.layer_working_bytes). A sequence-tiled
layer's backward also allocates transients over the whole sequence inside the attention's backward (flash
attention's fp32 query-gradient accumulator, the key and value gradients expanded to every query head under
grouped-query attention). This runs one layer's forward and backward through the runtime's own call
(runtime.seq_tiles.run_layer) at several lengths and tiles, and writes, per case, the peak bytes the layer
added over its weights and input against the model's count, and the per-token slope between lengths, so the
memory model can be checked per token on the card itself. With ``--snapshot`` it also dumps torch's allocator
history for the first case (torch.cuda.memory._dump_snapshot) to read the live set at the peak; with ``--live``
it records every case's history and writes the allocations live at its peak, grouped by size and by where they
were allocated (live-s<seq>-t<tile>.json), small enough to bring back and compare between lengths.

    python -m benchmarks.layer_memory_probe --model benchmarks/results/next-h200/qwen3-14b-wide-8l.json \
        --seqs 32768 65536 131072 --tiles 0 4096 --out /tmp/probe
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from runtime.hf_adapter import ModelAdapter, load_hf_config
from runtime.seq_tiles import run_layer
from slidedp.hardware import GIB
from slidedp.model_spec import ModelSpec


def layer_peak(adapter: ModelAdapter, seq: int, tile: int, device: torch.device) -> dict:
    """Peak bytes one layer's forward + backward adds over its weights and its input, for one sequence."""
    unit = next(u for u in adapter.units if u.kind == "layer")
    layer = adapter.layer_module(unit)
    gen = torch.Generator(device=device).manual_seed(0)
    params = {p.name: (0.02 * torch.randn(p.shape, generator=gen, device=device)).to(torch.bfloat16)
              .requires_grad_() for p in unit.params}
    rotary = adapter.rotary(device)
    pos = torch.arange(seq, device=device)[None]
    x = (torch.randn(1, seq, adapter.config.hidden_size, generator=gen, device=device)).to(torch.bfloat16)
    x.requires_grad_()
    pe = rotary(torch.empty(1, dtype=torch.bfloat16, device=device), pos)
    kwargs = {"attention_mask": None, "position_embeddings": pe, "position_ids": pos}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = run_layer(layer, params, x, kwargs, tile)
    after_forward = torch.cuda.memory_allocated() - base
    grad = torch.ones_like(out)
    out.backward(grad)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out, grad, params, x
    torch.cuda.empty_cache()
    return {"peak_bytes": peak, "saved_after_forward_bytes": after_forward}


# C++ frames of the allocation itself, not of the operator that asked for the memory.
_ALLOCATOR_FRAMES = ("Allocator", "torch::unwind", "CapturedTraceback", "gather_with_cpp", "at::detail::empty",
                     "empty_strided", "at::empty", "_ops::empty", "native::empty")


def live_at_peak(snapshot: dict, frames: int = 6) -> dict:
    """Replay an allocator history (torch.cuda.memory._snapshot()) and return the allocations live when the
    allocated bytes peaked: total and rows of (bytes, count, where), the largest first. ``where`` is the
    innermost ``frames`` Python frames outside torch's own files, so a row names the code that asked."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for event in snapshot["device_traces"][0]:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            py = [f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in event["frames"]
                  if "/torch/" not in f["filename"] and f["filename"].endswith(".py")]
            # Allocations on autograd's thread have no Python frames: name the C++ operators instead, past the
            # allocator's own frames (c26: the unwinder, the traceback and empty_cuda filled all six).
            cpp = [f["name"][:80] for f in event["frames"] if not f["filename"].endswith(".py")
                   and not any(k in f["name"] for k in _ALLOCATOR_FRAMES)
                   and not f["name"].startswith(("c10::", "std::", "??"))]
            live[addr] = (size, " < ".join((py or cpp)[:frames]))
            total += size
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action in ("free_requested", "free_completed") and addr in live:  # allocated stats drop at the first
            total -= live.pop(addr)[0]
    rows: dict[tuple[int, str], int] = {}
    for size, where in at_peak.values():
        rows[(size, where)] = rows.get((size, where), 0) + 1
    ordered = sorted(rows.items(), key=lambda kv: -kv[0][0] * kv[1])
    return {"peak_bytes": peak, "rows": [{"bytes": size, "count": n, "where": where} for (size, where), n in ordered]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="preset or config.json (one layer of it is run)")
    p.add_argument("--seqs", type=int, nargs="+", default=[32768, 65536, 131072])
    p.add_argument("--tiles", type=int, nargs="+", default=[0, 4096])
    p.add_argument("--snapshot", action="store_true", help="dump the allocator history of the first case")
    p.add_argument("--live", action="store_true", help="write every case's live allocations at its peak")
    p.add_argument("--out", default="layer_memory_probe")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("layer_memory_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    cfg = load_hf_config(args.model)
    cfg.num_hidden_layers = 1
    adapter = ModelAdapter(cfg)
    spec = ModelSpec.from_hf_config(cfg.to_dict(), name=Path(args.model).stem)
    rows = []
    for tile in args.tiles:
        for seq in args.seqs:
            snap = args.snapshot and not rows
            if snap or args.live:
                torch.cuda.memory._record_memory_history(max_entries=200000)
            try:
                measured = layer_peak(adapter, seq, tile, device)
                status = "ok"
            except torch.OutOfMemoryError as exc:
                measured, status = {}, f"oom: {str(exc).splitlines()[0][:160]}"
                torch.cuda.empty_cache()
            if args.live:
                live = live_at_peak(torch.cuda.memory._snapshot())
                (out / f"live-s{seq}-t{tile}.json").write_text(json.dumps(live, indent=1))
            if snap:
                torch.cuda.memory._dump_snapshot(str(out / f"snapshot-s{seq}-t{tile}.pickle"))
            if snap or args.live:
                torch.cuda.memory._record_memory_history(enabled=None)
            modelled = spec.layer_working_bytes(seq, tile)
            row = {"model": spec.name, "seq": seq, "tile": tile, "status": status,
                   "model_working_bytes": modelled, **measured}
            if measured:
                row["measured_over_model"] = measured["peak_bytes"] / modelled
            rows.append(row)
            print(json.dumps(row), flush=True)
    # Per-token slopes between consecutive lengths of a tile: what a longer sequence adds per token.
    for tile in args.tiles:
        ok = [r for r in rows if r["tile"] == tile and r["status"] == "ok"]
        for a, b in zip(ok, ok[1:], strict=False):
            slope = (b["peak_bytes"] - a["peak_bytes"]) / (b["seq"] - a["seq"])
            model = (b["model_working_bytes"] - a["model_working_bytes"]) / (b["seq"] - a["seq"])
            rows.append({"tile": tile, "between": [a["seq"], b["seq"]], "measured_bytes_per_token": slope,
                         "model_bytes_per_token": model})
            print(f"tile {tile}: {a['seq']}->{b['seq']}: measured {slope:,.0f} B/token, model {model:,.0f} "
                  f"B/token; peak at {b['seq']}: {b['peak_bytes'] / GIB:.2f} GiB measured, "
                  f"{b['model_working_bytes'] / GIB:.2f} modelled", flush=True)
    with open(out / "probe.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
