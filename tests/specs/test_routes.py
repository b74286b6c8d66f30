"""Routes: the one home of what param/grad routes mean; the workload, the memory model and the runtime agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.policy import GRAD_ROUTES, PARAM_ROUTES, Policy
from slidedp.routes import Routes, chunk_ranges, shard_bounds
from slidedp.workload import StepWorkload

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("param_route", PARAM_ROUTES)
@pytest.mark.parametrize("grad_route", GRAD_ROUTES)
def test_every_rank_gets_whole_weights_and_the_host_gets_each_gradient_once(ranks, param_route, grad_route):
    r = Routes.of(Policy(param_route=param_route, grad_route=grad_route, chunks_per_layer=5), ranks)
    # H2D plus what the all-gather brings in: every rank ends with the whole chunk.
    assert r.h2d_param_factor + r.allgather_factor == pytest.approx(r.weight_bytes)
    # Reduce-scatter hands each rank 1/N; the host receives the whole gradient once (or N copies to sum).
    host_copies = ranks * r.d2h_grad_factor / r.grad_bytes
    assert host_copies == pytest.approx(ranks if r.cpu_reduces else 1.0)
    assert r.cpu_reduce_bytes_per_param == ((ranks + 1) * r.grad_bytes if r.cpu_reduces else 0.0)
    assert r.shards_params == (param_route == "sharded" and ranks > 1)
    assert r.reduce_scatters == (grad_route == "reduce_scatter" and ranks > 1)


@pytest.mark.parametrize("grad_route", GRAD_ROUTES)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_owned_ranges_cover_each_chunk_exactly_once(grad_route, ranks):
    r = Routes.of(Policy(grad_route=grad_route, chunks_per_layer=3), ranks)
    for u, numel in enumerate([10, 7, 2, 101]):
        for c, (a, b) in enumerate(chunk_ranges(numel, r.chunks)):
            owned = [r.owned_range(u, c, a, b, rank) for rank in range(ranks)]
            pieces = sorted(p for p in owned if p is not None)
            assert pieces[0][0] == a and pieces[-1][1] == b
            assert all(x[1] == y[0] for x, y in zip(pieces, pieces[1:], strict=False))
            assert {rank for rank, p in enumerate(owned) if p is not None} == set(r.chunk_owners(u, c))
            assert len(r.chunk_owners(u, c)) == r.owners_per_chunk  # the update-call count's closed form


def test_one_owner_route_spreads_chunks_round_robin():
    r = Routes.of(Policy(grad_route="per_rank", chunks_per_layer=4), 3)
    counts = [0, 0, 0]
    for u in range(6):
        for rank, k in enumerate(r.owner_chunk_counts(u)):
            counts[rank] += k
        assert sum(r.owner_chunk_counts(u)) == 4
    assert counts == [8, 8, 8]


def test_shard_bounds_split_evenly():
    assert shard_bounds(10, 17, 3) == [10, 12, 14, 17]
    assert chunk_ranges(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]


def test_workload_owners_follow_routes():
    hw = load_hardware("h100-sxm-x4")
    for grad_route in GRAD_ROUTES:
        policy = Policy(grad_route=grad_route, chunks_per_layer=3)
        w = StepWorkload(load_model_spec("qwen3-0.6b"), hw, policy, 1024, 4)
        for u in range(w.num_units):
            for c in range(w.chunks):
                owners = w.update_owners(u, c)
                assert tuple(rank for rank, _ in owners) == w.routes.chunk_owners(u, c)
                assert sum(p for _, p in owners) == pytest.approx(w.units[u].params / w.chunks)


def test_memory_model_charges_the_landing_buffers_the_runtime_allocates(tmp_path):
    """The per-rank route's host buffers: one unit's gradient per rank, as the runtime allocates them
    (the model once charged prefetch_depth of them per rank plus bounce chunks nobody allocates)."""
    import json

    from slidedp.model import estimate_memory
    from slidedp.runtime.engine import shared_buffer_sizes
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config

    config = dict(model_type="qwen3", vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    (tmp_path / "c.json").write_text(json.dumps(config))
    adapter = ModelAdapter(load_hf_config(str(tmp_path / "c.json")))
    spec = load_model_spec(str(tmp_path / "c.json"))
    hw = load_hardware("h100-sxm-x4")
    for grad_route in GRAD_ROUTES:
        policy = Policy(grad_route=grad_route, prefetch_depth=3, chunks_per_layer=2)
        mem = estimate_memory(StepWorkload(spec, hw, policy, 16, 4))
        _, landing = shared_buffer_sizes(adapter, policy, 4)
        assert mem.host_buffers == 4 * landing * policy.grad_bytes


def test_no_route_name_is_compared_outside_the_routes_module():
    """Route names mean something in one place only (slidedp/routes.py; the Policy validates them)."""
    pattern = re.compile(r"(param_route|grad_route)\s*(==|!=|\bin\b)|[\"'](per_rank|reduce_scatter|sharded|replicated)"
                         r"[\"']\s*(==|!=)")
    offenders = []
    for folder in ("slidedp", "model", "sim", "runtime", "calibration"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name in ("routes.py", "policy.py"):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
