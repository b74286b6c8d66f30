"""The engine's parts on their own: chunk ownership and flags, the CPU reduction's trace bytes, and the
resident-weights reference the benchmarks time."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from slidedp.model_spec import ModelSpec
from slidedp.policy import GRAD_ROUTES, Policy
from slidedp.routes import Routes, chunk_ranges
from slidedp.runtime.chunks import ChunkTable
from slidedp.runtime.device import Device
from slidedp.runtime.engine import EngineConfig, StreamingEngine
from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
from slidedp.runtime.host_state import HostState
from slidedp.runtime.tracing import TraceRecorder
from tests.builders import TINY, write_config
from tests.runtime.dp_runner import run_data_parallel
from tests.runtime.helpers import OPTIM, batches, make_engine


@pytest.mark.parametrize("grad_route", GRAD_ROUTES)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_chunk_table_owners_cover_every_host_parameter_once_and_flags_do_not_collide(tmp_path, world, grad_route):
    adapter = ModelAdapter(load_hf_config(write_config(tmp_path, "qwen3")))
    policy = Policy(grad_route=grad_route, chunks_per_layer=3)
    routes = Routes.of(policy, world)
    n_chunks = sum(len(chunk_ranges(u.numel, 3)) for u in adapter.units)
    flags = torch.zeros(n_chunks * world, dtype=torch.int64)
    held = 1  # the embedding's state on the GPU: no rank owns a host range of it
    tables = [ChunkTable(adapter.units, routes, r, host_units_from=held, flags=flags) for r in range(world)]
    covered = torch.zeros(adapter.total_params, dtype=torch.int32)
    for table in tables:
        for u, c, lo, hi in table.owned():
            covered[lo:hi] += 1
            table.mark_updated(u, c, 1)
    first_host = adapter.units[held].offset
    assert (covered[:first_host] == 0).all() and (covered[first_host:] == 1).all()
    pairs = sum(len(routes.chunk_owners(u, c)) for u in range(held, len(adapter.units))
                for c in range(len(tables[0].chunks(u))))
    assert int((flags == 1).sum()) == pairs  # one distinct flag per (chunk, owner)
    for u in range(held, len(adapter.units)):
        for c in range(len(tables[0].chunks(u))):
            tables[0].wait_for_owners(u, c, 1)  # every owner has published: returns at once


def test_cpu_reduce_trace_bytes_follow_the_gradient_dtype(tmp_path):
    """Per-rank route in fp32 over 2 gloo ranks: the owner's CPU sum reads N copies and writes one, 4 bytes
    each, so its trace counts (N + 1) x 4 x the parameters it reduced (it once counted 2-byte elements)."""
    world, chunks = 2, 3
    config = write_config(tmp_path, "qwen3")
    policy = Policy(param_route="replicated", grad_route="per_rank", micro_batch=1, accumulation=1,
                    chunks_per_layer=chunks)
    run_data_parallel(world, config, policy, 16, 1, tmp_path)
    trace = pd.read_parquet(tmp_path / f"dp{world}.trace{world - 1}.parquet")  # the last rank's first step
    reduced = trace[trace.op == "cpu_reduce"]
    adapter = ModelAdapter(load_hf_config(config))
    owned = {(u, c): b - a for u, unit in enumerate(adapter.units)
             for c, (a, b) in enumerate(chunk_ranges(unit.numel, chunks)) if (u * chunks + c) % world == world - 1}
    assert set(zip(reduced.unit, reduced.chunk, strict=True)) == set(owned)
    assert reduced.host_bytes.sum() == (world + 1) * 4 * sum(owned.values())


def _resident_engine(config_path: str, policy: Policy, seq: int) -> tuple[StreamingEngine, HostState]:
    adapter = ModelAdapter(load_hf_config(config_path))
    host = HostState.allocate(adapter.total_params, torch.float32, torch.float32, pin=False)
    host.init_random(adapter, 0)
    spec = ModelSpec.from_hf_config(json.loads(Path(config_path).read_text()), "tiny")
    device = Device("cpu")
    config = EngineConfig(policy, OPTIM, seq, torch.float32, resident_weights=True)
    return StreamingEngine(config, adapter, spec, host, device, TraceRecorder(device)), host


@pytest.mark.parametrize("policy", [
    Policy(activation="offload", micro_batch=2, accumulation=2, chunks_per_layer=3, prefetch_depth=1),
    Policy(activation="keep", micro_batch=1, accumulation=4, chunks_per_layer=2, gpu_state_units=2),
], ids=["offload", "keep-gpu-state"])
def test_resident_weights_fetch_once_move_no_gradient_and_match_the_first_streamed_step(tmp_path, policy):
    config = write_config(tmp_path, "qwen3")
    data = batches(TINY["qwen3"]["vocab_size"], 16, 4, 3, seed=5)
    streaming, _, _ = make_engine(config, policy, 16)
    first = streaming.step(data[0])
    streaming.close()
    engine, host = _resident_engine(config, policy, 16)
    before = (host.master.clone(), host.slot.clone())
    stats = [engine.step(t) for t in data]
    engine.flush()
    engine.close()
    assert stats[0].loss == first.loss  # the same compute on the same weights
    assert stats[0].grad_norm == pytest.approx(first.grad_norm, rel=1e-6)  # summed in another order
    assert all(not s.skipped and s.grad_norm > 0 for s in stats)
    ops = [set(s.trace.op) for s in stats]
    assert "h2d_param" in ops[0]
    for step_ops in ops:
        assert not {op for op in step_ops if op.startswith("d2h")}
        assert not step_ops & {"adam", "cast", "cpu_reduce", "gpu_adam", "allreduce"}
    for step_ops in ops[1:]:
        assert not {op for op in step_ops if op.startswith("h2d")}
    fetched = stats[0].trace[stats[0].trace.op == "h2d_param"]
    assert sorted(set(fetched.unit)) == list(range(len(engine.units)))  # every unit, once
    assert len(fetched) == len(set(zip(fetched.unit, fetched.chunk, strict=True)))
    assert torch.equal(host.master, before[0]) and torch.equal(host.slot, before[1])  # nothing was updated
