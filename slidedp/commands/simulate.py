"""``slidedp simulate``: analytical estimate and discrete-event simulation of one policy, side by side; with
``--system`` a peer system (slidedp.peers) simulated the same way (no analytical model for peers)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from slidedp.errors import SlideDPError
from slidedp.hardware import GIB
from slidedp.model import estimate_step, memory_shortfalls
from slidedp.model_spec import load_model_spec
from slidedp.peers import SLIDEDP, estimate_peer_memory, peer_step, peer_system, simulate_peer
from slidedp.problem import resolve_budget, resolve_hardware, resolve_problem
from slidedp.report.rundir import write_run_dir
from slidedp.run_summary import AnalyticalStep, MemorySummary, RunSummary, SimulatedStep
from slidedp.sim import simulate
from slidedp.trace import EXPOSURE_CATEGORIES, save_trace


def run_simulate(args: argparse.Namespace) -> int:
    if peer_system(getattr(args, "system", SLIDEDP)) is not None:
        return run_peer_simulate(args)
    spec, hw, policy, w = resolve_problem(args.model, args.hardware, args.gpus, args.seq, args.batch, args.policy,
                                          getattr(args, "hosts", 1))
    budget = resolve_budget(hw, args.gpu_budget, args.host_limit)
    est = estimate_step(w)
    problems = memory_shortfalls(est.memory, budget.gpu_bytes, budget.host_bytes)
    if problems:
        raise SlideDPError("policy does not fit: " + "; ".join(problems))
    result = simulate(w)
    if args.trace:
        save_trace(result.trace, args.trace)
    summary = RunSummary(
        model=spec.name, model_spec=spec.to_dict(), hardware=hw.name, gpus=hw.num_gpus, seq=w.seq,
        batch=w.global_batch, tokens_per_step=w.tokens_per_step, policy=policy.to_dict(), source="simulated",
        step_time_s=result.step_time_s, tokens_per_s=result.tokens_per_s, limiter=result.limiter,
        bottleneck=result.bottleneck,
        simulated=SimulatedStep(step_time_s=result.step_time_s, tokens_per_s=result.tokens_per_s,
                                bottleneck=result.bottleneck, limiter=result.limiter,
                                compute_s=result.compute_s, exposure_s=result.mean_exposure()),
        analytical=AnalyticalStep(step_time_s=est.step_time_s, lower_bound_s=est.lower_bound_s,
                                  tokens_per_s=est.tokens_per_s, bottleneck=est.bottleneck, limiter=est.limiter,
                                  exposure_s=est.exposure),
        model_tflops_per_gpu=w.model_flops_per_step() / result.step_time_s / hw.num_gpus / 1e12,
        memory=MemorySummary(gpu_peak_gib=est.memory.gpu_peak_gib(), gpu_budget_gib=budget.gpu_bytes / GIB,
                             host_total_gib=est.memory.host_total_gib(),
                             host_state_bytes_per_param=est.memory.host_bytes_per_param),
    )
    if args.out:
        write_run_dir(args.out, result.trace, result.exposure, summary, policy, hw)
    if args.json:
        print(summary.to_json())
    else:
        _print_tables(summary, result, est)
    return 0


def run_peer_simulate(args: argparse.Namespace) -> int:
    """One step of a peer system: its own plan in the same simulator, its own memory model."""
    if args.policy:
        raise SlideDPError(f"--policy applies to slidedp only; {args.system} runs as the measured peer does")
    spec = load_model_spec(args.model)
    hw = resolve_hardware(args.hardware, args.gpus)
    step = peer_step(args.system, spec, hw, args.seq, args.batch)
    w = step.w
    budget = resolve_budget(hw, args.gpu_budget, args.host_limit)
    mem = estimate_peer_memory(step)
    problems = mem.shortfalls(budget.gpu_bytes, budget.host_bytes)
    if problems:
        raise SlideDPError(f"{args.system} does not fit: " + "; ".join(problems))
    result = simulate_peer(step)
    if args.trace:
        save_trace(result.trace, args.trace)
    summary = RunSummary(
        model=spec.name, model_spec=spec.to_dict(), hardware=hw.name, gpus=hw.num_gpus, seq=w.seq,
        batch=w.global_batch, tokens_per_step=w.tokens_per_step, system=args.system, source="simulated",
        step_time_s=result.step_time_s, tokens_per_s=result.tokens_per_s, limiter=result.limiter,
        bottleneck=result.bottleneck,
        simulated=SimulatedStep(step_time_s=result.step_time_s, tokens_per_s=result.tokens_per_s,
                                bottleneck=result.bottleneck, limiter=result.limiter,
                                compute_s=result.compute_s, exposure_s=result.mean_exposure()),
        model_tflops_per_gpu=w.model_flops_per_step() / result.step_time_s / hw.num_gpus / 1e12,
        memory=MemorySummary(gpu_peak_gib=mem.gpu_peak_gib(), gpu_budget_gib=budget.gpu_bytes / GIB,
                             host_total_gib=mem.host_total_gib(), host_state_bytes_per_param=mem.host_bytes_per_param),
    )
    if args.out:
        write_run_dir(args.out, result.trace, result.exposure, summary, None, hw)
    if args.json:
        print(summary.to_json())
    else:
        console = Console()
        console.print(f"[bold]{spec.name}[/] on [bold]{hw.name}[/] ({hw.num_gpus} GPU) - seq {w.seq}, batch "
                      f"{w.global_batch} ({w.tokens_per_step:,} tokens/step)")
        console.print(f"system: {args.system} - {step.system.summary}; recompute per layer, "
                      f"micro-batch {w.policy.micro_batch} per rank")
        _print_step_tables(summary, result, None)
    return 0


def _print_tables(s: RunSummary, result, est) -> None:
    console = Console()
    console.print(f"[bold]{s.model}[/] on [bold]{s.hardware}[/] ({s.gpus} GPU) - seq {s.seq}, "
                  f"batch {s.batch} ({s.tokens_per_step:,} tokens/step)")
    p = s.policy
    console.print(f"policy: params {p['param_route']}, grads {p['grad_route']}, {p['chunks_per_layer']} chunks/layer, "
                  f"prefetch {p['prefetch_depth']}, activations {p['activation']}, micro-batch {p['micro_batch']} x "
                  f"{p['accumulation']}, update {p['update_schedule']}"
                  + (f", optimizer state of the first {p['gpu_state_units']} units on the GPU"
                     if p.get("gpu_state_units") else ""))
    _print_step_tables(s, result, est)


def _print_step_tables(s: RunSummary, result, est) -> None:
    """Step, exposure, busiest resources and memory; the analytical column only where there is an estimate."""
    console = Console()
    step = Table(title="Step")
    step.add_column("metric")
    step.add_column("simulated (DES)", justify="right")
    sim, ana = s.simulated, s.analytical
    if ana is not None:
        step.add_column("analytical", justify="right")
    cells = (lambda *v: v) if ana is not None else (lambda *v: v[:-1])
    step.add_row(*cells("step time (s)", f"{sim.step_time_s:.3f}", ana and f"{ana.step_time_s:.3f}"))
    step.add_row(*cells("tokens/s", f"{sim.tokens_per_s:,.0f}", ana and f"{ana.tokens_per_s:,.0f}"))
    step.add_row(*cells("model TFLOP/s per GPU", f"{s.model_tflops_per_gpu:.0f}", ""))
    step.add_row(*cells("busiest resource", sim.bottleneck, ana and ana.bottleneck))
    step.add_row(*cells("limited by", sim.limiter, ana and ana.limiter))
    if ana is not None:
        step.add_row("lower bound (s)", "", f"{ana.lower_bound_s:.3f}")
    console.print(step)

    exp = Table(title="Where the GPU time goes (rank mean, seconds)")
    exp.add_column("category")
    exp.add_column("simulated", justify="right")
    exp.add_column("% of step", justify="right")
    if ana is not None:
        exp.add_column("analytical", justify="right")
    exp.add_row(*cells("compute", f"{sim.compute_s:.3f}", f"{100 * sim.compute_s / sim.step_time_s:.1f}",
                       est and f"{est.compute_s:.3f}"))
    for c in EXPOSURE_CATEGORIES:
        exp.add_row(*cells(f"exposed {c}", f"{sim.exposure_s[c]:.3f}",
                           f"{100 * sim.exposure_s[c] / sim.step_time_s:.1f}", ana and f"{ana.exposure_s[c]:.3f}"))
    console.print(exp)

    util = Table(title="Busiest resources (simulated)")
    util.add_column("resource")
    util.add_column("busy (s)", justify="right")
    util.add_column("utilization", justify="right")
    for name, frac in sorted(result.utilization.items(), key=lambda kv: -kv[1])[:8]:
        util.add_row(name, f"{result.busy_s[name]:.3f}", f"{100 * frac:.1f}%")
    console.print(util)

    mem = s.memory
    console.print(f"memory: GPU peak {mem.gpu_peak_gib:.1f} / {mem.gpu_budget_gib:.1f} GiB per GPU; "
                  f"host {mem.host_total_gib:.1f} GiB ({mem.host_state_bytes_per_param:.0f} B/param state)")
