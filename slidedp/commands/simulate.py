"""``slidedp simulate``: analytical estimate and discrete-event simulation of one policy, side by side; with
``--system`` a peer system (slidedp.peers) simulated the same way (no analytical model for peers)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, split_cut_name
from slidedp.model import estimate_step, memory_shortfalls
from slidedp.model.step_model import StepEstimate
from slidedp.model_spec import load_model_spec
from slidedp.output_paths import check_output_dir, check_output_file
from slidedp.peers import (
    SLIDEDP,
    SYSTEMS,
    PeerMemory,
    PeerStep,
    estimate_peer_memory,
    peer_step,
    peer_system,
    simulate_peer,
    system_workload,
)
from slidedp.problem import Budget, capacity_budget, resolve_budget, resolve_hardware, resolve_problem
from slidedp.report.rundir import write_run_dir
from slidedp.run_summary import AnalyticalStep, MemorySummary, RunSummary, SimulatedStep, span_field
from slidedp.sim import SimResult, simulate
from slidedp.state_choice import AUTO, StateChoice, choose_state, measured_states, state_options
from slidedp.trace import EXPOSURE_CATEGORIES, TRACE_SUFFIXES, save_trace
from slidedp.workload import StepWorkload


def check_outputs(args: argparse.Namespace) -> None:
    """--trace and --out, before anything is simulated."""
    if args.trace:
        check_output_file(args.trace, "--trace", TRACE_SUFFIXES)
    if args.out:
        refuse_a_training_run(check_output_dir(args.out, "--out"))


def refuse_a_training_run(out: Path) -> None:
    """A simulation writes the run-directory files a training run measured (summary, trace, exposure, policy,
    profile): into a directory that holds a training run's history (checkpoints, logs:
    checkpoint_history.training_history) it would replace them and leave the rest beside them. An earlier
    simulation's directory is simply written again."""
    from slidedp.runtime.checkpoint_history import training_history

    held = [p.name for p in training_history(out)]
    if held:
        raise SlideDPError(f"--out {str(out)!r} holds a training run ({', '.join(held)}); a simulation would "
                           f"replace its measured files: choose another --out")


def run_simulate(args: argparse.Namespace) -> int:
    check_outputs(args)
    if peer_system(getattr(args, "system", SLIDEDP)) is not None:
        return run_peer_simulate(args)
    spec, hw, policy, w = resolve_problem(args.model, args.hardware, args.gpus, args.seq, args.batch, args.policy,
                                          getattr(args, "hosts", 1), getattr(args, "attention_span", None))
    budget = resolve_budget(hw, args.gpu_budget, args.host_limit)
    w, est, result, choice = _simulate_state(w, getattr(args, "state", None), budget)
    policy = w.policy
    if args.trace:
        save_trace(result.trace, args.trace)
    summary = RunSummary(
        model=spec.name, model_spec=spec.to_dict(), hardware=hw.name, gpus=hw.num_gpus, seq=w.seq,
        **span_field(w.attention_span), batch=w.global_batch, tokens_per_step=w.tokens_per_step,
        policy=policy.to_dict(), source="simulated",
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
    peers = peer_memory_rows(peer_host_needs(spec, hw, w.seq, w.global_batch), w, est, budget,
                             capacity_budget(hw, args.gpu_budget, args.host_limit)) \
        if getattr(args, "peers", False) else None
    if args.json:  # what the tables say, as one object
        extra = {} if choice is None else {"state_choice": asdict(choice)}
        print(json.dumps({**summary.to_dict(), **extra, **({"peers": peers} if peers is not None else {})},
                         indent=2))
    else:
        _print_tables(summary, result, est, w.hosts)
        _print_state(w, est, choice)
        if peers is not None:
            _print_peer_host_needs(peers, w, budget)
    return 0


def _estimate_and_shortfalls(w: StepWorkload, budget: Budget) -> tuple[StepEstimate, list[str]]:
    est = estimate_step(w)
    return est, memory_shortfalls(est.memory, budget.gpu_bytes, budget.host_bytes)


def _simulate_state(w: StepWorkload, state: str | None, budget: Budget
                    ) -> tuple[StepWorkload, StepEstimate, SimResult, StateChoice | None]:
    """The policy's step in host-state precision ``state`` (None: the policy's own), simulated; with ``auto``
    every mode is simulated where it fits and slidedp.state_choice picks one. Refuses a step that does not fit."""
    if state != AUTO:
        if state is not None:
            w = w.with_policy(w.policy.with_(state=state))
        est, problems = _estimate_and_shortfalls(w, budget)
        if problems:
            hint = ("; compact host state needs less (--state auto, or e.g. --state bf16+int8)"
                    if w.state.is_exact and any(p.startswith("host memory") for p in problems) else "")
            raise SlideDPError(f"policy does not fit (host state {w.state.name}): " + "; ".join(problems) + hint)
        return w, est, simulate(w), None
    runs: dict[str, tuple[StepWorkload, StepEstimate, SimResult]] = {}
    misfits: dict[str, list[str]] = {}
    for mode in state_options(AUTO):
        wm = w.with_policy(w.policy.with_(state=mode))
        est, problems = _estimate_and_shortfalls(wm, budget)
        if problems:
            misfits[mode] = problems
        else:
            runs[mode] = (wm, est, simulate(wm))
    if not runs:
        raise SlideDPError("policy does not fit in any host-state precision: "
                           + "; ".join(f"{m}: {', '.join(p)}" for m, p in misfits.items()))
    choice = choose_state({m: (runs[m][2].step_time_s if m in runs else None) for m in state_options(AUTO)},
                          measured_states(w.hw.host))
    return (*runs[choice.state], choice)


def peer_host_needs(spec, hw, seq: int, batch: int) -> list[tuple[str, PeerMemory]]:
    """Every peer's memory for this model and batch, from its own memory model (slidedp.peers.memory)."""
    rows = []
    for name, system in SYSTEMS.items():
        try:
            rows.append((name, estimate_peer_memory(PeerStep(system, system_workload(system, spec, hw, seq, batch)))))
        except SlideDPError:  # a batch this peer cannot run on these GPUs
            continue
    return rows


def _print_state(w: StepWorkload, est: StepEstimate, choice: StateChoice | None) -> None:
    console = Console()
    sp = w.state
    detail = "exact AdamW" if sp.is_exact else f"master {sp.master}, moments {sp.moments}"
    console.print(f"host state {sp.name} ({detail}): {sp.host_bytes_per_param(w.policy.grad_bytes):.3g} B/param "
                  f"held, {w.adam_bytes_per_param:.3g} B/param moved by the CPU update"
                  + ("" if w.policy.gpu_state_units == 0 else
                     f"; the {w.policy.gpu_state_units} GPU-held units keep fp32 state on the GPU"))
    if choice is not None:
        times = ", ".join(f"{m} {'does not fit' if t is None else f'{t:.3f} s'}" for m, t in choice.step_s.items())
        console.print(f"--state auto chose {choice.state}: {choice.reason} (simulated: {times})")
    if w.state_update_rate_needs_saying:
        console.print(w.state_update_rate_note)


def peer_memory_rows(rows: list[tuple[str, PeerMemory]], w: StepWorkload, est: StepEstimate,
                     budget: Budget, capacity: Budget) -> list[dict]:
    """Host bytes per parameter (state alone, and all the system holds on the host), host and GPU peak bytes,
    and whether each system fits, SlideDP in its host-state precision first: what the --peers table prints and
    --json writes. SlideDP is held to the planning ``budget`` (its margin is its allowance for the allocator), a
    peer to the machine's ``capacity``: its GPU peak counts the allocator's fragmentation itself."""
    mem = est.memory
    entries = [(f"slidedp ({w.state.name})", mem.host_bytes_per_param, mem.host_total, mem.params, mem.gpu_peak,
                budget)]
    entries += [(name, m.host_bytes_per_param, m.host_total, m.params, m.gpu_peak, capacity) for name, m in rows]
    return [{"system": name, "host_state_bytes_per_param": state_bpp, "host_bytes_per_param": host_total / params,
             "host_gib": host_total / GIB, "gpu_peak_gib": gpu_peak / GIB,
             "fits": bool(host_total <= limit.host_bytes and gpu_peak <= limit.gpu_bytes)}
            for name, state_bpp, host_total, params, gpu_peak, limit in entries]


def _print_peer_host_needs(rows: list[dict], w: StepWorkload, budget: Budget) -> None:
    table = Table(title=f"Memory each system needs for {w.model.name}, seq {w.seq}, batch {w.global_batch} "
                        f"(host budget {budget.host_bytes / GIB:.1f} GiB, GPU {budget.gpu_bytes / GIB:.1f} GiB)")
    table.add_column("system", no_wrap=True)
    for col in ("host B/param state", "host B/param all", "host GiB", "GPU peak GiB", "fits"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["system"], f"{r['host_state_bytes_per_param']:.3g}", f"{r['host_bytes_per_param']:.3g}",
                      f"{r['host_gib']:.1f}", f"{r['gpu_peak_gib']:.1f}", "yes" if r["fits"] else "no")
    Console().print(table)


def run_peer_simulate(args: argparse.Namespace) -> int:
    """One step of a peer system: its own plan in the same simulator, its own memory model."""
    if args.policy:
        raise SlideDPError(f"--policy applies to slidedp only; {args.system} runs as the measured peer does")
    if getattr(args, "attention_span", None) is not None:
        raise SlideDPError(f"--attention-span prices slidedp's varlen path for packed rows; {args.system} is "
                           "simulated on whole rows, as it was measured")
    if getattr(args, "state", None) is not None:
        raise SlideDPError(f"--state applies to slidedp only; {args.system} keeps the optimizer state it keeps "
                           "when measured (--peers lists each system's host bytes per parameter)")
    spec = load_model_spec(args.model)
    hw = resolve_hardware(args.hardware, args.gpus)
    step = peer_step(args.system, spec, hw, args.seq, args.batch)
    w = step.w
    budget = capacity_budget(hw, args.gpu_budget, args.host_limit)  # a prediction of the peer's run, not a plan
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
        console.print(_header_line(spec.name, hw.name, hw.num_gpus, 1, w.seq, w.global_batch, w.tokens_per_step))
        console.print(f"system: {args.system} - {step.system.summary}; recompute per layer, "
                      f"micro-batch {w.policy.micro_batch} per rank")
        _print_step_tables(summary, result, None)
    return 0


def _tile_phrase(tile: int, micro_batch_tokens: int) -> str:
    """How a sequence tile reads: a tile as large as the micro-batch still checkpoints the layer's token-wise
    parts, but over one tile, and printing the larger number as a tile size misleads."""
    if not tile:
        return ""
    if tile >= micro_batch_tokens:
        return f" over one sequence tile (the whole micro-batch of {micro_batch_tokens:,} tokens)"
    return f" over sequence tiles of {tile:,} tokens"


def _header_line(model: str, hardware: str, gpus: int, hosts: int, seq: int, batch: int, tokens: int) -> str:
    """The first line of a simulation's output. A profile cut to fewer GPUs (HardwareProfile.with_gpus names it
    ``<name>@<gpus>``) reads ``<name> (1 GPU used)``, not ``<name>@1 (1 GPU)``."""
    name, cut = split_cut_name(hardware)
    where = f"{gpus} GPU{'s' if gpus > 1 else ''}" + (" used" if cut else "") + \
        (f" on each of {hosts} hosts" if hosts > 1 else "")
    return f"[bold]{model}[/] on [bold]{name}[/] ({where}) - seq {seq}, batch {batch} ({tokens:,} tokens/step)"


def _print_tables(s: RunSummary, result, est, hosts: int = 1) -> None:
    console = Console()
    console.print(_header_line(s.model, s.hardware, s.gpus, hosts, s.seq, s.batch, s.tokens_per_step))
    p = s.policy
    console.print(f"policy: params {p['param_route']}, grads {p['grad_route']}, {p['chunks_per_layer']} chunks/layer, "
                  f"prefetch {p['prefetch_depth']}, activations {p['activation']}"
                  + (f" (last {p['kept_layers']} layers kept)" if p.get("kept_layers") else "")
                  + _tile_phrase(p.get("seq_tile_tokens", 0), p["micro_batch"] * s.seq)
                  + f", micro-batch {p['micro_batch']} x "
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
                  f"host {mem.host_total_gib:.1f} GiB ({mem.host_state_bytes_per_param:.3g} B/param state)")
