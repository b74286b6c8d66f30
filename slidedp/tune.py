"""Auto-tuner: enumerate policies, prune by memory, rank with the analytical model, refine with the DES.

The analytical model is cheap (well under a millisecond) but approximate; the simulator is exact for
the modelled machine but costs a fraction of a second. Ranking everything with the first and re-ranking
the best few with the second gets the simulator's answer at the model's price.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, HardwareProfile
from slidedp.model import estimate_memory, estimate_step
from slidedp.model.memory import MemoryEstimate, kept_layer_bytes
from slidedp.model.step_model import StepEstimate
from slidedp.model_spec import ModelSpec
from slidedp.policy import ACTIVATION_POLICIES, GRAD_ROUTES, HOST_LAYOUTS, PARAM_ROUTES, UPDATE_SCHEDULES, Policy
from slidedp.problem import Budget
from slidedp.sim import SimResult, simulate
from slidedp.state_choice import StateChoice, choose_state, measured_states
from slidedp.trace import EXPOSURE_CATEGORIES
from slidedp.units import Unit
from slidedp.workload import StepWorkload, policy_units, unit_inputs

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class TuneSpace:
    """The axes the tuner searches; each tuple lists the values tried."""

    param_routes: tuple[str, ...] = PARAM_ROUTES
    grad_routes: tuple[str, ...] = GRAD_ROUTES
    chunks_per_layer: tuple[int, ...] = (1, 2, 4, 8, 16)
    prefetch_depths: tuple[int, ...] = (1, 2, 3, 4)
    activations: tuple[str, ...] = ACTIVATION_POLICIES
    micro_batches: tuple[int, ...] | None = None  # None: every divisor of the per-rank batch up to 16
    update_schedules: tuple[str, ...] = UPDATE_SCHEDULES
    # Adam threads per rank as a fraction of the cores a rank owns; below 1 leaves cores to copies and Python.
    thread_fractions: tuple[float, ...] = (1.0, 0.5)
    # Global gradient-norm clipping rules out as_ready, which updates before the norm is known.
    clipping: bool = True
    # Also try each policy with as many leading units' optimizer state on the GPU as the budget leaves room
    # for (Policy.gpu_state_units); False keeps all optimizer state on the host.
    gpu_state: bool = True
    # Sequence tiles (Policy.seq_tile_tokens) tried only when no untiled policy fits, largest first: each policy
    # takes the largest tile that fits. None: 4096 tokens doubling while below a micro-batch's tokens; ()
    # never tiles.
    seq_tiles: tuple[int, ...] | None = None
    # Host optimizer state precisions (StatePrecision names) the tuner may choose from: exact fp32 only unless
    # the user allows compact state (``--state auto``); slidedp.state_choice says how it chooses among several.
    states: tuple[str, ...] = ("fp32",)
    # Across hosts (tune(..., hosts > 1)): keep the whole state on every host, or 1/H of it on each.
    host_layouts: tuple[str, ...] = HOST_LAYOUTS
    # Also try each recompute policy with as many of the last layers keeping their graphs as the budget leaves
    # room for (Policy.kept_layers): GPU memory spent on skipping recompute.
    kept_layers: bool = True


@dataclass
class Candidate:
    policy: Policy
    estimate: StepEstimate
    memory: MemoryEstimate
    sim: SimResult | None = None

    @property
    def sim_step_s(self) -> float | None:
        return None if self.sim is None else self.sim.step_time_s


@dataclass
class TuneResult:
    best: Candidate
    candidates: list[Candidate]  # feasible ones, ranked (refined first, by simulated step time)
    enumerated: int
    elapsed_s: float
    workloads: dict[int, StepWorkload] = field(default_factory=dict, repr=False)
    state_choice: StateChoice | None = None  # how the host-state precision was chosen (None: one mode allowed)

    def table(self) -> pd.DataFrame:
        """One row per feasible candidate, best first: predictions, memory and the policy's fields."""
        rows = []
        for rank, cand in enumerate(self.candidates, start=1):
            est, mem = cand.estimate, cand.memory
            row = {
                "rank": rank,
                "sim_step_s": cand.sim_step_s,
                "model_step_s": est.step_time_s,
                "tokens_per_s": (est.tokens_per_s if cand.sim is None else cand.sim.tokens_per_s),
                "bottleneck": est.bottleneck if cand.sim is None else cand.sim.bottleneck,
                "limiter": est.limiter if cand.sim is None else cand.sim.limiter,
                "compute_s": est.compute_s,
                **{f"exposed_{c}_s": (est.exposure[c] if cand.sim is None else cand.sim.mean_exposure()[c])
                   for c in EXPOSURE_CATEGORIES},
                "gpu_peak_gib": mem.gpu_peak / GIB,
                "host_gib": mem.host_total / GIB,
                "host_state_bytes_per_param": mem.host_bytes_per_param,
            }
            row.update(cand.policy.to_dict())
            rows.append(row)
        return pd.DataFrame(rows)


def enumerate_policies(space: TuneSpace, hw: HardwareProfile, global_batch: int, hosts: int = 1) -> list[Policy]:
    """Every policy of ``space`` for ``global_batch`` sequences over ``hosts`` hosts of ``hw`` (over several
    hosts, with each host layout too)."""
    n = hw.num_gpus * hosts
    if global_batch < n or global_batch % n:
        raise SlideDPError(f"global batch {global_batch} must be a positive multiple of the GPU count {n}")
    per_rank = global_batch // n
    micro = space.micro_batches or tuple(d for d in range(1, min(per_rank, 16) + 1) if per_rank % d == 0)
    micro = tuple(m for m in micro if per_rank % m == 0)
    if not micro:
        raise SlideDPError(f"no micro-batch in {space.micro_batches} divides the per-rank batch {per_rank}")
    # With one GPU the routes are the same thing: keep one spelling of each.
    param_routes = space.param_routes if hw.num_gpus > 1 else space.param_routes[:1]
    grad_routes = space.grad_routes if hw.num_gpus > 1 else space.grad_routes[:1]
    threads = sorted({max(1, int(hw.host.cores // hw.num_gpus * f)) for f in space.thread_fractions}, reverse=True)
    layouts = space.host_layouts if hosts > 1 else space.host_layouts[:1]
    schedules = tuple(s for s in space.update_schedules if not (space.clipping and s == "as_ready"))
    if not schedules:
        raise SlideDPError("no update schedule left: as_ready cannot clip the global gradient norm")
    policies = []
    for state, pr, gr, ch, pd_, act, mb, sched, th, hl in itertools.product(
            space.states, param_routes, grad_routes, space.chunks_per_layer, space.prefetch_depths, space.activations,
            micro, schedules, threads, layouts):
        if hl == "sharded" and state != "fp32" and len(layouts) > 1:
            continue  # compact state is not sharded across hosts (runtime.host_state)
        policies.append(Policy(param_route=pr, grad_route=gr, chunks_per_layer=ch, prefetch_depth=pd_,
                               activation=act, micro_batch=mb, accumulation=per_rank // mb, adam_threads=th,
                               update_schedule=sched, state=state, host_layout=hl))
    return policies


def most_gpu_state_units(model: ModelSpec, hw: HardwareProfile, policy: Policy, seq: int, global_batch: int,
                         units: tuple[Unit, ...], gpu_budget: float, hosts: int = 1,
                         attention_span: float | None = None) -> tuple[StepWorkload, MemoryEstimate] | None:
    """The workload (and its memory) with the largest ``gpu_state_units`` (> 0) whose GPU peak fits the budget,
    or None when not even the first unit fits. GPU memory grows with every unit held, so bisection finds it."""
    lo, hi, best = 1, len(units), None
    while lo <= hi:
        mid = (lo + hi) // 2
        w = StepWorkload(model, hw, policy.with_(gpu_state_units=mid), seq, global_batch, units=units, hosts=hosts,
                         attention_span=attention_span)
        mem = estimate_memory(w)
        if mem.gpu_peak <= gpu_budget:
            best, lo = (w, mem), mid + 1
        else:
            hi = mid - 1
    return best


def most_kept_layers(w: StepWorkload, peak: float, gpu_budget: float) -> int:
    """The largest Policy.kept_layers (0 to the model's layers) that fits ``gpu_budget``, for the workload ``w``
    of a recompute policy with none kept whose GPU peak is ``peak``: each kept layer adds kept_layer_bytes."""
    per_layer = kept_layer_bytes(w)
    if per_layer <= 0:
        return w.model.layers
    return max(0, min(w.model.layers, int((gpu_budget - peak) // per_layer)))


def seq_tile_candidates(space: TuneSpace, tokens_per_micro_batch: int) -> tuple[int, ...]:
    """The sequence tiles to try for a policy whose untiled layers do not fit, largest first."""
    if space.seq_tiles is not None:
        return tuple(sorted({t for t in space.seq_tiles if t > 0}, reverse=True))
    tiles, tile = [], 4096
    while tile < tokens_per_micro_batch:
        tiles.append(tile)
        tile *= 2
    return tuple(reversed(tiles))


def tune(model: ModelSpec, hw: HardwareProfile, seq: int, global_batch: int, budget: Budget,
         space: TuneSpace | None = None, refine_top: int = 6, progress: Progress | None = None,
         hosts: int = 1, attention_span: float | None = None) -> TuneResult:
    """Best policy for the problem under ``budget`` (per host; ``hosts`` hosts of ``hw``, where the tuner also
    chooses the host layout); raises SlideDPError naming the budget needed if none fits. ``attention_span``:
    packed rows through the varlen kernel (slidedp.units.attention_span; None: whole rows).

    Untiled layers first; only when no untiled policy fits are sequence tiles tried (each policy with the
    largest tile that fits), since tiling reruns each tile's norms and MLP in backward."""
    t0 = time.perf_counter()
    space = space or TuneSpace()
    policies = enumerate_policies(space, hw, global_batch, hosts)
    units_cache: dict[tuple, tuple[Unit, ...]] = {}
    feasible: list[Candidate] = []
    workloads: dict[int, StepWorkload] = {}
    smallest_gpu = smallest_host = float("inf")
    smallest_policy: Policy | None = None
    total = len(policies) + refine_top  # until the feasible candidates are known

    def units_of(policy: Policy) -> tuple[Unit, ...]:
        key = unit_inputs(policy)
        if key not in units_cache:
            units_cache[key] = policy_units(model, hw.gpu, policy, seq, attention_span)
        return units_cache[key]

    def fits(policy: Policy) -> bool:
        """Add ``policy`` (and its GPU-state and kept-layers variants) to the feasible ones if it fits; track
        the smallest."""
        nonlocal smallest_gpu, smallest_host, smallest_policy
        units = units_of(policy)
        w = StepWorkload(model, hw, policy, seq, global_batch, units=units, hosts=hosts,
                         attention_span=attention_span)
        mem = estimate_memory(w)
        smallest_host = min(smallest_host, mem.host_total)
        if mem.host_total <= budget.host_bytes and mem.gpu_peak < smallest_gpu:
            smallest_gpu, smallest_policy = mem.gpu_peak, policy
        if mem.gpu_peak > budget.gpu_bytes or mem.host_total > budget.host_bytes:
            return False
        workloads[id(policy)] = w
        feasible.append(Candidate(policy, estimate_step(w, with_memory=False), mem))
        # The sharded host layout keeps each host's share of the master only: no GPU-held units (runtime).
        held = (most_gpu_state_units(model, hw, policy, seq, global_batch, units, budget.gpu_bytes,
                                     hosts, attention_span) if space.gpu_state and not w.routes.shards_hosts else None)
        if held is not None:
            w_held, mem_held = held
            workloads[id(w_held.policy)] = w_held
            feasible.append(Candidate(w_held.policy, estimate_step(w_held, with_memory=False), mem_held))
        kept = (most_kept_layers(w, mem.gpu_peak, budget.gpu_bytes)
                if space.kept_layers and policy.activation == "recompute" and not policy.kept_layers else 0)
        if kept:
            kept_policy = policy.with_(kept_layers=kept)
            w_kept = StepWorkload(model, hw, kept_policy, seq, global_batch, units=units_of(kept_policy),
                                  hosts=hosts, attention_span=attention_span)
            mem_kept = estimate_memory(w_kept)
            if mem_kept.gpu_peak <= budget.gpu_bytes:  # exact but for rounding: the peak is linear in kept layers
                workloads[id(kept_policy)] = w_kept
                feasible.append(Candidate(kept_policy, estimate_step(w_kept, with_memory=False), mem_kept))
        return True

    for i, policy in enumerate(policies):
        fits(policy)
        if progress and i % 64 == 0:
            progress(i, total)
    if not feasible:  # no untiled policy fits: each policy with the largest sequence tile that does
        for policy in policies:
            for tile in seq_tile_candidates(space, seq * policy.micro_batch):
                if fits(policy.with_(seq_tile_tokens=tile)):
                    break
    if not feasible:
        if smallest_gpu == float("inf"):
            hint = "" if len(space.states) > 1 else "; compact host state (--state auto) needs less"
            raise SlideDPError(f"no policy fits the host memory limit of {budget.host_bytes / GIB:.1f} GiB; "
                               f"the smallest needs {smallest_host / GIB:.1f} GiB{hint}")
        p = smallest_policy
        tiled = f", sequence tile {p.seq_tile_tokens}" if p.seq_tile_tokens else ""
        raise SlideDPError(f"no policy fits a GPU budget of {budget.gpu_bytes / GIB:.1f} GiB; the smallest "
                           f"feasible budget is {smallest_gpu / GIB:.1f} GiB (activations {p.activation}, "
                           f"micro-batch {p.micro_batch}, prefetch {p.prefetch_depth}, {p.chunks_per_layer} chunks"
                           f"{tiled})")
    feasible.sort(key=lambda c: c.estimate.step_time_s)
    # The top candidates, plus the analytically best of every host-state mode not among them, so each mode's
    # best is simulated before the modes are compared (one mode: exactly the top candidates).
    to_refine = feasible[:refine_top]
    for state in space.states:
        if not any(c.policy.state == state for c in to_refine):
            to_refine += [c for c in feasible if c.policy.state == state][:1]
    total = len(policies) + len(to_refine)  # now known: --top-k beyond the feasible count refines them all
    for j, cand in enumerate(to_refine):
        cand.sim = simulate(workloads[id(cand.policy)])
        if progress:
            progress(len(policies) + j + 1, total)
    choice = None
    if len(space.states) > 1:
        best_of = {s: min((c.sim.step_time_s for c in to_refine if c.policy.state == s), default=None)
                   for s in space.states}
        choice = choose_state(best_of, measured_states(hw.host))
    chosen = choice.state if choice else space.states[0]
    # The chosen mode first; among simulated times within 0.1% of each other prefer less GPU memory.
    fastest = min(c.sim.step_time_s for c in to_refine)
    refined = sorted(to_refine, key=lambda c: (c.policy.state != chosen, round(c.sim.step_time_s / fastest, 3),
                                               c.memory.gpu_peak, c.sim.step_time_s))
    ranked = refined + [c for c in feasible if c.sim is None]
    if progress:
        progress(total, total)
    return TuneResult(ranked[0], ranked, len(policies), time.perf_counter() - t0, workloads, choice)
