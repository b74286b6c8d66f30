# %% [markdown]
# # 2. Auto-tuning a policy under a GPU memory budget
#
# The tuner enumerates routes, chunking, prefetch depth, activation policy, micro-batching, update
# schedule and CPU threads; drops what does not fit the budget; ranks the rest analytically; and
# re-ranks the best few with the simulator. The reports then show why the winner wins.

# %%
import os
from pathlib import Path

from slidedp.hardware import GIB, load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.problem import Budget
from slidedp.report import plots
from slidedp.report.notebook import show
from slidedp.sim import simulate
from slidedp.tune import TuneSpace, tune
from slidedp.workload import StepWorkload

SMALL = os.environ.get("SLIDEDP_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("SLIDEDP_NOTEBOOK_OUT", "notebook_outputs")) / "02"

model = load_model_spec("qwen3-0.6b" if SMALL else "qwen3-8b")
hw = load_hardware("h200-x1")
budget = Budget(gpu_bytes=(12 if SMALL else 40) * GIB, host_bytes=110 * GIB)
space = TuneSpace(chunks_per_layer=(2, 8)) if SMALL else TuneSpace()

# %%
result = tune(model, hw, 4096, 8, budget, space, refine_top=3 if SMALL else 6)
table = result.table()
print(f"{result.enumerated} candidates, {len(result.candidates)} fit the {budget.gpu_bytes / GIB:.0f} GiB budget")
print(table.head(8)[["rank", "sim_step_s", "model_step_s", "limiter", "gpu_peak_gib", "activation", "micro_batch",
                     "chunks_per_layer", "prefetch_depth", "update_schedule"]].to_string(index=False))
best = result.best.policy
print("winner:", best)

# %% [markdown]
# ## Why it wins
# The timeline shows each resource during one step; the exposure bars split the step into compute and the
# waits each resource caused.

# %%
sim = simulate(StepWorkload(model, hw, best, 4096, 8))
plots.gantt(sim.trace, OUT / "timeline", f"{model.name}: tuned policy, one step")
plots.exposure_bars(sim.exposure, OUT / "exposure", "Exposure of the tuned policy")
show(OUT / "timeline")
show(OUT / "exposure")
print({k: round(v, 3) for k, v in sim.mean_exposure().items()}, "compute", round(sim.compute_s, 3))
