"""Datasheet limits of the GPUs the presets describe, and the one rule that gives each preset of a known chip
its compute curves.

A chip with its own measurement (MEASURED_PRESETS: the preset whose ``gpu.compute`` a calibration on that chip
wrote, named in its notes) gives its curves to every preset of that chip. Any other chip's presets carry the
H200's measured curves (benchmarks/results/h200-2026-12-03, `shapes-v2`): GEMM and attention rates by the ratio
of dense bf16 peaks, memory-bound bandwidths by the ratio of memory bandwidths. Kept as measured (assumptions,
stated in each preset's notes): the half-efficiency shapes, the per-kernel costs and the CPU's dispatch floor of
a layer pass, which belong to the software stack and the host CPU rather than the chip. The datasheet ratio is
a rough rule for the memory-bound kinds: on the H100 the eager modules ran at 0.75-0.98 of the H200's
bandwidth, not 0.70 (benchmarks/RESULTS.md, call59), which is why a measured chip's curves come first.
``python -m slidedp.chips`` rewrites the presets' ``gpu.compute`` sections and compute notes from this rule; a
test checks the shipped presets still match it.
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
MEASURED_ON = "H200"  # the chip whose curves carry to chips without a measurement of their own
# chip -> the preset whose gpu.compute was measured on it (its notes name the calibration)
MEASURED_PRESETS: dict[str, str] = {"H200": "h200-x1", "H100-SXM-80GB": "h100-sxm-x1"}
COMPUTE_NOTE = " | compute: "  # where a derived preset's notes say where its curves come from


def scale_curves(curves: ComputeCurves, source: Chip, target: Chip) -> ComputeCurves:
    """``curves`` measured on ``source``, carried to ``target`` by the ratios of their datasheet limits."""
    compute, memory = target.bf16_dense_tflops / source.bf16_dense_tflops, target.memory_gbps / source.memory_gbps
    return replace(curves, gemm_tflops=curves.gemm_tflops * compute,
                   attention_fwd_tflops=curves.attention_fwd_tflops * compute,
                   attention_bwd_tflops=curves.attention_bwd_tflops * compute,
                   memory_gbps=curves.memory_gbps * memory,
                   memory_gbps_by_kind={k: v * memory for k, v in curves.memory_gbps_by_kind.items()})


def compute_note(chip: Chip) -> str:
    """What a derived preset's notes say of its curves."""
    if chip.name in MEASURED_PRESETS:
        return (f"gpu.compute as measured on this chip, copied from the {MEASURED_PRESETS[chip.name]} preset by "
                f"slidedp.chips (see its notes); assumed unchanged: the CPU dispatch floor of a layer pass.")
    source = CHIPS[MEASURED_ON]
    return (f"gpu.compute carried from the {source.name}'s measured shape curves by slidedp.chips (GEMM and "
            f"attention x {chip.bf16_dense_tflops}/{source.bf16_dense_tflops} dense bf16 TFLOP/s, memory-bound x "
            f"{chip.memory_gbps}/{source.memory_gbps:g} GB/s, from {chip.source}); assumed unchanged: "
            f"half-efficiency shapes, per-kernel costs, the CPU dispatch floor of a layer pass.")


def derived_presets(preset_dir: Path) -> dict[Path, object]:
    """Every preset of a known chip that was not measured itself, with its compute curves and compute note from
    the rule (module docstring)."""
    from slidedp.config_io import read_mapping
    from slidedp.hardware import HardwareProfile

    profiles = {p: HardwareProfile.from_dict(read_mapping(p, "hardware profile"), where=p.stem)
                for p in sorted(preset_dir.glob("*.yaml"))}
    by_stem = {p.stem: hw for p, hw in profiles.items()}
    for chip, stem in MEASURED_PRESETS.items():
        hw = by_stem.get(stem)
        if hw is None or hw.gpu.name != chip or hw.gpu.compute is None:
            raise ValueError(f"measured preset {stem!r}: missing, not a {chip} or without gpu.compute")
    if MEASURED_ON not in MEASURED_PRESETS:
        raise ValueError(f"{MEASURED_ON}, whose curves carry to other chips, has no measured preset")
    measured = {chip: by_stem[stem].gpu.compute for chip, stem in MEASURED_PRESETS.items()}
    out = {}
    for path, hw in profiles.items():
        chip = CHIPS.get(hw.gpu.name)
        if chip is None or path.stem in MEASURED_PRESETS.values():
            continue
        curves = measured.get(chip.name) or scale_curves(measured[MEASURED_ON], CHIPS[MEASURED_ON], chip)
        notes = hw.notes.split(COMPUTE_NOTE)[0] + COMPUTE_NOTE + compute_note(chip)
        out[path] = replace(hw, gpu=replace(hw.gpu, compute=curves), notes=notes)
    return out


def rewrite_compute(path: Path, profile) -> None:
    """Write ``profile``'s gpu.compute and notes into the preset at ``path``, leaving its other fields as written."""
    from slidedp.config_io import read_mapping, write_mapping

    raw = read_mapping(path, "hardware profile")
    new = profile.to_dict()
    raw["gpu"]["compute"], raw["notes"] = new["gpu"]["compute"], new["notes"]
    write_mapping(path, raw)


if __name__ == "__main__":
    for path, profile in derived_presets(Path(__file__).parent / "presets").items():
        rewrite_compute(path, profile)
        print(f"wrote {path}")
