"""Refit a hardware profile from run directories, and validate predictions against measurements.

A run directory (measured by the runtime, or simulated) holds the trace, the policy, the hardware profile
and a summary with the model's shape. The refit reads what each resource actually delivered in the trace:
H2D and D2H bandwidth and latency from the copy operations, how much longer the CPU update is busy inside a
step than the simulator prices it (host.step_update_factor, from the exact mode's optimizer operations; each compact
mode's update rate from its own runs; a fixed cost per call of each mode's update, host.update_call_us, where that
mode's runs called it at two or more sizes), and the GPU rates
from the per-layer forward times across runs of different sizes; with shape-aware curves, how much longer the GPU's
operations take in a step than in the micro-benchmarks (gpu.compute.step_factor, from the GPU-bound decoder
layers) and the achieved bandwidth of the loss head's logits chain from the head's forward + backward times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import brentq, nnls

from slidedp.calibration.fits import fit_compute, fit_link
from slidedp.errors import SlideDPError
from slidedp.hardware import HardwareProfile, HostSpec
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.report.rundir import HARDWARE_FILE, load_run
from slidedp.sim import simulate
from slidedp.workload import StepWorkload, policy_units


@dataclass
class RunRecord:
    label: str
    spec: ModelSpec
    policy: Policy
    seq: int
    batch: int
    ranks: int
    adam_threads: int | None
    measured_s: float
    measured_limiter: str
    trace: pd.DataFrame
    attention_span: float | None = None  # packed rows through the varlen kernel (RunSummary.attention_span)
    device: str | None = None  # where a measured run computed (RunSummary.device); None: simulated or not said
    hardware: str | None = None  # the profile the run was made or predicted with (RunSummary.hardware)
    hardware_file: str | None = None  # that profile as its run directory saved it (rundir.HARDWARE_FILE)

    @property
    def measured_on_cpu(self) -> bool:
        """A run measured with the CPU as its device: a profile of a GPU host does not describe it."""
        return self.device is not None and not self.device.startswith("cuda")

    def workload(self, hw: HardwareProfile) -> StepWorkload:
        machine = hw if hw.num_gpus == self.ranks else hw.with_gpus(self.ranks)
        policy = self.policy if self.adam_threads is None else replace(self.policy, adam_threads=self.adam_threads)
        return StepWorkload(self.spec, machine, policy, self.seq, self.batch, attention_span=self.attention_span)


def load_record(path: str | Path) -> RunRecord:
    run = load_run(path)
    s = run.summary
    missing = s.missing("model_spec", "policy", "seq", "batch", "step_time_s")
    if missing:
        raise SlideDPError(f"run {str(path)!r}: summary.json lacks {', '.join(missing)}")
    ranks = s.ranks if "ranks" in s.given else s.gpus if "gpus" in s.given else 1
    return RunRecord(label=Path(path).name, spec=ModelSpec(**s.model_spec), policy=Policy.from_dict(s.policy),
                     seq=int(s.seq), batch=int(s.batch), ranks=int(ranks), adam_threads=s.adam_threads,
                     measured_s=float(s.step_time_s),
                     measured_limiter=str(s.limiter if "limiter" in s.given else ""), trace=run.trace,
                     attention_span=s.attention_span, device=s.device if "device" in s.given else None,
                     hardware=s.hardware if "hardware" in s.given else None,
                     hardware_file=str(run.path / HARDWARE_FILE) if (run.path / HARDWARE_FILE).is_file() else None)


def validate(records: list[RunRecord], hw: HardwareProfile) -> pd.DataFrame:
    """Predicted vs measured step time per run, the error, and whether the limiter matches."""
    rows = []
    for r in records:
        try:
            sim = simulate(r.workload(hw))
        except SlideDPError as exc:
            raise SlideDPError(f"run {r.label!r} on {hw.name}: {exc}{_other_profile_hint(r, hw)}") from None
        rows.append({"label": r.label, "measured_s": r.measured_s, "predicted_s": sim.step_time_s,
                     "error_percent": 100 * (sim.step_time_s - r.measured_s) / r.measured_s,
                     "measured_limiter": r.measured_limiter, "predicted_limiter": sim.limiter,
                     "limiter_match": r.measured_limiter == sim.limiter})
    return pd.DataFrame(rows)


def _other_profile_hint(r: RunRecord, hw: HardwareProfile) -> str:
    """Where a run cannot be predicted on ``hw`` and was made with another profile: how to name that one."""
    if not r.hardware or r.hardware == hw.name:
        return ""
    saved = f", saved as {r.hardware_file}" if r.hardware_file else ""
    return f" (the run was made with {r.hardware}{saved}: give that profile)"


def mape(table: pd.DataFrame) -> float:
    return float(table["error_percent"].abs().mean())


def _copies(trace: pd.DataFrame, op: str) -> pd.DataFrame:
    return trace[(trace.op == op) & (trace.end_s > trace.start_s) & (trace.bytes > 0)]


def uncontended_copies(trace: pd.DataFrame, op: str, hw: HardwareProfile) -> pd.DataFrame:
    """One run's ``op`` copies that no other rank's copy of the same kind overlapped behind the same PCIe
    switch (rank r on GPU r): the per-GPU link's own rate. Copies that overlapped shared the switch's uplink,
    so their rate is the uplink's share (27.5 GB/s each for two GPUs behind a 55 GB/s switch), not the link's."""
    rows = _copies(trace, op)
    if rows.empty or "rank" not in rows or rows["rank"].nunique() < 2:
        return rows
    group = {g: i for i, sw in enumerate(hw.switches) for g in sw.gpus}
    shares = rows["rank"].map(lambda r: group.get(int(r), -1 - int(r))).to_numpy()  # unswitched: alone
    start, end, rank = rows.start_s.to_numpy(), rows.end_s.to_numpy(), rows["rank"].to_numpy()
    overlapped = (start[:, None] < end[None, :]) & (start[None, :] < end[:, None]) & \
        (rank[:, None] != rank[None, :]) & (shares[:, None] == shares[None, :])
    return rows[~overlapped.any(axis=1)]


def _copy_fit(rows: pd.DataFrame):
    if rows.empty:
        return None
    dur = (rows.end_s - rows.start_s).to_numpy()
    size = rows.bytes.to_numpy()
    if len(np.unique(np.round(size))) >= 2:
        return fit_link(size, dur)
    return None if dur.sum() <= 0 else float(size.sum() / dur.sum())


def refit_profile(base: HardwareProfile, records: list[RunRecord]) -> tuple[HardwareProfile, dict]:
    """A copy of ``base`` with the rates these runs measured; the report says what was fitted and how well."""
    if not records:
        raise SlideDPError("refit needs at least one run directory")
    trace = pd.concat([r.trace for r in records], ignore_index=True)
    gpu, host = base.gpu, base.host
    report: dict = {"warnings": []}
    for op, field in (("h2d_param", "h2d_gbps"), ("d2h_grad", "d2h_gbps")):
        alone = pd.concat([uncontended_copies(r.trace, op, base) for r in records], ignore_index=True)
        if alone.empty and not _copies(trace, op).empty:
            report["warnings"].append(f"{field}: kept {base.name}'s value, every {op} copy of these runs shared "
                                      f"its PCIe switch with another rank's, so none shows the link alone")
            continue
        try:
            fit = _copy_fit(alone)
        except SlideDPError as exc:  # e.g. a CPU run's copies, whose times need not grow with their size
            report["warnings"].append(f"{field}: kept {base.name}'s value, the runs' {op} copies give no "
                                      f"credible fit ({exc})")
            continue
        if fit is None:
            continue
        if isinstance(fit, float):
            gpu = replace(gpu, **{field: fit / 1e9})
            report[field] = {"value": fit / 1e9, "method": "bytes / busy time (one transfer size)"}
        else:
            gpu = replace(gpu, **{field: fit.bandwidth_Bps / 1e9, "pcie_latency_us": fit.latency_s * 1e6})
            report[field] = {"value": fit.bandwidth_Bps / 1e9, "latency_us": fit.latency_s * 1e6,
                             "residual": fit.residual}
    if (trace.op == "adam").any():
        fused = not (trace.op == "cast").any()
        host = replace(host, fused_cast=fused)  # the kernel writes the bf16 copy: no separate cast pass
        exact = [r for r in records if r.policy.state_precision.is_exact]
        compact = [r for r in records if not r.policy.state_precision.is_exact]
        calls, call_report = fit_update_call_us(records, replace(base, gpu=gpu, host=host))
        host = replace(host, update_call_us={**host.update_call_us, **calls})
        report["update_call_us"] = call_report
        factor, runs = fit_step_update_factor(exact, replace(base, gpu=gpu, host=host))
        if runs:
            host = replace(host, step_update_factor=factor)
            report["step_update_factor"] = {"value": factor, "runs": runs, "fused": fused}
        host, report_modes = refit_state_update_rates(compact, replace(base, gpu=gpu, host=host))
        report.update(report_modes)
    gpu, report_compute = _refit_compute(gpu, records)
    report["warnings"].extend(report_compute.pop("warnings", []))
    report.update(report_compute)
    if not report["warnings"]:
        del report["warnings"]
    if gpu.compute is not None:
        factor, runs = fit_step_compute_factor(records, replace(base, gpu=gpu, host=host))
        if factor is not None:
            gpu = replace(gpu, compute=replace(gpu.compute, step_factor=factor))
            report["step_compute_factor"] = {"value": factor, "runs": runs}
        logits, runs = fit_logits_gbps(records, replace(base, gpu=gpu, host=host))
        if logits is not None:
            gpu = replace(gpu, compute=gpu.compute.with_module_gbps("logits", logits))
            report["logits_gbps"] = {"value": logits, "runs": runs}
    notes = (base.notes + " | " if base.notes else "") + f"refitted from {len(records)} run(s)"
    return replace(base, name=f"{base.name}-refit", gpu=gpu, host=host, notes=notes), report


def rank0_ops(trace: pd.DataFrame, ops: tuple[str, ...]) -> pd.DataFrame:
    """Rank 0's operations named ``ops`` in a trace (measured or simulated; a one-process trace has no rank)."""
    t = trace[trace["rank"] == 0] if "rank" in trace else trace
    return t[t.op.isin(ops)]


def busy_seconds(trace: pd.DataFrame, op: str) -> float:
    """Rank 0's busy seconds in ``op`` (e.g. "adam": the CPU update's chunks, wherever they ran in the step)."""
    t = rank0_ops(trace, (op,))
    return float((t.end_s - t.start_s).sum())


def unit_pass_seconds(trace: pd.DataFrame, first: int, last: int) -> float:
    """Forward + backward seconds of rank 0's units ``first`` .. ``last``."""
    t = rank0_ops(trace, ("fwd", "bwd"))
    t = t[(t.unit >= first) & (t.unit <= last)]
    return float((t.end_s - t.start_s).sum())


def head_pass_seconds(trace: pd.DataFrame) -> float:
    """Forward + backward seconds of rank 0's loss head (the last unit, whatever its index)."""
    units = rank0_ops(trace, ("fwd", "bwd")).unit
    return 0.0 if units.empty else unit_pass_seconds(trace, int(units.max()), int(units.max()))


def fit_step_update_factor(records: list[RunRecord], base: HardwareProfile) -> tuple[float, int]:
    """host.step_update_factor that makes the simulated CPU update as busy as the runs measured it: ``base``'s
    factor times the mean over runs of measured / simulated busy seconds of the update (rank 0), so what the
    simulator already prices (the rate alone, the copies' contention) is not counted twice. Returns the factor
    and how many runs had an update to compare (none: ``base``'s factor)."""
    ratios = [ratio for _, ratio in update_busy_ratios(records, base)]
    if not ratios:
        return base.host.step_update_factor, 0
    factor = base.host.step_update_factor * float(np.mean(ratios))
    return min(10.0, max(0.25, factor)), len(ratios)


def update_calls(trace: pd.DataFrame) -> int:
    """Rank 0's calls of the CPU update in a trace (one "adam" operation per chunk it updates)."""
    return len(rank0_ops(trace, ("adam",)))


def update_busy_ratios(records: list[RunRecord], base: HardwareProfile) -> list[tuple[StepWorkload, float]]:
    """Each run with a CPU update: its workload on ``base`` and the measured / simulated busy seconds of the
    update (rank 0), each less its calls' fixed cost (host.update_call_us), so that a rate fitted from the ratio
    does not count that cost again."""
    out = []
    for r in records:
        w = r.workload(base)
        call = w.update_call_latency
        measured = busy_seconds(r.trace, "adam") - update_calls(r.trace) * call
        if measured <= 0:
            continue
        sim = simulate(w).trace
        simulated = busy_seconds(sim, "adam") - update_calls(sim) * call
        if simulated > 0:
            out.append((w, measured / simulated))
    return out


def fit_update_call_us(records: list[RunRecord], base: HardwareProfile) -> tuple[dict[str, float], dict]:
    """host.update_call_us for each host-state mode whose runs called the CPU update at two or more sizes: per
    mode, non-negative least squares of the measured busy seconds of each run's update (rank 0) on what ``base``
    prices for its parameters (a scale: the rate) and its number of calls (the cost). Runs of one call size cannot
    tell a cost per call from a slower rate, so such a mode is left out, and the report says why. Returns the
    fitted modes' costs (microseconds) and a report per mode."""
    bare = replace(base, host=replace(base.host, update_call_us={}))
    by_mode: dict[str, list[tuple[float, int, float]]] = {}
    for r in records:
        measured = busy_seconds(r.trace, "adam")
        if measured <= 0:
            continue
        w = r.workload(bare)
        by_mode.setdefault(w.state.name, []).append(
            (busy_seconds(simulate(w).trace, "adam"), update_calls(r.trace), measured))
    fitted, report = {}, {}
    for mode, rows in sorted(by_mode.items()):
        per_second = [n / priced for priced, n, _ in rows if priced > 0]
        if len(per_second) < 2 or max(per_second) <= 1.2 * min(per_second):
            report[mode] = {"runs": len(rows), "why": "its runs' calls per priced second differ by 20% or less "
                                                      "(e.g. chunks_per_layer 1 and 4 differ by 4x): a cost per "
                                                      "call is not separable from the rate"}
            continue
        a = np.array([[priced, float(n)] for priced, n, _ in rows])
        b = np.array([measured for *_, measured in rows])
        norm = np.abs(a).max(axis=0)
        coef, _ = nnls(a / norm, b)
        coef = coef / norm
        call = min(0.1, float(coef[1]))  # 100 ms a call: HostSpec's bound
        residual = float(np.sqrt(np.mean(((a @ coef - b) / b) ** 2)))
        fitted[mode] = call * 1e6
        report[mode] = {"value": call * 1e6, "runs": len(rows), "rms_relative_residual": residual}
    return fitted, report


def refit_state_update_rates(records: list[RunRecord], base: HardwareProfile) -> tuple[HostSpec, dict]:
    """``base``'s host with each compact mode's update curve (host.state_update_gparams_per_s) rescaled so the
    simulated update is as busy as the runs of that mode measured it (the mean over its runs of simulated /
    measured busy seconds); a mode the host had not measured gets the curve the workload derives (the fp32
    curve scaled by DRAM bytes), rescaled. Why per mode and not through step_update_factor: a compact update is
    compute-bound where the exact one is DRAM-bound, so one machine can differ from the profile's far more in
    one than in the other (2026-12-06: two lent hosts of one type ran bf16+int8 at 12.3 and 5.4 G params/s and
    fp32 at 4.3 and 4.7); a factor fitted to both made the refit worse than the base (MAPE 26% -> 40%)."""
    host, report = base.host, {}
    by_mode: dict[str, list[tuple[StepWorkload, float]]] = {}
    for w, ratio in update_busy_ratios(records, base):
        by_mode.setdefault(w.state.name, []).append((w, ratio))
    for mode, runs in sorted(by_mode.items()):
        w = runs[0][0]
        # The curve the workload priced: measured, or derived at a constant bytes ratio to fp32's.
        derived = w.state_update_params_per_s * base.host.step_update_factor / base.host.adam_rate(w.adam_threads)
        curve = host.state_update_gparams_per_s.get(mode) or {
            t: v * derived for t, v in base.host.adam_gparams_per_s.items()}
        ratios = [1.0 / ratio for _, ratio in runs]  # simulated / measured: the rate's scale
        scale = min(4.0, max(0.1, float(np.mean(ratios))))  # like step_update_factor's bounds: a fit, not noise
        rescaled = {t: v * scale for t, v in curve.items()}
        host = replace(host, state_update_gparams_per_s={**host.state_update_gparams_per_s, mode: rescaled})
        report[f"state_update_gparams_per_s.{mode}"] = {"scale": scale, "runs": len(ratios),
                                                        "measured_before": mode in base.host.state_update_gparams_per_s}
    return host, report


@dataclass(frozen=True)
class UpdateRepricing:
    """One run's step predicted again with its CPU update priced as busy as the run's trace measured it: how
    much of a prediction's miss is the host CPU's (the lent hosts of one type ran the compact update at 4.6-12.6 G
    params/s, benchmarks/RESULTS.md "Fourteenth session") and how much is left for the rest of the model."""

    rate_gparams_per_s: float  # the update's rate in a step, as the run measured it
    profile_gparams_per_s: float  # the rate the profile priced in a step
    predicted_s: float  # the step predicted with the measured rate


def reprice_update(record: RunRecord, base: HardwareProfile) -> UpdateRepricing | None:
    """``record``'s step simulated on ``base`` with its CPU update rescaled to the busy time the run measured:
    the exact update through host.step_update_factor, a compact mode through its own rate curve (the same fits
    as ``refit_profile``, from this one run). None where the run had no CPU update to compare."""
    runs = update_busy_ratios([record], base)
    if not runs:
        return None
    before = runs[0][0]
    if before.state.is_exact:
        factor, _ = fit_step_update_factor([record], base)
        host = replace(base.host, step_update_factor=factor)
    else:
        host, _ = refit_state_update_rates([record], base)
    after = record.workload(replace(base, host=host))
    return UpdateRepricing(after.state_update_params_per_s / 1e9, before.state_update_params_per_s / 1e9,
                           simulate(after).step_time_s)


def fit_logits_gbps(records: list[RunRecord], base: HardwareProfile) -> tuple[float | None, int]:
    """The achieved bandwidth of the loss head's logits chain (gpu.compute.memory_gbps_by_kind["logits"]) at
    which the head's forward + backward is as long as the runs measured it, in the geometric mean over runs
    (the one unit of a model no decoder-layer sample covers; calibration.shape_fit fits the same value from
    micro-benchmarks of the head where a GPU is at hand). None where ``base`` has no shape-aware curves, no
    run has a head, or no bandwidth up to the chip's would be fast enough."""
    curves = base.gpu.compute
    rows = [(r, m) for r in records if (m := head_pass_seconds(r.trace)) > 0] if curves is not None else []
    if not rows:
        return None, 0

    def mean_log_ratio(log_gbps: float) -> float:
        trial = curves.with_module_gbps("logits", np.exp(log_gbps))
        hw = replace(base, gpu=replace(base.gpu, compute=trial))
        heads = [r.workload(hw).units[-1] for r, _ in rows]
        return float(np.mean([np.log((u.fwd_s + u.bwd_s) / m) for u, (_, m) in zip(heads, rows, strict=True)]))

    lo, hi = np.log(1.0), np.log(20.0 * curves.memory_gbps)
    if mean_log_ratio(hi) > 0:
        return None, len(rows)
    if mean_log_ratio(lo) < 0:
        return float(np.exp(lo)), len(rows)
    return float(np.exp(brentq(mean_log_ratio, lo, hi, xtol=1e-4))), len(rows)


# A run's layer passes count for the step factor only where their operations take this many times the CPU's
# dispatch floor in the base's curves: a dispatch-bound pass measures the CPU issuing kernels (slowed beside
# the optimizer threads, 1.2-2.3x in the H200 runs), not the GPU.
GPU_BOUND_MARGIN = 1.5


def fit_step_compute_factor(records: list[RunRecord], base: HardwareProfile) -> tuple[float | None, int]:
    """gpu.compute.step_factor at which the decoder layers' forward + backward are as long as the runs measured
    them, in the geometric mean over the runs whose layer passes are GPU-bound (GPU_BOUND_MARGIN). None where
    ``base`` has no shape-aware curves or no run qualifies."""
    curves = base.gpu.compute
    if curves is None:
        return None, 0
    rows = []
    for r in records:
        ops = r.spec.layer_forward_ops(r.policy.micro_batch, r.seq)
        if curves.total_seconds(ops) < GPU_BOUND_MARGIN * curves.layer_dispatch_us * 1e-6:
            continue
        measured = unit_pass_seconds(r.trace, 1, r.spec.layers)
        if measured > 0:
            rows.append((r, measured))
    if not rows:
        return None, 0

    def mean_log_ratio(factor: float) -> float:
        hw = replace(base, gpu=replace(base.gpu, compute=replace(curves, step_factor=factor)))
        logs = []
        for r, measured in rows:
            units = r.workload(hw).units[1:1 + r.spec.layers]
            logs.append(np.log(sum(u.fwd_s + u.bwd_s for u in units) / measured))
        return float(np.mean(logs))

    lo, hi = 0.5, 2.0
    if mean_log_ratio(lo) > 0:
        return lo, len(rows)
    if mean_log_ratio(hi) < 0:
        return hi, len(rows)
    return float(brentq(mean_log_ratio, lo, hi, xtol=1e-5)), len(rows)


def _layer_seconds(records: list[RunRecord], gpu) -> tuple[float, float]:
    """Predicted (with ``gpu``) and measured fwd + bwd seconds of the decoder layers over all runs."""
    predicted = measured = 0.0
    for r in records:
        units = policy_units(r.spec, gpu, r.policy, r.seq, r.attention_span)
        layers = r.trace[r.trace.op.isin(["fwd", "bwd"]) & (r.trace.unit >= 1) & (r.trace.unit <= r.spec.layers)]
        if layers.empty:
            continue
        steps = len(layers) / (2 * r.spec.layers * max(1, r.trace["rank"].nunique()))
        predicted += steps * sum(u.fwd_s + u.bwd_s for u in units[1:-1]) * r.trace["rank"].nunique()
        measured += float((layers.end_s - layers.start_s).sum())
    return predicted, measured


def _refit_compute(gpu, records: list[RunRecord]):
    """Fit the layer-time model to per-layer forward times (one micro-batch each) across the runs, then
    scale both rates so forward + backward totals match what was measured (the model's backward is a fixed
    multiple of the forward; long-sequence attention backward is relatively slower than that). A fit that is not
    credible (layer times that do not grow with size: a busy machine, or runs too alike) keeps the base rates and
    says so in ``warnings``."""
    lin, att, tok, sec = [], [], [], []
    for r in records:
        fwd = r.trace[(r.trace.op == "fwd") & (r.trace.unit >= 1) & (r.trace.unit <= r.spec.layers)]
        if fwd.empty:
            continue
        tokens = r.seq * r.policy.micro_batch
        lin.append(r.spec.layer_linear_flops_per_token() * tokens)
        att.append(r.spec.layer_attention_flops_per_token(r.seq, r.attention_span) * tokens)
        tok.append(tokens)
        sec.append(float((fwd.end_s - fwd.start_s).median()) / r.policy.accumulation)
    if not sec:
        return gpu, {}
    report: dict = {"samples": len(sec)}
    try:
        gpu, report = _fit_layer_rates(gpu, lin, att, tok, sec, report)
    except SlideDPError as exc:
        return gpu, {"compute": report, "warnings": [f"GPU compute rates: {exc}; kept the base profile's"]}
    predicted, measured = _layer_seconds(records, gpu)
    if measured > 0:
        ratio = predicted / measured
        gpu = replace(gpu, matmul_tflops=gpu.matmul_tflops * ratio, attention_tflops=gpu.attention_tflops * ratio)
        report["fwd_bwd_scale"] = ratio
    return gpu, {"compute": report}


def _fit_layer_rates(gpu, lin: list[float], att: list[float], tok: list[int], sec: list[float], report: dict):
    """The layer-level rates from forward times: one rate and a fixed cost from few sizes, the full model from
    four or more samples; raises SlideDPError where the samples cannot carry a fit."""
    if len(set(tok)) >= 2 and len(sec) < 4:
        # Too few sizes for the full model: one rate plus a fixed per-layer cost (t = overhead + flops / rate).
        fit = fit_link(np.add(lin, att), sec)
        rate = fit.bandwidth_Bps / 1e12  # "bytes" here are FLOPs
        gpu = replace(gpu, matmul_tflops=rate, attention_tflops=rate, half_efficiency_tokens=0.0,
                      layer_overhead_us=fit.latency_s * 1e6)
        report.update(tflops=rate, overhead_us=fit.latency_s * 1e6, forward_fit_residual=fit.residual)
    elif len(sec) >= 4 and len(set(tok)) >= 2:
        fit = fit_compute(lin, att, tok, sec)
        gpu = replace(gpu, matmul_tflops=fit.matmul_tflops, half_efficiency_tokens=fit.half_efficiency_tokens,
                      attention_tflops=fit.attention_tflops, layer_overhead_us=fit.overhead_s * 1e6)
        report.update(matmul_tflops=fit.matmul_tflops, attention_tflops=fit.attention_tflops,
                      half_efficiency_tokens=fit.half_efficiency_tokens, forward_fit_residual=fit.residual)
    return gpu, report
