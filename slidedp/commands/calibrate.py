"""``slidedp calibrate``: micro-benchmarks of this machine, or a refit from run directories."""

from __future__ import annotations

import argparse

import torch
from rich.console import Console

from slidedp.commands.progress import progress_callback
from slidedp.commands.validation_table import (
    cpu_runs_warning,
    load_records,
    more_ranks_warning,
    print_warning,
    validation_table,
)
from slidedp.errors import SlideDPError
from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.output_paths import check_output_file


def brief(value) -> str:
    """A fit's report entry as one readable line: floats to four significant digits, dicts as key=value."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={brief(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(brief(v) for v in value) + "]"
    return str(value)


def run_calibrate(args: argparse.Namespace) -> int:
    from slidedp.calibration.contention_bench import contention_benchmark
    from slidedp.calibration.from_run import mape, refit_profile, validate
    from slidedp.calibration.gpu_bench import gpu_benchmarks, layer_benchmarks
    from slidedp.calibration.host_bench import host_benchmarks, peer_thread_counts
    from slidedp.calibration.peer_bench import peer_adam_benchmarks
    from slidedp.calibration.profile_fit import profile_from
    from slidedp.calibration.shape_bench import shape_samples

    console = Console()
    host_only = getattr(args, "host_only", False)
    if host_only and (args.model or args.from_run):
        raise SlideDPError("--host-only measures the CPU alone; it takes neither --model nor --from-run")
    if args.quick and args.from_run:
        raise SlideDPError("--quick shortens the micro-benchmarks, which --from-run does not run: give one of them")
    if args.model and args.from_run:
        raise SlideDPError("--model times a model's layers on this machine, which --from-run does not do (each run "
                           "names its own model): give one of them")
    out = check_output_file(args.out, "--out", (".yaml", ".yml", ".json"))  # a profile, as load_hardware reads
    base = load_hardware(args.base)
    for model in args.model or []:  # a bad --model fails now, not after minutes of benchmarks
        load_model_spec(model)
    if args.from_run:
        records = load_records(args.from_run)
        warning = cpu_runs_warning(records, base)
        if warning:
            print_warning(f"{warning}; the refit describes this CPU as the device")
        warning = more_ranks_warning(records, base)
        if warning:
            print_warning(warning)
        before = validate(records, base)
        profile, report = refit_profile(base, records)
        after = validate(records, profile)
        console.print(validation_table(f"before: {base.name} (MAPE {mape(before):.1f}%)", before))
        console.print(validation_table(f"after: {profile.name} (MAPE {mape(after):.1f}%)", after))
    else:
        with progress_callback("micro-benchmarks") as progress:
            measured = host_benchmarks(args.quick, progress)
            peer_adam_benchmarks(measured, args.quick, peer_thread_counts(), progress)
            if host_only:
                # The lent hosts of one machine type differ up to 2x in these rates (benchmarks/RESULTS.md,
                # "Eleventh session's device calls"): refresh the CPU side, keep the calibrated GPU side.
                console.print(f"  --host-only: GPU compute, PCIe, contention and collectives kept from {base.name}")
            else:
                gpu_benchmarks(measured, args.quick, progress)
                contention_benchmark(measured, args.quick)
                for model in args.model or []:
                    layer_benchmarks(measured, model, args.quick, progress)
                if torch.cuda.is_available():  # the shape-aware compute curves (gpu.compute)
                    measured.shapes = shape_samples(args.model[0] if args.model else None, args.quick, progress)
                else:
                    console.print("  no CUDA device: PCIe, DRAM under DMA contention, GPU compute curves and "
                                  f"collectives are kept from {base.name}; only the host and (with --model) "
                                  "this CPU's layer timings are measured")
        profile, report = profile_from(base, measured)
    warnings = report.pop("warnings", [])
    for key, value in report.items():
        console.print(f"  {key}: {brief(value)}", highlight=False)
    for line in warnings:  # a fit that was not credible: its fields kept the base profile's values
        print_warning(line)
    profile.save(out)
    console.print(f"wrote {args.out}")
    return 0
