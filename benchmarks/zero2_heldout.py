"""ZeRO-2-Offload on models and sequence lengths the peer model was not shaped on: predictions first, then the check.

    python -m benchmarks.zero2_heldout                        # the predictions table (development machine)
    python -m benchmarks.zero2_heldout --write-configs DIR    # the held-out architectures' config.json files
    python -m benchmarks.zero2_heldout --compare DIR [DIR...] # predicted vs peer_compare's measured rows

The serial gradient offload of ``zero2-offload`` (PeerSystem.serial_grad_copy) was found by looking at the Qwen3-4B,
seq 4096 rows; these cases are the held-out check of it. Each is simulated with the shipped ``h200-x1`` profile,
nothing fitted. Measured rows come from ``benchmarks.peer_compare --systems deepspeed-offload`` (one results.jsonl
per folder), matched by the model's name (a preset, or the stem of a config written by ``--write-configs``),
sequence length and batch.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.common import log, model_label, read_jsonl
from benchmarks.peer_setup import spec_as_trained
from benchmarks.shape_validation import ARCHS
from slidedp.hardware import GIB, HardwareProfile, load_hardware
from slidedp.model_spec import ModelSpec, load_model_spec
from slidedp.peers import SYSTEMS, PeerStep, estimate_peer_memory, peer_step, simulate_peer

# (model, seq, batches): a preset name or a key of shape_validation.ARCHS.
CASES: tuple[tuple[str, int, tuple[int, ...]], ...] = (
    ("qwen3-8b", 4096, (1, 2, 4)),
    ("qwen3-1.7b", 4096, (1, 4)),
    ("qwen3-1.7b", 8192, (1, 4)),
    ("qwen3-0.6b", 4096, (1, 4)),
    ("qwen3-0.6b", 8192, (1, 4)),
    ("llama3b", 4096, (1, 2, 4)),
)
MEASURED_SYSTEM = "deepspeed-offload"


def model_spec(name: str) -> ModelSpec:
    """A preset, or one of the held-out architectures of benchmarks.shape_validation."""
    return ModelSpec.from_hf_config(ARCHS[name], name=name) if name in ARCHS else load_model_spec(name)


def predict(name: str, seq: int, batch: int, hw: HardwareProfile, spec: ModelSpec | None = None) -> dict:
    """Step time and limiter, the backward and the part of it the serial gradient offload adds, memory; ``spec``:
    the model as a measured row trained it (benchmarks.peer_setup.spec_as_trained), where that differs."""
    step = peer_step("zero2-offload", spec or model_spec(name), hw, seq, batch)
    sim = simulate_peer(step)
    trace = sim.trace
    fwd_end = trace[trace.op == "fwd"].end_s.max()
    bwd_end = trace[trace.op.isin(["bwd", "grad_sync", "d2h_grad"])].end_s.max()
    d2h = trace[trace.op == "d2h_grad"]
    mem = estimate_peer_memory(step)
    # The same step with the copies overlapping backward (the model before the serial offload), for contrast.
    overlapped = simulate_peer(PeerStep(replace(SYSTEMS["zero2-offload"], serial_grad_copy=None), step.w))
    return {"model": name, "trained_as": step.w.model.name, "seq": seq, "batch": batch, "step_s": sim.step_time_s,
            "limiter": sim.limiter, "overlapped_step_s": overlapped.step_time_s,
            "backward_s": bwd_end - fwd_end, "serial_offload_s": step.grad_sync_total_s()
            + float((d2h.end_s - d2h.start_s).sum()), "gpu_alloc_gib": mem.gpu_allocated_peak / GIB,
            "host_gib": mem.host_total_gib(), "fits_host": mem.host_total <= hw.host.memory_gib * GIB}


def predictions(hw: HardwareProfile, measured: dict | None = None) -> list[dict]:
    """Every case as configured, or, given the measured rows, as each row trained it."""
    def spec(name: str, seq: int, batch: int) -> ModelSpec | None:
        row = (measured or {}).get((name, seq, batch))
        return spec_as_trained(model_spec(name), row) if row else None

    return [predict(name, seq, b, hw, spec(name, seq, b)) for name, seq, batches in CASES for b in batches]


def measured_rows(folders: list[Path]) -> dict[tuple[str, int, int], dict]:
    rows = {}
    for folder in folders:
        for r in read_jsonl(Path(folder) / "results.jsonl"):
            if r.get("system") == MEASURED_SYSTEM:
                rows[(model_label(r["model"]), r["seq"], r["batch"])] = r
    return rows


def table(preds: list[dict], hw: HardwareProfile, measured: dict | None = None) -> str:
    head = ("| model | seq | batch | predicted s (limiter) | backward s (serial offload) | copies overlapped s | "
            "GPU GiB | host GiB |")
    if measured is not None:
        head += " measured s | error (overlapped) |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for p in preds:
        host = f"{p['host_gib']:.1f}" + ("" if p["fits_host"] else f" > {hw.host.memory_gib:.1f}: host OOM")
        line = (f"| {p['trained_as']} | {p['seq']} | {p['batch']} | {p['step_s']:.3f} ({p['limiter']}) | "
                f"{p['backward_s']:.3f} ({p['serial_offload_s']:.3f}) | {p['overlapped_step_s']:.3f} | "
                f"{p['gpu_alloc_gib']:.1f} | {host} |")
        if measured is not None:
            row = measured.get((p["model"], p["seq"], p["batch"]))
            if row is None or row.get("status") != "ok":
                line += f" {row.get('status', '-') if row else '-'} | - |"
            else:
                meas = row["step_time_s"]
                line += (f" {meas:.3f} | {100 * (p['step_s'] - meas) / meas:+.1f}% "
                         f"({100 * (p['overlapped_step_s'] - meas) / meas:+.1f}%) |")
        lines.append(line)
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="h200-x1")
    parser.add_argument("--write-configs", type=Path, metavar="DIR", help="write the held-out config.json files")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="DIR", help="peer_compare output folders")
    parser.add_argument("--json", type=Path, help="also write the predictions as JSON")
    args = parser.parse_args()
    if args.write_configs:
        args.write_configs.mkdir(parents=True, exist_ok=True)
        for name in sorted({name for name, _, _ in CASES if name in ARCHS}):
            (args.write_configs / f"{name}.json").write_text(json.dumps(ARCHS[name]))
        return 0
    hw = load_hardware(args.hardware)
    measured = measured_rows(args.compare) if args.compare else None
    preds = predictions(hw, measured)  # compared: each row as the model it trained
    if args.json:
        args.json.write_text(json.dumps(preds, indent=1))
    log(table(preds, hw, measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
