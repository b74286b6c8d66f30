"""Strong and weak scaling over hosts, simulated (#20): both host layouts, where each stops scaling and why.

    python -m benchmarks.multihost_scaling [--out benchmarks/results/multihost-2026-12-04] [--analytical]

Every point is one step of a fixed policy (sharded parameter route, reduce-scatter gradients, 4 chunks per layer,
prefetch depth 2, recompute, micro-batch 1, next_forward updates) on 1..16 hosts of the h100-sxm-x8-ib preset (8
GPUs per host, 8 NICs of 400 Gb/s: assumed figures, see the preset's notes), for each host layout. Strong scaling
keeps the global batch (``--strong-batch`` sequences); weak scaling keeps ``--weak-per-gpu`` sequences per GPU.
``--nics`` repeats the study with that many of the 400 Gb/s NICs per host (8: the preset; 1: a thinner network).
Writes ``scaling.csv`` (every point: simulated and analytical step time, tokens/s, the simulator's limiter and
busiest resource, the analytical demand of each resource, host GiB per host) and ``scaling.png``, and prints the
table for benchmarks/RESULTS.md. Nothing here is measured: no multi-host machine was available.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from slidedp.hardware import GIB, load_hardware
from slidedp.model import estimate_step
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.sim import simulate
from slidedp.workload import StepWorkload

MODELS = ("qwen2.5-72b", "llama-3-70b")
LAYOUTS = ("replicated", "sharded")
# The demands the "why" column names, with the word a reader looks for.
WHY = {"gpu[0]": "compute", "nic": "NIC", "cpu[0]": "CPU update", "hostmem": "host DRAM", "h2d[0]": "PCIe H2D",
       "d2h[0]": "PCIe D2H", "pcie[0]": "PCIe duplex", "link[0]": "NVLink"}


def point(model: str, hw, hosts: int, layout: str, per_gpu: int, seq: int, analytical: bool) -> dict:
    policy = Policy(param_route="sharded", grad_route="reduce_scatter", chunks_per_layer=4, prefetch_depth=2,
                    activation="recompute", micro_batch=1, accumulation=per_gpu, host_layout=layout)
    w = StepWorkload(load_model_spec(model), hw, policy, seq, hosts * hw.num_gpus * per_gpu, hosts=hosts)
    est = estimate_step(w)
    row = {"model": model, "nics": hw.network.nics, "hosts": hosts, "gpus": hosts * hw.num_gpus, "layout": layout,
           "batch": w.global_batch,
           "seq": seq, "model_step_s": est.step_time_s, "host_gib_per_host": est.memory.host_total / GIB,
           "fits_host": est.memory.host_total <= 0.9 * hw.host.memory_gib * GIB,
           **{f"demand_{k}": v for k, v in est.demands.items()}}
    busiest = max(est.demands, key=est.demands.get)
    row["model_bottleneck"] = WHY.get(busiest, busiest)
    if analytical:
        row.update(step_s=est.step_time_s, limiter=est.limiter, source="analytical")
    else:
        sim = simulate(w)
        row.update(step_s=sim.step_time_s, limiter=sim.limiter, sim_bottleneck=sim.bottleneck, source="simulated")
    row["tokens_per_s"] = w.tokens_per_step / row["step_s"]
    return row


def why(row) -> str:
    """What the step waits on beyond compute: the simulator's limiter, named by the busiest non-GPU demand."""
    others = {k[len("demand_"):]: v for k, v in row.items() if k.startswith("demand_") and k != "demand_gpu[0]"
              and isinstance(v, float) and v == v}
    top = max(others, key=others.get)
    return "compute" if row["limiter"] == "compute" else f"{row['limiter']} ({WHY.get(top, top)})"


def plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for i, model in enumerate(MODELS):
        for j, kind in enumerate(("strong", "weak")):
            ax = axes[i][j]
            part = table[(table.model == model) & (table.scaling == kind)]
            base = part[part.hosts == 1].tokens_per_s.iloc[0]
            hosts = sorted(part.hosts.unique())
            ax.plot(hosts, [base * h for h in hosts], "k:", label="linear (1 host x H)")
            for nics in sorted(part.nics.unique(), reverse=True):
                for layout, style in zip(LAYOUTS, ("o-", "s--"), strict=True):
                    rows = part[(part.layout == layout) & (part.nics == nics)].sort_values("hosts")
                    ax.plot(rows.hosts, rows.tokens_per_s, style, alpha=1.0 if nics == part.nics.max() else 0.5,
                            label=f"{layout}, {nics} x 400 Gb/s NIC")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_title(f"{model}, {kind} scaling")
            ax.set_xlabel("hosts (8x H100 SXM each)")
            ax.set_ylabel("tokens/s (simulated)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("SlideDP over hosts, simulated: h100-sxm-x8-ib (8 x 400 Gb/s NICs per host, assumed), seq 4096")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/multihost-2026-12-04")
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--strong-batch", type=int, default=256, help="global sequences, strong scaling")
    parser.add_argument("--weak-per-gpu", type=int, default=2, help="sequences per GPU, weak scaling")
    parser.add_argument("--hardware", default="h100-sxm-x8-ib")
    parser.add_argument("--nics", type=int, nargs="+", default=[8, 1], help="NICs per host to try (default 8 1)")
    parser.add_argument("--analytical", action="store_true", help="the analytical model only (fast)")
    args = parser.parse_args()
    preset = load_hardware(args.hardware)
    rows = []
    for model in args.models:
        for nics in args.nics:
            hw = replace(preset, network=replace(preset.network, nics=nics))
            for hosts in args.hosts:
                for layout in LAYOUTS:
                    if hosts == 1 and layout != LAYOUTS[0]:  # one host: the layouts are the same run
                        rows += [dict(r, layout=layout) for r in rows[-2:]]
                        continue
                    strong = args.strong_batch // (hosts * hw.num_gpus)
                    if strong >= 1 and args.strong_batch % (hosts * hw.num_gpus) == 0:
                        rows.append({"scaling": "strong", **point(model, hw, hosts, layout, strong, args.seq,
                                                                  args.analytical)})
                    rows.append({"scaling": "weak", **point(model, hw, hosts, layout, args.weak_per_gpu, args.seq,
                                                            args.analytical)})
                    print(f"{model} {nics} NIC(s) {hosts} host(s) {layout} done", flush=True)
    table = pd.DataFrame(rows)
    one_host = table[table.hosts == 1].groupby(["model", "scaling"]).tokens_per_s.first()
    table["efficiency"] = [r.tokens_per_s / (r.hosts * one_host[(r.model, r.scaling)]) for r in table.itertuples()]
    table["why"] = [why(r) for r in table.to_dict("records")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "scaling.csv", index=False)
    if set(MODELS) <= set(args.models):
        plot(table, out / "scaling.png")
    cols = ["model", "scaling", "nics", "hosts", "layout", "batch", "step_s", "tokens_per_s", "efficiency",
            "host_gib_per_host", "why"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in table[cols].itertuples(index=False):
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |")


if __name__ == "__main__":
    main()
