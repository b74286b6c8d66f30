"""Matplotlib figures of a step, an exposure breakdown, a sweep, and predicted-vs-measured times.

Every function writes ``<stem>.png`` and ``<stem>.svg`` and returns the numbers it plotted, so tests can
check a figure against the table it came from.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from slidedp.peers.systems import SLIDEDP  # noqa: E402
from slidedp.trace import EXPOSURE_CATEGORIES  # noqa: E402

OP_COLORS = {
    "fwd": "#4c72b0", "bwd": "#2a4d80", "h2d_param": "#55a868", "h2d_ckpt": "#8fd18f", "h2d_grad": "#b7e4b7",
    "d2h_grad": "#c44e52",
    "d2h_ckpt": "#e69a9c", "allgather": "#8172b2", "reduce_scatter": "#b0a4dc", "cpu_reduce": "#ccb974",
    "adam": "#dd8452", "cast": "#f2b98f", "clip": "#b5651d",
}
CATEGORY_COLORS = {"compute": "#4c72b0", "h2d": "#55a868", "d2h": "#c44e52", "collective": "#8172b2",
                   "cpu": "#dd8452", "bubble": "#999999"}
_TRACK_ORDER = ("gpu", "h2d", "d2h", "link", "cpu")


def _save(fig, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def _track_key(resource: str, rank: int) -> tuple:
    kind = resource.split("[")[0]
    return (rank, _TRACK_ORDER.index(kind) if kind in _TRACK_ORDER else len(_TRACK_ORDER), resource)


def host_bandwidth(trace: pd.DataFrame) -> pd.DataFrame:
    """Host DRAM traffic over time (bytes/s), assuming each op's host bytes flow evenly over its span."""
    rows = trace[(trace.host_bytes > 0) & (trace.end_s > trace.start_s)]
    rate = rows.host_bytes / (rows.end_s - rows.start_s)
    events = pd.concat([pd.DataFrame({"t": rows.start_s, "d": rate}), pd.DataFrame({"t": rows.end_s, "d": -rate})])
    events = events.groupby("t", as_index=False)["d"].sum().sort_values("t")
    events["rate"] = events["d"].cumsum().clip(lower=0.0)
    return events[["t", "rate"]].reset_index(drop=True)


def gantt(trace: pd.DataFrame, stem: Path, title: str) -> pd.DataFrame:
    """Per-resource timeline of one step plus host DRAM bandwidth; returns busy seconds per track."""
    tracks = sorted({(r.resource, int(r.rank)) for r in trace[["resource", "rank"]].drop_duplicates().itertuples()},
                    key=lambda t: _track_key(*t))
    ypos = {t: i for i, t in enumerate(tracks)}
    fig, (ax, axh) = plt.subplots(2, 1, figsize=(13, 0.32 * len(tracks) + 3.5), sharex=True,
                                  gridspec_kw={"height_ratios": [max(2, len(tracks) // 3), 1]})
    plotted = []
    for (resource, rank, op), rows in trace.groupby(["resource", "rank", "op"], sort=False):
        spans = list(zip(rows.start_s * 1e3, (rows.end_s - rows.start_s) * 1e3, strict=True))
        ax.broken_barh(spans, (ypos[(resource, rank)] - 0.4, 0.8), facecolors=OP_COLORS.get(op, "#333333"),
                       label=op)
        plotted.append({"resource": resource, "rank": rank, "op": op,
                        "busy_s": float((rows.end_s - rows.start_s).sum()), "ops": len(rows)})
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([res if res.startswith("cpu") else f"{res}" for res, _ in tracks])
    ax.invert_yaxis()
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), title="operation")
    ax.set_title(title)
    ax.set_ylabel("resource (per rank)")
    bw = host_bandwidth(trace)
    axh.step(bw.t * 1e3, bw.rate / 1e9, where="post", color="#dd8452", label="host DRAM traffic")
    axh.set_ylabel("host DRAM (GB/s)")
    axh.set_xlabel("time since step start (ms)")
    axh.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, stem)
    return pd.DataFrame(plotted)


def exposure_bars(exposure: pd.DataFrame, stem: Path, title: str) -> pd.DataFrame:
    """Stacked bar per rank: compute and each exposed category, in seconds; returns the plotted table."""
    cols = ["compute", *EXPOSURE_CATEGORIES]
    data = exposure.set_index("rank")[cols]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(data) + 3), 4.5))
    bottom = pd.Series(0.0, index=data.index)
    for col in cols:
        label = col if col == "compute" else f"exposed {col}"
        ax.bar([f"rank {r}" for r in data.index], data[col], bottom=bottom, color=CATEGORY_COLORS[col], label=label)
        bottom += data[col]
    ax.set_ylabel("time per step (s)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, stem)
    return data.reset_index()


LIMITER_MARKERS = {"compute": "o", "h2d": "^", "d2h": "v", "collective": "D", "cpu": "s", "bubble": "x"}


def sweep_lines(sweep: pd.DataFrame) -> pd.Series:
    """The line each sweep row belongs to: its SlideDP policy, or its system where the sweep holds peers (SlideDP's
    rows then read ``slidedp (policy)``). Tables without a ``system`` column are SlideDP-only sweeps."""
    if "system" not in sweep.columns or (sweep["system"] == SLIDEDP).all():
        return sweep["policy"].astype(str)
    return sweep.apply(lambda r: f"{SLIDEDP} ({r.policy})" if r.system == SLIDEDP else r.system, axis=1)


def sweep_plot(sweep: pd.DataFrame, stem: Path, title: str) -> pd.DataFrame:
    """Tokens/s vs global batch (at the largest GPU count) and vs GPU count (strong scaling at the largest
    batch every GPU count ran), one line per policy or peer system (``sweep_lines``), marker shape = what the
    point is limited by."""
    seq = sweep["seq"].min()
    data = sweep[sweep["seq"] == seq].assign(line=lambda d: sweep_lines(d))
    max_gpus = data["gpus"].max()
    by_batch = data[data["gpus"] == max_gpus].sort_values("batch")
    common = data.groupby("batch")["gpus"].nunique()
    strong_batch = common[common == data["gpus"].nunique()].index.max()
    by_gpus = data[data["batch"] == strong_batch].sort_values("gpus")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    plotted = []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel, column, rows_of_panel in ((a1, "batch", "batch", by_batch), (a2, "gpus", "gpus", by_gpus)):
        for i, (policy, rows) in enumerate(rows_of_panel.groupby("line", sort=True)):
            color = colors[i % len(colors)]
            ax.plot(rows[column], rows.tokens_per_s, color=color, label=policy)
            for r in rows.itertuples():
                x = getattr(r, column)
                ax.scatter(x, r.tokens_per_s, marker=LIMITER_MARKERS.get(r.limiter, "o"), color=color, zorder=3)
                plotted.append({"panel": panel, "policy": policy, "x": x, "tokens_per_s": r.tokens_per_s,
                                "limiter": r.limiter})
    a1.set_xscale("log", base=2)
    a1.set_xlabel(f"global batch (sequences of {seq} tokens), {max_gpus} GPU(s)")
    a1.set_ylabel("throughput (tokens/s)")
    a1.set_title("throughput vs batch")
    a2.set_xticks(sorted(by_gpus["gpus"].unique()))
    a2.set_xlabel(f"GPUs (global batch {strong_batch}, strong scaling)")
    a2.set_ylabel("throughput (tokens/s)")
    a2.set_title("throughput vs GPU count")
    for limiter, marker in LIMITER_MARKERS.items():
        a2.scatter([], [], marker=marker, color="black", label=f"limited by {limiter}")
    a1.legend(title="policy / system")
    a2.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="policy / system / marker")
    fig.suptitle(title)
    _save(fig, stem)
    return pd.DataFrame(plotted)


def predicted_vs_measured(table: pd.DataFrame, stem: Path, title: str) -> pd.DataFrame:
    """Scatter of predicted against measured step time with the y = x line and the MAPE in the title."""
    data = table[["label", "predicted_s", "measured_s"]].copy()
    mape = float((abs(data.predicted_s - data.measured_s) / data.measured_s).mean() * 100)
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.scatter(data.measured_s, data.predicted_s, color="#4c72b0", label="runs", zorder=3)
    for r in data.itertuples():
        ax.annotate(str(r.label), (r.measured_s, r.predicted_s), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    hi = float(max(data.measured_s.max(), data.predicted_s.max())) * 1.05
    ax.plot([0, hi], [0, hi], color="#999999", linestyle="--", label="y = x")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(f"{title} (MAPE {mape:.1f}%)")
    ax.legend()
    _save(fig, stem)
    data.attrs["mape_percent"] = mape
    return data
