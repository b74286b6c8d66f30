"""The calibration fit and the simulator must use one compute model, to the last bit.

``fit_compute`` fits GPU rates with ``fits.layer_time``; the simulator reads them back through ``GPUSpec`` (and
``build_units`` adds the per-layer overhead). If either side's formula changed alone, a calibrated profile
would silently mean something else to the simulator than what was measured.
"""

from dataclasses import replace

import numpy as np
import pytest

from slidedp.calibration.fits import layer_time
from slidedp.hardware import layer_forward_seconds, load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.units import build_units

PARAMS = [(540.0, 200.0, 400.0, 20e-6), (12.5, 0.0, 3.25, 0.0), (989.0, 1234.5, 611.0, 7.3e-5)]


@pytest.mark.parametrize("matmul, half, attention, overhead", PARAMS)
def test_fit_model_equals_gpuspec_layer_time_bit_for_bit(matmul, half, attention, overhead):
    spec = load_model_spec("qwen3-8b")
    # The layer-level model (a GPU without shape-aware curves), which calibration.fits fits.
    gpu = replace(load_hardware("h200-x1").gpu, matmul_tflops=matmul, half_efficiency_tokens=half,
                  attention_tflops=attention, layer_overhead_us=overhead * 1e6, compute=None)
    seqs = [512, 1024, 4096, 16384, 32768]
    micro_batches = [1, 2, 4, 1, 1]
    tokens = np.array([s * b for s, b in zip(seqs, micro_batches, strict=True)])
    lin = spec.layer_linear_flops_per_token() * tokens
    att = np.array([spec.layer_attention_flops_per_token(s) for s in seqs]) * tokens
    fitted = layer_time((lin, att, tokens), matmul, half, attention, gpu.layer_overhead_us * 1e-6)
    for i, (seq, mb) in enumerate(zip(seqs, micro_batches, strict=True)):
        by_spec = gpu.layer_forward_time(float(lin[i]), float(att[i]), int(tokens[i]))
        by_parts = (gpu.linear_time(float(lin[i]), int(tokens[i])) + gpu.attention_time(float(att[i]))
                    + gpu.layer_overhead_us * 1e-6)
        # What the simulator charges a decoder layer: build_units' forward time (one micro-batch, no accumulation).
        by_workload = build_units(spec, gpu, "keep", mb, 1, seq)[1].fwd_s
        assert fitted[i] == by_spec == by_parts == by_workload


def test_shared_formula_matches_its_definition():
    """Pin the formula itself, so a change to it is a deliberate edit of this test too."""
    lin, att, tokens, matmul, half, attention, overhead = 3.0e12, 5.0e11, 4096, 500.0, 256.0, 300.0, 1e-5
    expected = lin / (matmul * 1e12 * (tokens / (tokens + half))) + att / (attention * 1e12) + overhead
    assert layer_forward_seconds(lin, att, tokens, matmul, half, attention, overhead) == expected
    # No token count (0) means the full matmul rate.
    assert layer_forward_seconds(lin, att, 0, matmul, half, attention, overhead) == \
        lin / (matmul * 1e12) + att / (attention * 1e12) + overhead
    assert layer_forward_seconds(lin, att, np.int64(0), matmul, half, attention, overhead) == \
        lin / (matmul * 1e12) + att / (attention * 1e12) + overhead
