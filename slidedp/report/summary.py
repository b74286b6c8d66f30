"""Build every figure for a run (and optionally a sweep and a validation table) and a one-page summary."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from slidedp.report import plots
from slidedp.report.rundir import RunDir
from slidedp.run_summary import RunSummary
from slidedp.trace import EXPOSURE_CATEGORIES


@dataclass
class Report:
    out: Path
    figures: dict[str, Path] = field(default_factory=dict)  # name -> PNG path
    data: dict[str, pd.DataFrame] = field(default_factory=dict)  # name -> what the figure plotted
    markdown: Path | None = None
    html: Path | None = None


def _or(summary: RunSummary, key: str, default):
    """The summary's value for ``key``, or ``default`` where the file did not record it."""
    return getattr(summary, key) if key in summary.given else default


def _describe(run: RunDir) -> list[str]:
    s = run.summary
    lines = []
    if not s.empty:
        device = str(_or(s, "device", "") or "")
        if s.source == "measured" and device and not device.startswith("cuda"):  # no GPU was involved
            where = (f"**{device}** ({_or(s, 'ranks', 1)} rank(s); profile {_or(s, 'hardware', '?')} only for "
                     f"predictions)")
        else:
            where = f"**{_or(s, 'hardware', '?')}** ({_or(s, 'gpus', '?')} GPU)"
        lines.append(f"**{_or(s, 'model', '?')}** on {where}, "
                     f"seq {_or(s, 'seq', '?')}, batch {_or(s, 'batch', '?')} "
                     f"({_or(s, 'tokens_per_step', 0):,} tokens/step), source: {_or(s, 'source', 'unknown')}")
        if "step_time_s" in s.given:
            lines.append(f"Step time **{s.step_time_s:.3f} s**, **{_or(s, 'tokens_per_s', 0):,.0f} tokens/s**, "
                         f"limited by **{_or(s, 'limiter', '?')}**, busiest resource {_or(s, 'bottleneck', '?')}.")
    else:
        lines.append(f"Trace file {run.path.name} ({len(run.trace)} operations).")
    exp = run.exposure.drop(columns="rank").mean()
    total = float(exp.sum())
    parts = [f"compute {exp['compute']:.3f} s ({100 * exp['compute'] / total:.0f}%)"]
    parts += [f"exposed {c} {exp[c]:.3f} s" for c in EXPOSURE_CATEGORIES if exp[c] > 0.0005 * total]
    lines.append("Rank-mean breakdown: " + ", ".join(parts) + ".")
    return lines


def build_report(run: RunDir, out: Path, sweep: pd.DataFrame | None = None,
                 validation: pd.DataFrame | None = None) -> Report:
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out)
    name = _or(run.summary, "model", run.path.stem)
    rep.data["timeline"] = plots.gantt(run.trace, out / "timeline", f"One step of {name}: operations per resource")
    rep.figures["timeline"] = out / "timeline.png"
    on_cpu = run.summary.source == "measured" and not str(_or(run.summary, "device", "cuda")).startswith("cuda")
    rep.data["exposure"] = plots.exposure_bars(run.exposure, out / "exposure", "Where each rank's step time goes "
                                               "(CPU run)" if on_cpu else "Where each GPU's step time goes")
    rep.figures["exposure"] = out / "exposure.png"
    if sweep is not None:
        # The sweep's own model (a sweep may be of another model than the run beside it).
        swept = ", ".join(map(str, sweep.model.dropna().unique())) if "model" in sweep else name
        rep.data["sweep"] = plots.sweep_plot(sweep, out / "sweep", f"Throughput sweep: {swept or name}")
        rep.figures["sweep"] = out / "sweep.png"
    if validation is not None:
        rep.data["validation"] = plots.predicted_vs_measured(validation, out / "validation",
                                                             "Predicted vs measured step time")
        rep.figures["validation"] = out / "validation.png"
    lines = _describe(run)
    md = ["# SlideDP report", "", *[f"{line}  " for line in lines], ""]
    for key, png in rep.figures.items():
        md += [f"## {key.capitalize()}", "", f"![{key}]({png.name})", ""]
    rep.markdown = out / "report.md"
    rep.markdown.write_text("\n".join(md))
    body = "".join(f"<p>{html.escape(line).replace('**', '')}</p>" for line in lines)
    body += "".join(f"<h2>{key.capitalize()}</h2><img src='{png.name}' style='max-width:100%'>"
                    for key, png in rep.figures.items())
    rep.html = out / "report.html"
    rep.html.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>SlideDP report</title></head>"
                        f"<body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
                        f"<h1>SlideDP report</h1>{body}</body></html>")
    return rep
