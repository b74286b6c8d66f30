"""A peer comparison's report: SlideDP's throughput against the systems users would pick instead.

The rows are what `python -m benchmarks.peer_compare` writes to results.jsonl, one per system x batch:
``system``, ``model``, ``seq``, ``batch``, ``status`` ("ok", "oom", "skipped ...", "not run ...") and, for
the runs that finished, ``tokens_per_s``, ``step_time_s``, ``model_tflops``, ``gpu_peak_gib``,
``host_rss_peak_gib`` and the simulator's ``predicted_step_time_s`` / ``predicted_limiter``. This module only
reads rows, so a table or figure can be rebuilt from any session's results without a GPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

SYSTEMS = ("slidedp", "slidedp-host", "slidedp-compact", "slidedp-int8", "fsdp2-offload", "deepspeed-offload",
           "deepspeed-zero3-offload", "resident", "slideformer", "megatrain")
# Tuned freely; every optimizer state on the host (exact fp32); the same in the compact bf16+int8 state; the same
# with fp32 master weights and int8 moments (benchmarks/our_variants.py says what each runs under).
OURS = ("slidedp", "slidedp-host", "slidedp-compact", "slidedp-int8")
PEERS = tuple(s for s in SYSTEMS if s not in OURS)
# The measured peers (benchmarks/peer_systems.py) and the simulated system (slidedp.peers.SYSTEMS) that models
# each: one GPU's "resident" run is plain training with fp32 weights, autocast and fused AdamW, DDP on one rank.
SIMULATED_AS = {"deepspeed-offload": "zero2-offload", "deepspeed-zero3-offload": "zero3-offload",
                "fsdp2-offload": "fsdp2-offload", "resident": "ddp-resident", "slideformer": "slideformer",
                "megatrain": "megatrain"}
COLORS = {"slidedp": "tab:blue", "slidedp-host": "tab:cyan", "slidedp-compact": "tab:olive",
          "slidedp-int8": "tab:gray", "fsdp2-offload": "tab:orange",
          "deepspeed-offload": "tab:green", "deepspeed-zero3-offload": "tab:pink", "resident": "tab:red",
          "slideformer": "tab:purple", "megatrain": "tab:brown"}
TITLE = "Full-parameter training throughput on {where}: SlideDP, offloading peers, GPU-resident"


def title_for(device: str) -> str:
    """The figure's title for runs on ``device`` (cpu: a functional check of the harness, not a benchmark)."""
    if device == "cpu":
        return TITLE.format(where="the CPU (a check of the harness, not a benchmark)")
    try:
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "one GPU"
    except (ImportError, RuntimeError):
        name = "one GPU"
    return TITLE.format(where=f"one {name}" if name != "one GPU" else name)


def load_rows(out: Path) -> list[dict]:
    """The rows of ``out``/results.jsonl; none when the comparison has not written any yet."""
    path = Path(out) / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def geomean(values: list[float]) -> float:
    """Geometric mean (NaN for no values): the summary of per-batch speedups, which are ratios."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def speedups(rows: list[dict], model: str, ours: str = "slidedp") -> dict[str, dict]:
    """One SlideDP variant's tokens/s over each peer's, per batch where both ran, and the geometric mean.

    Only batches where both systems finished count: an out-of-memory batch has no throughput to divide,
    and reporting it as a ratio would make the peer that failed look infinitely slow.
    """
    ok = {(r["system"], r["batch"]): r for r in rows if r.get("status") == "ok" and r["model"] == model}
    out = {}
    for peer in PEERS:
        ratios = {b: ok[(ours, b)]["tokens_per_s"] / ok[(peer, b)]["tokens_per_s"]
                  for (s, b) in ok if s == peer and (ours, b) in ok}
        out[peer] = {"per_batch": dict(sorted(ratios.items())), "geomean": geomean(list(ratios.values()))}
    return out


def _fmt(r: dict, key: str, spec: str) -> str:
    v = r.get(key)
    return format(v, spec) if isinstance(v, (int, float)) and not math.isnan(v) else "-"


def table_markdown(rows: list[dict]) -> str:
    """Every row as a Markdown table (figures a run did not produce show as "-"), then each SlideDP variant's
    geometric-mean speedup over each peer per model: the text RESULTS.md quotes."""
    lines = ["| model | batch | system | status | step s | tokens/s | model TFLOP/s | GPU peak GiB | host RSS peak GiB "
             "| simulated s (limiter) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["model"], r["batch"], SYSTEMS.index(r["system"]))):
        sim = (f"{r['predicted_step_time_s']:.3f} ({r['predicted_limiter']})" if "predicted_step_time_s" in r else "")
        lines.append(f"| {r['model']} | {r['batch']} | {r['system']} | {r.get('status', '?')} | "
                     f"{_fmt(r, 'step_time_s', '.3f')} | {_fmt(r, 'tokens_per_s', ',.0f')} | "
                     f"{_fmt(r, 'model_tflops', '.0f')} | {_fmt(r, 'gpu_peak_gib', '.1f')} | "
                     f"{_fmt(r, 'host_rss_peak_gib', '.1f')} | {sim} |")
    for model in sorted({r["model"] for r in rows}):
        for ours in OURS:
            for peer, s in speedups(rows, model, ours).items():
                if s["per_batch"]:
                    per = ", ".join(f"b{b}: {v:.2f}x" for b, v in s["per_batch"].items())
                    lines.append(f"\n{model}: {ours} / {peer} tokens/s geometric mean {s['geomean']:.2f}x ({per})")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path, title: str = TITLE.format(where="one GPU")) -> list[Path]:
    """Throughput (tokens/s) against batch, one panel per model and one line per system; a batch a system
    could not run (out of memory, skipped) is an x on the panel's floor so a missing point is not mistaken
    for a slow one. Writes peer_compare.png and .svg into ``out`` and returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(max(8.5, 6.5 * len(models)), 5.0), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for system in SYSTEMS:
            pts = sorted((r["batch"], r["tokens_per_s"]) for r in rows
                         if r["model"] == model and r["system"] == system and r.get("status") == "ok")
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=system, color=COLORS[system])
            failed = [r["batch"] for r in rows if r["model"] == model and r["system"] == system
                      and r.get("status", "ok") != "ok"]
            if failed:
                ax.scatter(failed, [ax.get_ylim()[0]] * len(failed), marker="x", color=COLORS[system], s=60)
        seq = next(r["seq"] for r in rows if r["model"] == model)
        gpus = max(r.get("gpus", 1) for r in rows if r["model"] == model)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (sequences per step)")
        ax.set_ylabel("throughput (tokens/s)")
        ax.set_title(f"{model}, seq {seq}, {gpus} GPU{'s' if gpus > 1 else ''} (x: out of memory / not run)")
        ax.grid(alpha=0.3)
        ax.legend(title="system")
    fig.suptitle(title)
    fig.tight_layout()
    paths = [out / "peer_compare.png", out / "peer_compare.svg"]
    for p in paths:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return paths
