"""Host contention on one GPU host, measured and predicted by the simulator's processor-sharing model.

    python -m benchmarks.contention --out DIR [--params 268435456] [--profile h200-x1] [--predict-only]
    python -m benchmarks.contention --refit --out DIR   (an earlier call's results, refitted with this code)

Experiments (each the median of --repeats), with the AdamW pass at T threads (the runtime's one-pass kernel):
  adamT                  the pass alone: seconds
  adamT+h2d+d2h          the pass while H2D and D2H copy on their own streams the whole time: seconds
  adamT+h2d, adamT+d2h   the pass with one copy direction running: seconds
  dma@adamT              H2D and D2H GB/s while the pass runs
  dma                    H2D and D2H at once, alone: GB/s of each
  h2d_x1, h2d_x2         H2D alone on one stream and on two streams at once: GB/s

Predictions: the same flows started together in the simulator's fluid network (sim/fluid.py), with the
profile's capacities and the workload's CPU-pass caps: AdamW is a DRAM flow capped at the worker's rate at T
threads, each copy crosses its PCIe direction, the duplex cap and host DRAM. Written to predictions.json before
anything is measured; measured.json and a table follow. `slidedp calibrate` takes the DRAM capacity from
adam16+h2d+d2h (calibration.contention_bench); the other experiments are held out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.common import log

THREADS = (16, 8, 4)  # the pass's thread counts (the H200 host has 16 cores)
WITH_COPIES = (("h2d", "d2h"), ("h2d",), ("d2h",))


def _name(threads: int, directions: tuple[str, ...]) -> str:
    return f"adam{threads}" + "".join(f"+{d}" for d in directions)


def experiments(threads: tuple[int, ...]) -> list[tuple[str, int, tuple[str, ...]]]:
    """(name, threads, copy directions) of every pass experiment: alone and with copies at each thread count;
    one copy direction only at the largest."""
    out = []
    for t in threads:
        out.append((_name(t, ()), t, ()))
        for dirs in WITH_COPIES if t == max(threads) else WITH_COPIES[:1]:
            out.append((_name(t, dirs), t, dirs))
    return out


def predict(profile: str, params: int, threads: tuple[int, ...] = THREADS) -> dict:
    """Each experiment's flows in the fluid network: seconds of the AdamW pass, GB/s of each copy."""
    from slidedp.hardware import load_hardware
    from slidedp.resources import adam_host_bytes_per_param
    from slidedp.sim.fluid import endless_copy, pass_beside_copies, run_flows

    hw = load_hardware(profile)
    per_param = adam_host_bytes_per_param(2, hw.host.fused_cast)
    copy = {d: endless_copy(hw, d) for d in ("h2d", "d2h")}
    out: dict = {"profile": hw.name, "params": params, "mem_bw_gbps": hw.host.mem_bw_gbps}
    for name, t, dirs in experiments(threads):
        run = pass_beside_copies(hw, per_param * params, hw.host.adam_rate(t) * per_param, dirs)
        out[f"{name}_s"] = run["cpu_end"]
        if dirs == ("h2d", "d2h"):
            out[f"dma@adam{t}_h2d_gbps"], out[f"dma@adam{t}_d2h_gbps"] = run["h2d"] / 1e9, run["d2h"] / 1e9
    alone = run_flows(hw, {"h2d": copy["h2d"], "d2h": copy["d2h"]}, until=1.0)
    out["dma_h2d_gbps"], out["dma_d2h_gbps"] = alone["h2d"] / 1e9, alone["d2h"] / 1e9
    out["h2d_x1_gbps"] = run_flows(hw, {"a": copy["h2d"]}, until=1.0)["a"] / 1e9
    two = run_flows(hw, {"a": copy["h2d"], "b": copy["h2d"]}, until=1.0)
    out["h2d_x2_gbps"] = (two["a"] + two["b"]) / 1e9
    return out


def measure(params: int, repeats: int, threads: tuple[int, ...] = THREADS) -> dict:
    from slidedp.calibration.contention_bench import ContentionRig

    rig = ContentionRig(params)
    if rig.kernel is None:
        raise SystemExit("the one-pass kernel did not build; the experiments time it")
    rig.adam()  # warm-up: pages touched, threads started
    rig.copies(("h2d", "d2h"), seconds=0.5)
    # The pass at all cores, alone, before and after the experiments: how far this host's own AdamW rate moved
    # while they ran (and against the calibration's adam_alone_s), which the contention model cannot know.
    out: dict = {"params": params, "reference_start_s": statistics.median(rig.adam() for _ in range(repeats))}
    for name, t, dirs in experiments(threads):
        if dirs:
            out[f"{name}_s"] = statistics.median(rig.adam_during(dirs, t)[0] for _ in range(repeats))
        else:
            out[f"{name}_s"] = statistics.median(rig.adam(t) for _ in range(repeats))
        if dirs == ("h2d", "d2h"):
            during = [rig.copies_during_adam(dirs, t) for _ in range(repeats)]
            out[f"dma@adam{t}_h2d_gbps"] = statistics.median(r["h2d"] for r in during)
            out[f"dma@adam{t}_d2h_gbps"] = statistics.median(r["d2h"] for r in during)
    alone = [rig.copies(("h2d", "d2h"), seconds=2.0) for _ in range(repeats)]
    out["dma_h2d_gbps"] = statistics.median(r["h2d"] for r in alone)
    out["dma_d2h_gbps"] = statistics.median(r["d2h"] for r in alone)
    out["h2d_x1_gbps"] = statistics.median(rig.copies(("h2d",), seconds=2.0)["h2d"] for _ in range(repeats))
    out["h2d_x2_gbps"] = statistics.median(sum(rig.copies(("h2d", "h2d_b"), seconds=2.0).values())
                                           for _ in range(repeats))
    out["reference_end_s"] = statistics.median(rig.adam() for _ in range(repeats))
    return out


def calibrate_host(base: str, out: Path) -> str:
    """`slidedp calibrate`'s host passes and contention experiments on this host (the calibration set: AdamW
    curve vs threads, and at all cores the pass alone / with H2D / D2H / both): the profile the held-out
    experiments are then predicted with."""
    from slidedp.calibration.contention_bench import contention_benchmark
    from slidedp.calibration.host_bench import host_benchmarks
    from slidedp.calibration.profile_fit import profile_from
    from slidedp.hardware import load_hardware

    m = host_benchmarks(quick=False)
    contention_benchmark(m, quick=False)
    profile, report = profile_from(load_hardware(base), m)
    path = out / "profile.yaml"
    profile.save(path)
    kept = ("contention", "contention_repeat_spread", "mem_bw_gbps")
    (out / "calibration.json").write_text(json.dumps({k: report[k] for k in kept if k in report} | {
        "adam_gparams_per_s": profile.host.adam_gparams_per_s, "dma_interference": profile.host.dma_interference,
        "copy_slowdown": profile.host.copy_slowdown, "dma_interference_curve": profile.host.dma_interference_curve,
        "cpu_dram_weight": profile.host.cpu_dram_weight}, indent=1, default=str))
    return str(path)


def refit(run: Path) -> str:
    """Another call's calibration refitted with this code's contention model (the host curves unchanged, the
    contention fields fitted afresh from its calibration.json): the profile path, written beside it as
    refit.yaml. Not blind when that call's held-out results have been seen; RESULTS says which. calibration.json
    holds the measurements rounded to 4 decimals: with --quick's 5 ms passes a factor may move ~2% from the
    original fit."""
    from dataclasses import replace

    from slidedp.calibration.profile_fit import contention_host
    from slidedp.hardware import load_hardware

    hw = load_hardware(str(run / "profile.yaml"))
    measured = json.loads((run / "calibration.json").read_text())["contention"]
    bare = replace(hw, host=replace(hw.host, dma_interference={}, copy_slowdown={}, dma_interference_curve={},
                                    cpu_dram_weight=1.0))
    path = run / "refit.yaml"
    replace(hw, host=contention_host(measured, bare)).save(path)
    return str(path)


def _compare(predicted: dict, measured: dict, calibration: dict | None = None) -> None:
    keys = [k for k in predicted if k in measured and k != "params"]
    within = 0
    for key in keys:
        p, m = predicted[key], measured[key]
        within += abs(p - m) <= 0.1 * m
        error = f"{100 * (p - m) / m:+6.1f}%" if m else "   n/a"
        log(f"{key:20s} predicted {p:9.4f} measured {m:9.4f} error {error}")
    log(f"{within} of {len(keys)} within 10%")
    if "reference_start_s" in measured:
        log(_drift_line(measured, calibration))


def _calibration(out: Path) -> dict | None:
    """The contention measurements of --calibrate-first's calibration in ``out``, if it ran there."""
    path = out / "calibration.json"
    return json.loads(path.read_text()).get("contention") if path.exists() else None


def _drift_line(measured: dict, calibration: dict | None) -> str:
    """How much the all-core pass alone moved from the calibration (when there was one) to the experiments' start
    and end: a miss of the pass's own time by about this much is the host's drift, not contention."""
    start, end = measured["reference_start_s"], measured["reference_end_s"]
    line = (f"all-core pass alone: {start:.4f} s before the experiments, {end:.4f} s after "
            f"({100 * (end / start - 1):+.1f}%)")
    calibrated = (calibration or {}).get("adam_alone_s")
    if calibrated and calibration.get("params") == measured["params"]:
        line += f"; the calibration's {calibrated:.4f} s ({100 * (start / calibrated - 1):+.1f}% at the start)"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--params", type=int, default=2**28)
    parser.add_argument("--profile", default="h200-x1")
    parser.add_argument("--threads", type=int, nargs="+", default=list(THREADS),
                        help="AdamW thread counts of the pass experiments (one-direction copies at the largest)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calibrate-first", action="store_true",
                        help="calibrate the host on this machine first and predict with that profile")
    parser.add_argument("--predict-only", action="store_true")
    parser.add_argument("--refit", action="store_true",
                        help="--out is an earlier call's results (profile.yaml, calibration.json, measured.json): "
                             "refit its contention with this code and compare with what it measured; no timing")
    args = parser.parse_args()
    out = Path(args.out)
    if args.refit:
        measured = json.loads((out / "measured.json").read_text())
        threads = tuple(sorted({int(k[4:-2]) for k in measured if k.startswith("adam") and k[4:-2].isdigit()},
                               reverse=True))
        _compare(predict(refit(out), measured["params"], threads), measured, _calibration(out))
        return
    out.mkdir(parents=True, exist_ok=True)
    profile = calibrate_host(args.profile, out) if args.calibrate_first else args.profile
    threads = tuple(args.threads)
    predicted = predict(profile, args.params, threads)
    (out / "predictions.json").write_text(json.dumps(predicted, indent=1))
    log(f"predicted: {predicted}")
    if args.predict_only:
        return
    measured = measure(args.params, args.repeats, threads)
    (out / "measured.json").write_text(json.dumps(measured, indent=1))
    _compare(predicted, measured, _calibration(out))


if __name__ == "__main__":
    main()
