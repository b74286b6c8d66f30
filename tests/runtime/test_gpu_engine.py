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
         ("qwen3-tied", Policy(activation="keep", micro_batch=2, accumulation=2, chunks_per_layer=4))]


@pytest.fixture
def no_tf32():
    """TF32 matmuls would round far above the fp32 reference's tolerance; restore the caller's setting after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("name, policy", CASES, ids=["qwen3-recompute", "qwen3-offload", "qwen3-tied-keep"])
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
