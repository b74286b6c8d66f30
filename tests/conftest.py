"""Shared builders for tests: small models and machines where one resource can be made the only limit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slidedp.hardware import GPUSpec, HardwareProfile, HostSpec, LinkSpec, SwitchSpec
from slidedp.model_spec import ModelSpec

HUGE = 1e9  # GB/s or TFLOP/s that makes a resource effectively free


def tiny_model(layers: int = 4, tied: bool = False) -> ModelSpec:
    return ModelSpec(name="tiny", layers=layers, hidden=512, ffn=1536, heads=8, kv_heads=4, head_dim=64,
                     vocab=8000, tied_embeddings=tied, qk_norm=True)


def free_machine(num_gpus: int = 1, link: str = "nvlink", switches: bool = False) -> HardwareProfile:
    """Every resource effectively infinite and every latency zero: tests then constrain one of them."""
    gpu = GPUSpec(name="free", memory_gib=1000.0, h2d_gbps=HUGE, d2h_gbps=HUGE, duplex_gbps=HUGE, pcie_latency_us=0.0,
                  matmul_tflops=HUGE, attention_tflops=HUGE, half_efficiency_tokens=0.0, layer_overhead_us=0.0,
                  reserve_gib=1.0)
    host = HostSpec(cores=64, memory_gib=4096.0, mem_bw_gbps=HUGE, adam_gparams_per_s={1: HUGE},
                    cast_gelems_per_s={1: HUGE}, stream_gbps={1: HUGE})
    pairs = range(0, num_gpus, 2)
    sw = tuple(SwitchSpec(tuple(range(i, min(i + 2, num_gpus))), HUGE) for i in pairs) if switches else ()
    return HardwareProfile("free", num_gpus, gpu, host, LinkSpec(link, HUGE, 0.0), sw)


def with_gpu(hw: HardwareProfile, **changes) -> HardwareProfile:
    return replace(hw, gpu=replace(hw.gpu, **changes))


def with_host(hw: HardwareProfile, **changes) -> HardwareProfile:
    return replace(hw, host=replace(hw.host, **changes))


def with_link(hw: HardwareProfile, **changes) -> HardwareProfile:
    return replace(hw, link=replace(hw.link, **changes))


@pytest.fixture
def model() -> ModelSpec:
    return tiny_model()
