"""The streaming engine on a real GPU (CUDA streams, events, the worker thread) against plain PyTorch on the CPU,
on tiny models in fp32. Formerly `benchmarks/gpu_runtime.py --check`; run it with `python -m pytest -m gpu` on a
machine with CUDA. Everywhere else (CI's CPU machines) it is skipped."""

import pytest
import torch

from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.runtime.device import Device
from slidedp.runtime.engine import EngineConfig, StreamingEngine
from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
from slidedp.runtime.host_state import HostState
from slidedp.runtime.optim import OptimConfig
from slidedp.runtime.tracing import TraceRecorder
from tests.builders import TINY, write_config
from tests.runtime.helpers import batches, reference_training

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (python -m pytest -m gpu)")]

CASES = [("qwen3", Policy(micro_batch=2, accumulation=2, chunks_per_layer=3)),
         ("qwen3", Policy(activation="offload", micro_batch=1, accumulation=4, chunks_per_layer=2)),
         ("qwen3-tied", Policy(activation="keep", micro_batch=2, accumulation=2, chunks_per_layer=4)),
         ("qwen3", Policy(micro_batch=2, accumulation=2, chunks_per_layer=3, prefetch_depth=1, kept_layers=2))]


@pytest.fixture
def no_tf32():
    """TF32 matmuls would round far above the fp32 reference's tolerance; restore the caller's setting after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("name, policy", CASES,
                         ids=["qwen3-recompute", "qwen3-offload", "qwen3-tied-keep", "qwen3-recompute-kept2"])
def test_gpu_engine_matches_the_cpu_reference(tmp_path, no_tf32, name, policy):
    adapter = ModelAdapter(load_hf_config(write_config(tmp_path, name)))
    host = HostState.allocate(adapter.total_params, torch.float32, torch.float32, pin=True)
    host.init_random(adapter, 0)
    spec = ModelSpec.from_hf_config(TINY[name], "tiny")
    device = Device("cuda")
    optim = OptimConfig(lr=3e-3, weight_decay=0.1, max_grad_norm=0.05, warmup_steps=2, total_steps=6)
    engine = StreamingEngine(EngineConfig(policy, optim, 16, torch.float32, adam_threads=4), adapter, spec, host,
                             device, TraceRecorder(device))
    data = batches(TINY[name]["vocab_size"], 16, 4, 4, seed=1)
    initial = host.master.clone()
    try:
        losses = [engine.step(t).loss for t in data]
        engine.flush()
    finally:
        engine.close()
    ref_losses, ref_final = reference_training(adapter, initial, data, policy.micro_batch, optim)
    loss_err = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    w_err = float((host.master - ref_final).abs().max())
    host.close()
    # Different kernels (cuBLAS, SDPA) round differently; Adam turns a tiny gradient difference on a
    # near-zero gradient into up to one lr-sized step, hence the weight bound of a few % of lr.
    assert loss_err < 1e-5 and w_err < 1e-4, f"GPU engine disagrees with the CPU reference: loss {loss_err:.2e}, " \
                                             f"weights {w_err:.2e}"


def test_each_kept_layer_costs_the_gpu_memory_the_model_says(tmp_path):
    """Policy.kept_layers on the GPU in bf16: the measured peak (torch.cuda.max_memory_allocated over a step)
    grows per kept layer by the memory model's kept_layer_bytes within 20%, so the tuner's sizing holds. A
    layer wide enough (hidden 1024, 4096 tokens per micro-batch) that activations dwarf allocator noise."""
    import json

    from slidedp.hardware import load_hardware
    from slidedp.model.memory import kept_layer_bytes
    from slidedp.workload import StepWorkload

    config = dict(model_type="qwen3", vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                  tie_word_embeddings=False)
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(config))
    adapter = ModelAdapter(load_hf_config(str(path)))
    spec = ModelSpec.from_hf_config(config, "wide")
    device = Device("cuda")
    host = HostState.allocate(adapter.total_params, torch.bfloat16, torch.bfloat16, pin=True)
    host.init_random(adapter, 0)
    seq, data = 2048, batches(config["vocab_size"], 2048, 2, 2, seed=2)
    peaks = {}
    try:
        for kept in (0, 4):
            policy = Policy(param_route="replicated", grad_route="per_rank", micro_batch=2, prefetch_depth=2,
                            kept_layers=kept)
            engine = StreamingEngine(EngineConfig(policy, OptimConfig(lr=1e-5), seq, torch.bfloat16,
                                                  adam_threads=4), adapter, spec, host, device, TraceRecorder(device))
            try:
                engine.step(data[0])  # warm-up: allocator pools, kernels
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                engine.step(data[1])
                engine.flush()
                torch.cuda.synchronize()
                peaks[kept] = torch.cuda.max_memory_allocated()
            finally:
                engine.close()
    finally:
        host.close()
    w = StepWorkload(spec, load_hardware("h200-x1"), Policy(param_route="replicated", grad_route="per_rank",
                                                             micro_batch=2, prefetch_depth=2), seq, 2)
    measured, predicted = (peaks[4] - peaks[0]) / 4, kept_layer_bytes(w)
    assert abs(measured / predicted - 1) < 0.2, f"per kept layer {measured / 2**20:.1f} MiB measured, " \
                                                f"{predicted / 2**20:.1f} MiB predicted"
