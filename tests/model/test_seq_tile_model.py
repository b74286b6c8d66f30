"""Sequence tiles (#19) in the models: a layer's working set shrinks with the tile as the byte counts say, the
tiles' rerun is priced once for the analytical model and the simulator alike, and the tuner tiles exactly when
no untiled policy fits the budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slidedp import compute as c
from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, load_hardware
from slidedp.model import estimate_memory, estimate_step
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.problem import Budget
from slidedp.sim import simulate
from slidedp.tune import TuneSpace, tune
from slidedp.units import unit_work
from slidedp.workload import StepWorkload

SEQ = 262144
SPACE = TuneSpace(chunks_per_layer=(4,), prefetch_depths=(1, 2), micro_batches=(1,), update_schedules=("next_forward",),
                  thread_fractions=(1.0,), gpu_state=False)


def test_tiled_byte_counts_split_what_an_untiled_layer_keeps():
    """Sequence-wide plus tile bytes are what an untiled layer keeps, less only the first RMSNorm's tile-local
    part (its tiles rerun one at a time, after the MLP's); the MLP's 8 x ffn bytes per token are in the tile's share."""
    for name in ("qwen3-14b", "llama-3-8b", "qwen2.5-72b"):
        m = load_model_spec(name)
        full, seq, tile = (m.full_activation_bytes_per_token(), m.sequence_activation_bytes_per_token(),
                           m.tile_activation_bytes_per_token())
        assert full - 8 * m.hidden <= seq + tile <= full
        assert tile >= 8 * m.ffn and seq < full / 2
        assert m.layer_working_bytes(SEQ, 0) == full * SEQ
        assert m.layer_working_bytes(SEQ, 2 * SEQ) == (seq + tile) * SEQ <= full * SEQ  # a tile over every token


@pytest.mark.parametrize("activation", ["keep", "recompute", "offload"])
def test_working_set_shrinks_with_the_tile_down_to_the_attentions_backward(activation):
    """A larger tile adds its rerun's bytes per token, until the tile is small enough that the attention's
    backward over the whole sequence (the floor) is the layer's larger phase: below that the tile saves nothing."""
    m, hw = load_model_spec("qwen3-14b"), load_hardware("h100-sxm-x4")
    per_tile_token = m.tile_activation_bytes_per_token()
    floor = m.attention_backward_bytes_per_token() * SEQ
    tiles = (4096, 16384, 65536, 131072, 262144)
    mems = {t: estimate_memory(StepWorkload(m, hw, Policy(activation=activation, seq_tile_tokens=t), SEQ, 4))
            for t in (0, *tiles)}
    assert per_tile_token * 4096 < floor < per_tile_token * 131072  # both regimes are in the sweep
    for small, big in zip(tiles, tiles[1:], strict=False):
        grown = mems[big].gpu_activations - mems[small].gpu_activations
        assert grown == pytest.approx(max(per_tile_token * big, floor) - max(per_tile_token * small, floor))
        assert mems[big].gpu_weights == mems[small].gpu_weights and mems[big].gpu_loss == mems[small].gpu_loss
    saved = mems[0].gpu_activations - mems[4096].gpu_activations
    layers = m.layers if activation == "keep" else 1  # keep holds every layer's graph
    kept_less = (m.full_activation_bytes_per_token() - m.sequence_activation_bytes_per_token()) * SEQ
    assert saved > 0.9 * (layers * kept_less - floor)


def test_the_attentions_backward_counts_expanded_gradients_only_under_grouped_query_attention():
    """Flash attention's backward expands the key and value gradients to every query head when there are
    fewer kv heads; with as many kv heads as query heads nothing is expanded. Untiled, the MLP's saved
    tensors (freed before the attention's backward) are larger, so nothing is added on top of them."""
    gqa = load_model_spec("qwen3-14b")
    mha = replace(gqa, kv_heads=gqa.heads)
    h, q = gqa.hidden, gqa.q_dim
    assert gqa.attention_backward_bytes_per_token() == 2 * (h + 2 * q + 2 * gqa.kv_dim) + 4 * q + 4 * q + 4 * gqa.heads
    assert mha.attention_backward_bytes_per_token() == 2 * (h + 2 * q + 2 * mha.kv_dim) + 4 * q + 4 * mha.heads
    for m in (gqa, mha):
        assert m.layer_working_bytes(SEQ, 0) == m.full_activation_bytes_per_token() * SEQ
        tiled = m.layer_working_bytes(SEQ, 4096)
        assert tiled == (m.sequence_activation_bytes_per_token() + m.attention_backward_bytes_per_token()) * SEQ


@pytest.mark.parametrize("curves", [True, False])
def test_the_tiles_rerun_is_priced_once_for_the_model_and_the_simulator(curves):
    """The rerun adds each tile's norms and MLP (6 x hidden x ffn FLOPs per token) to backward, whatever the tile
    size; the analytical model and the simulator both take it from the units."""
    m, hw = load_model_spec("qwen3-0.6b"), load_hardware("h200-x1")
    if not curves:
        hw = replace(hw, gpu=replace(hw.gpu, compute=None))
    seq, tokens = 8192, 2 * 8192
    whole = unit_work(m, "recompute", 2, 1, seq)
    for tile in (1024, 3000):
        tiled = unit_work(m, "recompute", 2, 1, seq, seq_tile_tokens=tile)
        extra = tiled[1].bwd_flops - whole[1].bwd_flops
        assert extra == pytest.approx(6.0 * m.hidden * m.ffn * tokens)
        ops = m.tile_recompute_ops(2, seq, tile)
        gemm_rows = sum(op.m * op.count for op in ops if isinstance(op, c.Gemm))
        assert gemm_rows == 3 * tokens  # gate, up and down over every token once
        assert tiled[1].fwd_flops == whole[1].fwd_flops and tiled[0] == whole[0] and tiled[-1] == whole[-1]
    pol = Policy(micro_batch=2)
    w0, w1 = (StepWorkload(m, hw, p, seq, 2) for p in (pol, pol.with_(seq_tile_tokens=4096)))
    assert w1.units[1].bwd_s > w0.units[1].bwd_s and w1.units[1].fwd_s == w0.units[1].fwd_s
    unit_extra = sum(u.bwd_s for u in w1.units) - sum(u.bwd_s for u in w0.units)
    model_extra = estimate_step(w1).step_time_s - estimate_step(w0).step_time_s
    sim_extra = simulate(w1).step_time_s - simulate(w0).step_time_s
    assert unit_extra > 0  # the backward passes carry the rerun; the step grows by it in both
    assert sim_extra == pytest.approx(unit_extra, rel=1e-3)
    assert model_extra == pytest.approx(unit_extra, rel=0.02)


def _smallest_untiled_gib(m, hw, seq: int) -> float:
    with pytest.raises(SlideDPError, match="smallest feasible budget") as info:
        tune(m, hw, seq, hw.num_gpus, Budget(gpu_bytes=1 * GIB, host_bytes=2000 * GIB), replace(SPACE, seq_tiles=()),
             refine_top=1)
    return float(info.value.args[0].rsplit("is ", 1)[1].split(" GiB")[0])


def test_the_tuner_tiles_exactly_when_untiled_does_not_fit():
    m, hw = load_model_spec("qwen3-8b"), load_hardware("h200-x1")
    seq = 131072
    needed = _smallest_untiled_gib(m, hw, seq)
    fits = tune(m, hw, seq, 1, Budget((needed + 0.1) * GIB, 2000 * GIB), SPACE, refine_top=2)
    assert all(c.policy.seq_tile_tokens == 0 for c in fits.candidates)
    short = Budget((needed - 0.1) * GIB, 2000 * GIB)
    tiled = tune(m, hw, seq, 1, short, SPACE, refine_top=2)
    assert tiled.candidates and all(c.policy.seq_tile_tokens > 0 for c in tiled.candidates)
    assert tiled.best.memory.gpu_peak <= short.gpu_bytes
    # Each policy takes the largest tile that fits: twice that tile would not.
    best = tiled.best.policy
    bigger = best.with_(seq_tile_tokens=2 * best.seq_tile_tokens)
    if bigger.seq_tile_tokens < seq:
        assert estimate_memory(StepWorkload(m, hw, bigger, seq, 1)).gpu_peak > short.gpu_bytes
    with pytest.raises(SlideDPError, match="smallest feasible budget"):
        tune(m, hw, seq, 1, short, replace(SPACE, seq_tiles=()), refine_top=1)


def test_qwen3_14b_at_256k_fits_80_gib_on_h100_only_tiled():
    """Issue #19's problem: untiled the smallest budget is 87.5 GiB; tiled a policy fits 80 GiB."""
    m, hw = load_model_spec("qwen3-14b"), load_hardware("h100-sxm-x4")
    space = replace(SPACE, micro_batches=None)
    assert _smallest_untiled_gib(m, hw, SEQ) == pytest.approx(87.5, abs=0.05)
    result = tune(m, hw, SEQ, 4, Budget(80 * GIB, hw.host.memory_gib * GIB), space, refine_top=2)
    assert result.best.policy.seq_tile_tokens > 0 and result.best.memory.gpu_peak <= 80 * GIB
