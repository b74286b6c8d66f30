"""The peers' memory models: GPU and host bytes per parameter as each system keeps its state, and the measured
out-of-memory batches of the H200 peer comparison (benchmarks/results/h200-2026-12-02b and -02c)."""

from __future__ import annotations

import pytest

from slidedp.hardware import GIB, load_hardware
from slidedp.model.memory import activation_bytes, loss_bytes
from slidedp.model_spec import ModelSpec, load_model_spec
from slidedp.peers import SYSTEMS, PeerStep, estimate_peer_memory, peer_workload, system_workload
from slidedp.peers.step import PEER_WINDOW
from slidedp.peers.systems import ALLOCATOR_FRAGMENTATION
from tests.builders import free_machine, tiny_model

# (GPU bytes per parameter held all step, GPU gradient bytes at the end of backward, host bytes per parameter),
# per GPU with N ranks, as the module docstrings document them.
DOCUMENTED = {
    "zero2-offload": (lambda n: 2, lambda n: 0, 16),
    "zero3-offload": (lambda n: 0, lambda n: 0, 20),
    "fsdp2-offload": (lambda n: 0, lambda n: 0, 16),
    "fsdp2-resident": (lambda n: 12 / n, lambda n: 4 / n, 0),
    "ddp-resident": (lambda n: 12, lambda n: 4, 0),
    "slideformer": (lambda n: 0, lambda n: 0, 12),
    "megatrain": (lambda n: None, lambda n: 0, 14),  # bf16 root units on the GPU: checked below
}


def _mem(name: str, model, hw, seq: int, batch: int):
    step = PeerStep(SYSTEMS[name], system_workload(SYSTEMS[name], model, hw, seq, batch))
    return step, estimate_peer_memory(step)


@pytest.mark.parametrize("gpus", [1, 4])
@pytest.mark.parametrize("name", list(SYSTEMS))
def test_bytes_per_parameter_are_the_documented_ones(name, gpus):
    if gpus > 1 and SYSTEMS[name].single_gpu:
        pytest.skip(f"{name} is modelled on one GPU")
    model = tiny_model(layers=6)
    step, mem = _mem(name, model, free_machine(gpus), 512, gpus)
    state, grads, host = DOCUMENTED[name]
    p = model.total_params
    if state(gpus) is not None:
        assert mem.gpu_state == pytest.approx(state(gpus) * p)
    assert mem.host_bytes_per_param == pytest.approx(host)
    if not SYSTEMS[name].checkpoints_on_host:  # SlideFormer's checkpoints are on the host (tested below)
        assert mem.gpu_forward >= activation_bytes(step.w) + loss_bytes(step.w)
    if SYSTEMS[name].gpu_grad_bytes:
        assert mem.gpu_backward >= grads(gpus) * p
    transient = max(mem.gpu_forward, mem.gpu_backward)
    fragmentation = SYSTEMS[name].allocator_fragmentation  # measured for GPU-resident DDP only
    assert fragmentation == (ALLOCATOR_FRAGMENTATION if name == "ddp-resident" else 0.0)
    assert mem.gpu_peak == pytest.approx(mem.gpu_state + (1 + fragmentation) * transient + mem.gpu_reserve)


def test_autocast_keeps_a_bf16_copy_of_every_fp32_weight_until_forward_ends():
    """fp32 weights under autocast (DDP): a bf16 copy of every weight cached until forward ends, checkpoints counted
    as FSDP2's (an fp32 residual stream was counted from 2026-12-07 13:21 to 15:15: it matched rows whose head the
    benchmark had untied, and was 2-8 GiB high once they were predicted as trained)."""
    model = tiny_model(layers=6)
    ddp = _mem("ddp-resident", model, free_machine(1), 512, 1)[1]
    fsdp = _mem("fsdp2-resident", model, free_machine(1), 512, 1)[1]
    gathered = PEER_WINDOW * max(u.params for u in peer_workload(model, free_machine(1), 512, 1).units) * 2
    assert ddp.gpu_forward - fsdp.gpu_forward == pytest.approx(2 * model.total_params - gathered)


def test_gpu_peak_grows_with_batch_and_sharding_divides_resident_state():
    model = load_model_spec("qwen3-4b")
    hw = load_hardware("h200-x1")
    for name in SYSTEMS:
        peaks = [_mem(name, model, hw, 4096, b)[1].gpu_peak for b in (1, 2, 4, 8, 16)]
        assert peaks == sorted(peaks), name
    four = free_machine(4)
    one = _mem("fsdp2-resident", model, four.with_gpus(1), 4096, 1)[1]
    sharded = _mem("fsdp2-resident", model, four, 4096, 4)[1]
    assert sharded.gpu_state == pytest.approx(one.gpu_state / 4)


def _as_trained(model: str, system: str) -> ModelSpec:
    """The model a measured row of simulated ``system`` trained, by the benchmarks' own rule (before 2026-12-07 the
    single-GPU resident system and DeepSpeed untied a tied head; FSDP2 kept it)."""
    from benchmarks.peer_setup import spec_as_trained
    from benchmarks.zero2_heldout import model_spec
    from slidedp.report.peers import SIMULATED_AS

    measured = next(m for m, simulated in SIMULATED_AS.items() if simulated == system)
    return spec_as_trained(model_spec(model), {"system": measured})


@pytest.mark.parametrize("hardware, model, name, fits, oom", [
    # one H200, 2026-12-02: every Qwen3-4B peer ran batch 1-16; GPU-resident Qwen3-8B ran out of memory at 16
    ("h200-x1", "qwen3-4b", "ddp-resident", [1, 2, 4, 8, 16], []),
    ("h200-x1", "qwen3-4b", "fsdp2-offload", [1, 2, 4, 8, 16], []),
    ("h200-x1", "qwen3-4b", "zero2-offload", [1, 2, 4, 8, 16], []),
    # batch 8 ran (130.1 GiB allocated, at most 8.9 GiB of fragmentation: 0.23 of its transient bytes, where the
    # fit's 0.33 says 11.9) and is the rule's one miss: left out
    ("h200-x1", "qwen3-8b", "ddp-resident", [1, 2, 4], [16]),
    # H100 80GB, GPU-resident (c42, c46, 2026-12-07)
    ("h100-sxm-x1", "qwen3-4b", "ddp-resident", [1, 2, 4], [8]),
    ("h100-sxm-x1", "llama3b", "ddp-resident", [4, 8], [16]),
    # batch 32 ran out of memory too (c46): its allocated peak, at least 69.8 GiB, is 9.9 GiB or more above the
    # model's; left out (benchmarks/RESULTS.md, "the smallest card")
    ("h100-sxm-x1", "qwen3-1.7b", "ddp-resident", [8, 16], []),
])
def test_out_of_memory_batches_are_the_measured_ones(hardware, model, name, fits, oom):
    """The first batch out of GPU memory, as measured, counting the caching allocator's fragmentation."""
    hw = load_hardware(hardware)
    spec = _as_trained(model, name)
    budget = hw.gpu.memory_gib * GIB
    assert [b for b in fits + oom if _mem(name, spec, hw, 4096, b)[1].gpu_peak <= budget] == fits


@pytest.mark.xfail(strict=True, reason="the fragmentation fit's one miss on the H200 (benchmarks/RESULTS.md, call46)")
def test_qwen3_8b_batch_8_fits_the_h200_as_it_ran():
    """It ran with 130.1 GiB allocated, so at most 8.9 GiB of fragmentation (0.23 of its transient); the fit's 0.33
    says 11.9 and puts it out of memory. Strict: this passes, and must be moved to the table above, once it is right."""
    hw = load_hardware("h200-x1")
    assert _mem("ddp-resident", load_model_spec("qwen3-8b"), hw, 4096, 8)[1].gpu_peak <= hw.gpu.memory_gib * GIB


@pytest.mark.parametrize("model, batch", [("qwen3-4b", 8), ("llama3b", 16)])
def test_the_allocators_fragmentation_is_what_tips_these_steps_out_of_an_h100(model, batch):
    hw = load_hardware("h100-sxm-x1")
    mem = _mem("ddp-resident", _as_trained(model, "ddp-resident"), hw, 4096, batch)[1]
    assert mem.gpu_peak - mem.gpu_fragmentation <= hw.gpu.memory_gib * GIB < mem.gpu_peak
    assert mem.gpu_fragmentation == pytest.approx(ALLOCATOR_FRAGMENTATION * mem.gpu_transient)


def test_slideformer_keeps_checkpoints_pinned_on_the_host_and_its_cache_units_on_the_gpu():
    """Every decoder layer's bf16 input is in pinned host memory (it grows with the batch there, not on the GPU);
    the GPU holds 3 cache units (bf16 weights + bf16 gradients) sized for the largest unit, the window's
    checkpoints and one layer's working set."""
    model = load_model_spec("qwen3-4b")
    hw = load_hardware("h200-x1")
    one, eight = (_mem("slideformer", model, hw, 4096, b) for b in (1, 8))
    ckpt = model.layers * model.checkpoint_bytes_per_token() * 4096
    assert eight[1].host_buffers - one[1].host_buffers == pytest.approx(7 * ckpt)
    largest = max(u.params for u in one[0].w.units)
    assert one[1].gpu_forward >= 12 * largest
    # Eager attention (SlideFormer hard-codes it): one layer's scores, 16 B each, grow with the batch on the GPU.
    from slidedp.peers.memory import EAGER_SCORE_WORKING_BYTES

    scores = model.heads * 4096 * 4096
    assert eight[1].gpu_forward - one[1].gpu_forward >= 7 * EAGER_SCORE_WORKING_BYTES * scores


def test_slideformer_runs_out_of_memory_where_it_did_on_the_80_gib_h100():
    """2026-12-06 on an H100 80GB, Qwen3-4B at seq 4096: batch 1, 2, 4 ran (12.8 / 21.2 / 38.1 GiB), batch 8
    asked for 16 GiB more with 55.8 in use (eager attention's fp32 scores of 8 sequences)."""
    model, hw = load_model_spec("qwen3-4b"), load_hardware("h100-sxm-x1")
    peaks = {b: _mem("slideformer", model, hw, 4096, b)[1].gpu_peak / GIB for b in (1, 2, 4, 8)}
    assert max(peaks[1], peaks[2], peaks[4]) < 79.2 < peaks[8]


def test_megatrain_holds_its_root_on_the_gpu_and_every_tokens_log_probabilities():
    """bf16 embedding / norm / head on the GPU all step; the loss keeps tokens x vocab bf16 log-probabilities
    until backward, so its forward bytes grow by 2 x vocab per token beyond the shared chunked loss."""
    model = load_model_spec("qwen3-4b")
    hw = load_hardware("h200-x1")
    one, two = (_mem("megatrain", model, hw, 4096, b) for b in (1, 2))
    root = model.total_params - model.layers * model.layer_params
    assert one[1].gpu_state == pytest.approx(2 * root)
    per_seq = two[1].gpu_forward - one[1].gpu_forward
    assert per_seq >= 4096 * model.vocab * 2


@pytest.mark.parametrize("name, beyond", [("zero2-offload", 11.8), ("zero3-offload", 7.6), ("fsdp2-offload", 3.2),
                                          ("ddp-resident", 0.0)])
def test_host_total_is_the_state_plus_what_the_system_was_measured_to_hold_beyond_it(name, beyond):
    """The measured excess over the state (peak RSS less the state, per parameter; systems.py says where) is what
    makes "fits the host" right for DeepSpeed and FSDP2: ZeRO-3-Offload's Qwen3-4B needs 103.4 GiB, not 74.9."""
    model = load_model_spec("qwen3-4b")
    _, mem = _mem(name, model, free_machine(1), 256, 1)
    assert mem.host_total == pytest.approx((SYSTEMS[name].host_state_bytes + beyond) * model.total_params)
