"""Datasheet limits of the GPUs the presets describe, and the one rule that carries measured compute curves
from the chip they were measured on to another.

Only the H200's curves are measured (benchmarks/results/h200-2026-12-03, `shapes-v2`). Another chip's
preset scales them: GEMM and attention rates by the ratio of dense bf16 peaks, memory-bound bandwidths by
the ratio of memory bandwidths. Kept as measured (assumptions, stated in each preset's notes): the
half-efficiency shapes, the per-kernel costs and the CPU's dispatch floor of a layer pass, which belong
to the software stack and the host CPU rather than the chip. ``python -m slidedp.chips`` rewrites the
presets' ``gpu.compute`` sections from this rule; a test checks the shipped presets still match it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from slidedp.compute import ComputeCurves


@dataclass(frozen=True)
class Chip:
    name: str
    bf16_dense_tflops: float  # tensor cores, bf16 inputs, fp32 accumulation, no sparsity
    memory_gbps: float
    source: str


CHIPS: dict[str, Chip] = {
    "H200": Chip("H200", 989.4, 4800.0, "NVIDIA H200 SXM datasheet (HBM3e 4.8 TB/s; Hopper rates as H100 SXM)"),
    "H100-SXM-80GB": Chip("H100-SXM-80GB", 989.4, 3350.0, "NVIDIA H100 SXM datasheet (HBM3 3.35 TB/s)"),
    "RTX-4090-24GB": Chip("RTX-4090-24GB", 165.2, 1008.0,
                          "NVIDIA Ada whitepaper (bf16 with fp32 accumulate 165.2 TFLOP/s; GDDR6X 1008 GB/s)"),
}
MEASURED_ON = "H200"


def scale_curves(curves: ComputeCurves, source: Chip, target: Chip) -> ComputeCurves:
    """``curves`` measured on ``source``, carried to ``target`` by the ratios of their datasheet limits."""
    compute, memory = target.bf16_dense_tflops / source.bf16_dense_tflops, target.memory_gbps / source.memory_gbps
    return replace(curves, gemm_tflops=curves.gemm_tflops * compute,
                   attention_fwd_tflops=curves.attention_fwd_tflops * compute,
                   attention_bwd_tflops=curves.attention_bwd_tflops * compute,
                   memory_gbps=curves.memory_gbps * memory,
                   memory_gbps_by_kind={k: v * memory for k, v in curves.memory_gbps_by_kind.items()})


def derived_presets(preset_dir: Path) -> dict[Path, object]:
    """Every preset whose GPU is a known chip, with its compute curves derived from the measured chip's."""
    from slidedp.config_io import read_mapping
    from slidedp.hardware import HardwareProfile

    profiles = {p: HardwareProfile.from_dict(read_mapping(p, "hardware profile"), where=p.stem)
                for p in sorted(preset_dir.glob("*.yaml"))}
    measured = next(hw for hw in profiles.values() if hw.gpu.name == MEASURED_ON and hw.gpu.compute is not None)
    out = {}
    for path, hw in profiles.items():
        if hw.gpu.name in CHIPS and hw.gpu.name != MEASURED_ON:
            curves = scale_curves(measured.gpu.compute, CHIPS[MEASURED_ON], CHIPS[hw.gpu.name])
            out[path] = replace(hw, gpu=replace(hw.gpu, compute=curves))
    return out


if __name__ == "__main__":
    for path, profile in derived_presets(Path(__file__).parent / "presets").items():
        profile.save(path)
        print(f"wrote {path}")
