# %% [markdown]
# # 3. Calibrating from a run and checking predictions against measurements
#
# A training run leaves a run directory whose trace has the same schema as the simulator's. Refitting the
# hardware profile from it replaces assumed rates with measured ones. Here: a short CPU run of a tiny
# model (any machine), then the measured 64K-token Qwen3-8B run from the H200 that ships with the repo, then
# twenty measured H200 runs against the calibrated profile.

# %%
import json
import os
import tempfile
from pathlib import Path

import pandas as pd

from slidedp.calibration.from_run import load_record, mape, refit_profile, validate
from slidedp.hardware import load_hardware
from slidedp.policy import Policy
from slidedp.report import plots
from slidedp.report.notebook import show
from slidedp.report.rundir import unpack_session
from slidedp.runtime.optim import OptimConfig
from slidedp.runtime.trainer import Trainer, TrainSpec

OUT = Path(os.environ.get("SLIDEDP_NOTEBOOK_OUT", "notebook_outputs")) / "03"

REPO = Path(os.environ.get("SLIDEDP_REPO", Path.cwd()))
work = Path(tempfile.mkdtemp())
config = dict(model_type="qwen3", vocab_size=300, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512)
(work / "tiny.json").write_text(json.dumps(config))

# %%
runs = []
for mb in (1, 2, 4):
    spec = TrainSpec(model=str(work / "tiny.json"), data="synthetic", policy=Policy(micro_batch=mb), steps=3, seq=256,
                     out=work / f"run-mb{mb}", hardware=load_hardware("h200-x1"), optim=OptimConfig(lr=1e-3),
                     device="cpu", final_checkpoint=False)
    Trainer(spec, log=lambda _m: None).run()
    runs.append(load_record(spec.out))

# %% [markdown]
# The shipped profile describes an H200 host, not this CPU, so its predictions are far off; the refit
# reads the CPU's real "GPU" (compute), copy and update rates from the traces. What remains is time
# outside any traced operation (Python between operations on a CPU device), which the simulator does
# not model; on a GPU the host runs ahead of the device and that time hides.

# %%
base = load_hardware("h200-x1")
before = validate(runs, base)
refit, report = refit_profile(base, runs)
after = validate(runs, refit)
print(f"MAPE before {mape(before):.0f}%, after refit {mape(after):.1f}%")
table = pd.concat([before.assign(profile="h200-x1"), after.assign(profile="refit")])
print(table[["profile", "label", "measured_s", "predicted_s", "error_percent"]].to_string(index=False))
plots.predicted_vs_measured(after.assign(label=after.label), OUT / "cpu_runs", "Tiny model on this CPU, refit")
show(OUT / "cpu_runs")

# %% [markdown]
# ## The measured H200 run

# %%
# Each results folder keeps its traces in one raw.tar.xz: unpack_session puts the run directory back together.
first_session = REPO / "benchmarks" / "results" / "h200-2026-12-02"
h200_run = unpack_session(first_session, work / "h200-first") / "run64k" if first_session.exists() else None
if h200_run is not None and (h200_run / "trace.parquet").exists():
    record = load_record(h200_run)
    shipped = validate([record], base)
    print(shipped[["label", "measured_s", "predicted_s", "error_percent", "measured_limiter",
                   "predicted_limiter"]].to_string(index=False))

# %% [markdown]
# ## Twenty measured H200 runs against the calibrated profile
#
# The shipped `h200-x1` profile is `slidedp calibrate`'s output on that host. The second H200 session kept
# 20 runs as run directories (traces included): ten hand-picked policies (sequence 1K-32K, 2-16 chunks,
# keep / recompute / offload, accumulation, prefetch 1) and the ten tuned runs of the peer comparison.
# Predicted against measured, with the limiter the simulator names and the one the trace shows:

# %%
results = REPO / "benchmarks" / "results" / "h200-2026-12-02b"
if (results / "raw.tar.xz").exists():
    tree = unpack_session(results, work / "h200")
    folders = [tree / "calibration" / "runs", tree / "peers" / "slidedp_runs", tree / "p8b" / "slidedp_runs"]
    # Ordered by (runs | slidedp_runs, name): the order the run list has always had, so the CI subset is stable.
    paths = sorted((p for f in folders for p in f.iterdir() if (p / "summary.json").exists()),
                   key=lambda p: (p.parent.name, p.name))
    if os.environ.get("SLIDEDP_NOTEBOOK_SMALL"):
        paths = paths[::4]  # CI: every fourth run keeps the notebook fast
    records = [load_record(p) for p in paths]
    table = validate(records, base)
    print(f"h200-x1: MAPE {mape(table):.1f}% over {len(table)} runs, limiter named correctly in "
          f"{int(table.limiter_match.sum())}/{len(table)}")
    print(table[["label", "measured_s", "predicted_s", "error_percent", "measured_limiter",
                 "predicted_limiter"]].round(3).to_string(index=False))
    plots.predicted_vs_measured(table, OUT / "h200_runs", "Measured H200 runs vs the calibrated h200-x1 profile")
    show(OUT / "h200_runs")
