"""Simulate a grid of problems (batch, sequence length, GPU count, system and policy) into one tidy table.

SlideDP contributes one row per policy; each peer system (slidedp.peers) one row per grid point, simulated from
its own plan and checked against its own memory model."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, HardwareProfile
from slidedp.model import estimate_step
from slidedp.model_spec import ModelSpec
from slidedp.peers import SLIDEDP, check_system, estimate_peer_memory, peer_step, simulate_peer
from slidedp.policy import Policy
from slidedp.problem import Budget, capacity_budget
from slidedp.sim import simulate
from slidedp.state_choice import AUTO, choose_state, measured_states, state_options
from slidedp.state_precision import EXACT
from slidedp.trace import EXPOSURE_CATEGORIES
from slidedp.workload import StepWorkload

POLICY_PRESETS: dict[str, Policy] = {
    "sharded": Policy(param_route="sharded", grad_route="reduce_scatter"),
    "replicated": Policy(param_route="replicated", grad_route="per_rank"),
    "sharded-as-ready": Policy(param_route="sharded", grad_route="reduce_scatter", update_schedule="as_ready"),
    "zero-offload-like": Policy(param_route="replicated", grad_route="per_rank", update_schedule="after_backward"),
    # Across hosts (--hosts): the sharded routes with each host keeping the whole state, or 1/H of it.
    "hosts-replicated": Policy(param_route="sharded", grad_route="reduce_scatter", host_layout="replicated"),
    "hosts-sharded": Policy(param_route="sharded", grad_route="reduce_scatter", host_layout="sharded"),
}


def resolve_named_policy(name_or_path: str) -> tuple[str, Policy]:
    if name_or_path in POLICY_PRESETS:
        return name_or_path, POLICY_PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise SlideDPError(f"unknown policy {name_or_path!r}: not a preset ({', '.join(POLICY_PRESETS)}) "
                           "nor a policy YAML file")
    return path.stem, Policy.load(path)


def fit_batch(policy: Policy, per_rank: int) -> Policy:
    """The policy with micro-batch x accumulation = per_rank, keeping its micro-batch where it divides."""
    micro = max(d for d in range(1, min(policy.micro_batch, per_rank) + 1) if per_rank % d == 0)
    return replace(policy, micro_batch=micro, accumulation=per_rank // micro)


def run_sweep(model: ModelSpec, hw: HardwareProfile, seqs: Sequence[int], batches: Sequence[int],
              gpus: Sequence[int], policies: Sequence[tuple[str, Policy]], gpu_budget_gib: float | None = None,
              simulate_points: bool = True, progress: Callable[[int, int], None] | None = None,
              systems: Sequence[str] = (SLIDEDP,), states: Sequence[str] = ("fp32",), hosts: int = 1,
              host_limit_gib: float | None = None) -> pd.DataFrame:
    """One row per (seq, batch, gpus, system, policy, host-state precision); batches that the GPU count (times
    ``hosts``) does not divide are skipped.

    ``policies`` apply to SlideDP, in each of ``states`` (StatePrecision names, or ``auto``: the mode
    slidedp.state_choice picks at that point); every other system runs as that peer does. The analytical model
    covers SlideDP only, so ``simulate_points=False`` refuses peers. ``fits``: the GPU peak within the GPU budget
    and the host memory within ``host_limit_gib`` (default: the GPU's and the host's whole memory,
    slidedp.problem.capacity_budget; simulate and tune plan SlideDP with margins below both)."""
    seqs, batches, gpus = (list(dict.fromkeys(values)) for values in (seqs, batches, gpus))  # one row per point
    for g in gpus:
        if g > hw.num_gpus:
            used = " in use (--gpus)" if hw.cut_to_fewer_gpus else ""
            raise SlideDPError(f"GPU count {g} exceeds the {hw.num_gpus} GPU(s) of {hw.base_name!r}{used}")
    systems = [check_system(s) for s in systems]
    peers = [s for s in systems if s != SLIDEDP]
    if peers and not simulate_points:
        raise SlideDPError(f"the analytical model covers slidedp only; simulate {', '.join(peers)} instead")
    entries = ([(SLIDEDP, name, policy.with_(state=state) if state != AUTO else policy, state)
                for name, policy in policies for state in states] if SLIDEDP in systems else []) \
        + [(s, "", None, "") for s in peers]
    if hosts > 1 and peers:
        raise SlideDPError(f"the peers run on one host; sweep {', '.join(peers)} without --hosts")
    grid = [(s, b, g, e) for s, b, g, e in itertools.product(seqs, batches, gpus, entries) if b % (g * hosts) == 0]
    if not grid:
        raise SlideDPError("no grid point has a batch divisible by its GPU count")
    budget = capacity_budget(hw, gpu_budget_gib, host_limit_gib)
    rows = []
    for i, (seq, batch, g, (system, name, policy, state)) in enumerate(grid):
        machine = hw if g == hw.num_gpus else hw.with_gpus(g)
        if system == SLIDEDP and state == AUTO:
            rows.append(_auto_state_row(model, machine, hw.name, seq, batch, g, name, policy, budget,
                                        simulate_points, hosts))
        elif system == SLIDEDP:
            rows.append(_slidedp_row(model, machine, hw.name, seq, batch, g, name, policy, budget, simulate_points,
                                     hosts))
        else:
            rows.append(_peer_row(model, machine, hw.name, seq, batch, g, system, budget))
        if progress:
            progress(i + 1, len(grid))
    return pd.DataFrame(rows)


def _fits(gpu_peak: float, host_total: float, budget: Budget) -> bool:
    return bool(gpu_peak <= budget.gpu_bytes and host_total <= budget.host_bytes)


def _auto_state_row(model: ModelSpec, machine: HardwareProfile, hw_name: str, seq: int, batch: int, g: int,
                    name: str, policy: Policy, budget: Budget, simulate_points: bool, hosts: int = 1) -> dict:
    """The row of the mode slidedp.state_choice picks among every host-state precision at this point (by simulated
    step time, or analytical with ``simulate_points=False``); if none fits, the exact mode's row."""
    rows = {mode: _slidedp_row(model, machine, hw_name, seq, batch, g, name, policy.with_(state=mode), budget,
                               simulate_points, hosts) for mode in state_options(AUTO)}
    if not any(r["fits"] for r in rows.values()):
        return {**rows[EXACT.name], "state_reason": "no mode fits"}
    choice = choose_state({m: (r["step_s"] if r["fits"] else None) for m, r in rows.items()},
                          measured_states(machine.host))
    return {**rows[choice.state], "state_reason": f"auto: {choice.reason}"}


def _slidedp_row(model: ModelSpec, machine: HardwareProfile, hw_name: str, seq: int, batch: int, g: int, name: str,
                 policy: Policy, budget: Budget, simulate_points: bool, hosts: int = 1) -> dict:
    fitted = fit_batch(policy, batch // (g * hosts))
    w = StepWorkload(model, machine, fitted, seq, batch, hosts=hosts)
    est = estimate_step(w)
    row = {"model": model.name, "hardware": hw_name, "gpus": g, "hosts": hosts, "host_layout": fitted.host_layout,
           "seq": seq, "batch": batch,
           "tokens_per_step": w.tokens_per_step, "system": SLIDEDP, "policy": name, "micro_batch": fitted.micro_batch,
           "accumulation": fitted.accumulation, "state": w.state.name,
           "host_state_bytes_per_param": est.memory.host_bytes_per_param,
           "update_rate": "measured" if w.state_update_rate_measured else "derived from DRAM bytes",
           "model_step_s": est.step_time_s,
           "lower_bound_s": est.lower_bound_s, "gpu_peak_gib": est.memory.gpu_peak / GIB,
           "host_gib": est.memory.host_total / GIB, "fits": _fits(est.memory.gpu_peak, est.memory.host_total, budget)}
    if simulate_points:
        sim = simulate(w)
        exposure = sim.mean_exposure()
        row.update(step_s=sim.step_time_s, tokens_per_s=sim.tokens_per_s, limiter=sim.limiter,
                   bottleneck=sim.bottleneck, compute_s=sim.compute_s,
                   **{f"exposed_{c}_s": exposure[c] for c in EXPOSURE_CATEGORIES}, source="simulated")
    else:
        row.update(step_s=est.step_time_s, tokens_per_s=est.tokens_per_s, limiter=est.limiter,
                   bottleneck=est.bottleneck, compute_s=est.compute_s,
                   **{f"exposed_{c}_s": est.exposure[c] for c in EXPOSURE_CATEGORIES}, source="analytical")
    return row


def _peer_row(model: ModelSpec, machine: HardwareProfile, hw_name: str, seq: int, batch: int, g: int, system: str,
              budget: Budget) -> dict:
    step = peer_step(system, model, machine, seq, batch)
    mem = estimate_peer_memory(step)
    sim = simulate_peer(step)
    exposure = sim.mean_exposure()
    w = step.w
    return {"model": model.name, "hardware": hw_name, "gpus": g, "seq": seq, "batch": batch,
            "tokens_per_step": w.tokens_per_step, "system": system, "policy": "",
            "micro_batch": w.policy.micro_batch, "accumulation": 1, "state": "",
            "host_state_bytes_per_param": mem.host_bytes_per_param, "model_step_s": float("nan"),
            "lower_bound_s": float("nan"), "gpu_peak_gib": mem.gpu_peak / GIB, "host_gib": mem.host_total / GIB,
            "fits": _fits(mem.gpu_peak, mem.host_total, budget), "step_s": sim.step_time_s,
            "tokens_per_s": sim.tokens_per_s,
            "limiter": sim.limiter, "bottleneck": sim.bottleneck, "compute_s": sim.compute_s,
            **{f"exposed_{c}_s": exposure[c] for c in EXPOSURE_CATEGORIES}, "source": "simulated"}
