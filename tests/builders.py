"""Plain builders shared by the tests: small models, tiny HF configs, and machines where one resource can be made
the only limit. Test modules import these directly; conftest.py only wraps them as fixtures."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from slidedp.hardware import GPUSpec, HardwareProfile, HostSpec, LinkSpec, SwitchSpec
from slidedp.model_spec import ModelSpec

REPO = Path(__file__).resolve().parents[1]  # the checkout: notebooks/, benchmarks/, results
HUGE = 1e9  # GB/s or TFLOP/s that makes a resource effectively free

# Tiny HF configs: big enough to exercise every part of a layer (GQA, q/k norm, tied or untied head), small
# enough that the plain-PyTorch reference and several gloo ranks train them in seconds on a CPU.
TINY = {
    "qwen3": dict(model_type="qwen3", vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                  tie_word_embeddings=False),
    "llama": dict(model_type="llama", vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                  tie_word_embeddings=False),
    "qwen3-tied": dict(model_type="qwen3", vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                       tie_word_embeddings=True),
}


def write_config(tmp_path: Path, name: str) -> str:
    """TINY[name] as a config.json-style file in tmp_path; the runtime and CLI load models from files."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(TINY[name]))
    return str(path)


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


def process_gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether process ``pid`` has exited (a zombie counts as exited) within ``wait_s`` seconds."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def read_when_written(path: Path, wait_s: float = 10.0) -> str:
    """The text of ``path`` once another process has written it (waits up to ``wait_s`` seconds)."""
    import time

    deadline = time.monotonic() + wait_s
    while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text()


def simulated_run(path: Path, spec: ModelSpec, policy, hw: HardwareProfile, seq: int, batch: int,
                  profile: HardwareProfile | None = None):
    """A 'measured' run: ``policy`` simulated on the true machine ``hw`` and written as a run directory at
    ``path`` (its hardware file ``profile``, the one the run was predicted with; default ``hw``). Returns the
    directory and the simulation."""
    from slidedp.report.rundir import write_run_dir
    from slidedp.run_summary import RunSummary
    from slidedp.sim import simulate
    from slidedp.workload import StepWorkload

    sim = simulate(StepWorkload(spec, hw, policy, seq, batch))
    summary = RunSummary(model=spec.name, model_spec=spec.to_dict(), policy=policy.to_dict(), seq=seq, batch=batch,
                         ranks=1, step_time_s=sim.step_time_s, limiter=sim.limiter)
    return write_run_dir(path, sim.trace, sim.exposure, summary, policy, profile or hw), sim
