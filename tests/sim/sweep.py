"""The seeded sweep of random valid workloads (preset model x machine x policy) that both the sim-vs-model
agreement tests and the simulator property tests run over: one list, so both judge the same configurations."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from slidedp.hardware import GIB, load_hardware
from slidedp.model import estimate_memory, memory_shortfalls
from slidedp.model.demands import op_totals
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.workload import StepWorkload

MODELS = ["qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama-3-8b"]
MACHINES = ["h100-sxm-x1", "h100-sxm-x4", "h100-sxm-x8", "rtx4090-x4", "h200-x1"]


def random_valid_workload(rng: random.Random) -> StepWorkload:
    """A random model x machine x policy that fits the machine's GPU and host memory."""
    while True:
        model = load_model_spec(rng.choice(MODELS))
        hw = load_hardware(rng.choice(MACHINES))
        n = rng.choice([g for g in (1, 2, 3, 4, 8) if g <= hw.num_gpus])
        hw = hw.with_gpus(n) if n != hw.num_gpus else hw
        policy = Policy(
            param_route=rng.choice(["replicated", "sharded"]), grad_route=rng.choice(["per_rank", "reduce_scatter"]),
            chunks_per_layer=rng.choice([1, 2, 4, 8]), prefetch_depth=rng.choice([1, 2, 3]),
            activation=rng.choice(["keep", "recompute", "offload"]), micro_batch=rng.choice([1, 2]),
            accumulation=rng.choice([1, 2, 4, 8]),
            update_schedule=rng.choice(["next_forward", "as_ready", "after_backward"]),
            grad_dtype=rng.choice(["bf16", "bf16", "fp32"]))
        seq = rng.choice([512, 2048, 4096, 8192])
        w = StepWorkload(model, hw, policy, seq, n * policy.sequences_per_rank())
        if not memory_shortfalls(estimate_memory(w), hw.gpu.memory_gib * GIB, 0.9 * hw.host.memory_gib * GIB):
            return w


SWEEP = [random_valid_workload(random.Random(seed)) for seed in range(60)]


def assert_trace_conserves_op_totals(trace: pd.DataFrame, w: StepWorkload) -> None:
    """The simulated trace moves, per op, exactly the bytes, host bytes and FLOPs the closed form says."""
    by_op = trace.groupby("op")[["bytes", "host_bytes", "flops"]].sum()
    expected = op_totals(w)
    assert set(by_op.index) == set(expected)
    for op, totals in expected.items():
        for column, value in totals.items():
            assert by_op.loc[op, column] == pytest.approx(value, rel=1e-9, abs=1e-6), (op, column)
