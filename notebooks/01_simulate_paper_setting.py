# %% [markdown]
# # 1. The paper's setting in the simulator: Qwen3-14B on 4x H100
#
# Host-resident streaming keeps fp32 master weights and Adam moments in host memory. With four GPUs on
# one host, the ranks share host DRAM and the CPU. This notebook sweeps the global batch for the two
# route families (replicated H2D + per-rank D2H, and sharded H2D + all-gather with reduce-scatter), then
# strong-scales a fixed batch from 1 to 4 GPUs to show where host work becomes exposed.
# Run it as a script or open it with jupytext; `SLIDEDP_NOTEBOOK_SMALL=1` shrinks it for CI.

# %%
import os
from pathlib import Path

from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.report import plots
from slidedp.report.notebook import show
from slidedp.sweep import POLICY_PRESETS, run_sweep

SMALL = os.environ.get("SLIDEDP_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("SLIDEDP_NOTEBOOK_OUT", "notebook_outputs")) / "01"

model = load_model_spec("qwen3-0.6b" if SMALL else "qwen3-14b")
hw = load_hardware("h100-sxm-x4")
batches = [4, 8, 16] if SMALL else [4, 8, 16, 32, 64, 128, 256]
policies = [(name, POLICY_PRESETS[name]) for name in ("sharded", "replicated", "zero-offload-like")]

# %% [markdown]
# ## Batch sweep and strong scaling
# Every point is a full discrete-event simulation of one step; `limiter` says what the GPUs waited for.

# %%
sweep = run_sweep(model, hw, [2048 if SMALL else 4096], batches, [1, 2, 4], policies)
print(sweep[["gpus", "batch", "policy", "step_s", "tokens_per_s", "limiter"]].to_string(index=False))

# %%
plotted = plots.sweep_plot(sweep, OUT / "sweep", f"{model.name} on {hw.name}: throughput by route")
show(OUT / "sweep")

# %% [markdown]
# ## Where host work becomes exposed
# At a fixed global batch, more GPUs shrink each rank's compute while the host's update work stays the
# same, so the CPU and DRAM share of the step grows: the exposed-CPU column climbs with the GPU count.

# %%
strong = sweep[sweep.batch == max(batches)].sort_values(["policy", "gpus"])
print(strong[["policy", "gpus", "step_s", "compute_s", "exposed_cpu_s", "exposed_h2d_s", "limiter"]]
      .to_string(index=False))
for name, rows in strong.groupby("policy"):
    share = rows.exposed_cpu_s / rows.step_s
    print(f"{name}: exposed CPU share of the step {', '.join(f'{s:.0%}' for s in share)} at "
          f"{', '.join(str(g) for g in rows.gpus)} GPU(s)")
