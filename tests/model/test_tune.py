import pytest
import yaml

from slidedp.cli import main
from slidedp.errors import SlideDPError
from slidedp.hardware import GIB, load_hardware
from slidedp.model import estimate_memory
from slidedp.model_spec import load_model_spec
from slidedp.policy import Policy
from slidedp.problem import Budget, resolve_budget
from slidedp.sim import simulate
from slidedp.tune import TuneSpace, enumerate_policies, tune
from slidedp.workload import StepWorkload

SMALL = TuneSpace(chunks_per_layer=(1, 4), prefetch_depths=(1, 2), activations=("recompute", "offload"),
                  micro_batches=(1, 2), update_schedules=("next_forward", "as_ready"), thread_fractions=(1.0,),
                  clipping=False, gpu_state=False, kept_layers=False)  # brute force covers enumerate_policies


@pytest.mark.parametrize("hardware, batch", [("h100-sxm-x4", 8), ("h200-x1", 4)])
def test_pick_equals_brute_force_simulated_optimum(hardware, batch):
    model, hw = load_model_spec("qwen3-0.6b"), load_hardware(hardware)
    budget = resolve_budget(hw, None, None)
    result = tune(model, hw, 2048, batch, budget, SMALL, refine_top=8)
    brute = min(simulate(StepWorkload(model, hw, p, 2048, batch)).step_time_s
                for p in enumerate_policies(SMALL, hw, batch))
    assert result.best.sim_step_s == pytest.approx(brute, rel=1e-3)
    assert result.best.sim_step_s >= brute * (1 - 1e-12)


def test_no_returned_policy_exceeds_the_budget():
    model, hw = load_model_spec("qwen3-8b"), load_hardware("h200-x1")
    budget = Budget(gpu_bytes=30 * GIB, host_bytes=115 * GIB)
    result = tune(model, hw, 4096, 8, budget, refine_top=3)
    assert result.enumerated > len(result.candidates) > 0  # the budget pruned something
    for cand in result.candidates:
        mem = estimate_memory(StepWorkload(model, hw, cand.policy, 4096, 8))
        assert mem.gpu_peak <= budget.gpu_bytes and mem.host_total <= budget.host_bytes
    assert result.table()["gpu_peak_gib"].max() <= 30


def test_impossible_budget_names_the_smallest_feasible_one():
    model, hw = load_model_spec("qwen3-8b"), load_hardware("h200-x1")
    with pytest.raises(SlideDPError, match=r"smallest feasible budget is ([\d.]+) GiB \(activations") as info:
        tune(model, hw, 4096, 8, Budget(gpu_bytes=4 * GIB, host_bytes=115 * GIB), refine_top=1)
    needed = float(info.value.args[0].rsplit("is ", 1)[1].split(" GiB")[0])
    result = tune(model, hw, 4096, 8, Budget(gpu_bytes=(needed + 0.05) * GIB, host_bytes=115 * GIB), refine_top=1)
    assert result.candidates and result.best.memory.gpu_peak <= (needed + 0.05) * GIB


def test_host_limit_too_small_is_reported():
    model, hw = load_model_spec("qwen3-14b"), load_hardware("h200-x1")
    with pytest.raises(SlideDPError, match="host memory limit"):
        tune(model, hw, 4096, 1, Budget(gpu_bytes=100 * GIB, host_bytes=100 * GIB), refine_top=1)


def test_clipping_excludes_as_ready():
    hw = load_hardware("h200-x1")
    assert all(p.update_schedule != "as_ready" for p in enumerate_policies(TuneSpace(), hw, 4))
    assert any(p.update_schedule == "as_ready" for p in enumerate_policies(TuneSpace(clipping=False), hw, 4))


def test_enumeration_covers_the_space_without_duplicates():
    hw = load_hardware("h100-sxm-x4")
    policies = enumerate_policies(TuneSpace(), hw, 32)
    assert len(policies) >= 1000 and len(set(policies)) == len(policies)
    assert {p.micro_batch * p.accumulation for p in policies} == {8}
    single = enumerate_policies(TuneSpace(), load_hardware("h200-x1"), 8)
    assert {(p.param_route, p.grad_route) for p in single} == {("replicated", "per_rank")}


def test_cli_tune_writes_policy_and_ranked_table(tmp_path, capsys):
    out = tmp_path / "policy.yaml"
    code = main(["tune", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--seq", "2048", "--batch", "8",
                 "--chunks", "2", "4", "--top-k", "3", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    policy = Policy.load(out)
    assert yaml.safe_load(out.read_text())["chunks_per_layer"] in (2, 4)
    table = (tmp_path / "policy_ranked.csv").read_text().splitlines()
    assert table[0].startswith("rank,sim_step_s,model_step_s") and len(table) > 10
    code = main(["simulate", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--seq", "2048", "--batch", "8",
                 "--policy", str(out)])
    assert code == 0 and policy.micro_batch * policy.accumulation * 4 == 8


def test_cli_tune_tokens_per_step_and_errors(tmp_path, capsys):
    code = main(["tune", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--seq", "1024", "--tokens-per-step",
                 "3000", "--chunks", "1", "--top-k", "1", "--out", str(tmp_path / "p.yaml")])
    assert code == 0
    assert Policy.load(tmp_path / "p.yaml").sequences_per_rank() == 3  # 3000 tokens -> 3 sequences of 1024
    capsys.readouterr()
    code = main(["tune", "--model", "qwen3-8b", "--hardware", "h200-x1", "--gpu-budget", "3", "--out",
                 str(tmp_path / "q.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "smallest feasible budget" in err and err.count("\n") == 1
    assert not (tmp_path / "q.yaml").exists()
    code = main(["tune", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--batch", "8", "--tokens-per-step",
                 "3000", "--out", str(tmp_path / "r.yaml")])  # --batch was dropped without a word
    err = capsys.readouterr().err
    assert code == 2 and "give --batch or --tokens-per-step, not both" in err and err.count("\n") == 1


def test_gpu_state_pick_is_the_brute_force_optimum_over_every_held_unit_count():
    """With room to spare the tuner holds units on the GPU, as many as fit; the pick equals the best of every
    policy x every gpu_state_units that fits the budget."""
    from dataclasses import replace

    model, hw = load_model_spec("qwen3-0.6b"), load_hardware("h200-x1")
    space = replace(SMALL, gpu_state=True, activations=("recompute",), micro_batches=(1,), chunks_per_layer=(4,))
    budget = Budget(gpu_bytes=12 * GIB, host_bytes=100 * GIB)
    result = tune(model, hw, 2048, 1, budget, space, refine_top=4)
    held = result.best.policy.gpu_state_units
    assert 0 < held < model.layers + 2  # some, not all: 12 GiB is not room for every unit
    bigger = StepWorkload(model, hw, result.best.policy.with_(gpu_state_units=held + 1), 2048, 1)
    assert estimate_memory(bigger).gpu_peak > budget.gpu_bytes
    fits = [w for p in enumerate_policies(space, hw, 1) for k in range(model.layers + 3)
            if estimate_memory(w := StepWorkload(model, hw, p.with_(gpu_state_units=k), 2048, 1)).gpu_peak
            <= budget.gpu_bytes]
    brute = min(simulate(w).step_time_s for w in fits)
    assert result.best.sim_step_s == pytest.approx(brute, rel=0.02)
    host_only = tune(model, hw, 2048, 1, budget, replace(space, gpu_state=False), refine_top=4)
    assert host_only.best.policy.gpu_state_units == 0
    assert host_only.best.sim_step_s > result.best.sim_step_s


def test_cli_tune_no_gpu_state(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["tune", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--batch", "1", "--chunks", "4",
                 "--no-gpu-state", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text()).get("gpu_state_units", 0) == 0
    assert main(["tune", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--batch", "1", "--chunks", "4",
                 "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["gpu_state_units"] > 0


def test_the_budget_is_the_smaller_of_the_profiles_gpu_and_the_one_the_run_has():
    """h200-x1's plan on an 80 GiB H100 (2026-12-06: peer_compare's tuned Qwen3-8B planned 128, 109 and 92 GiB
    and ran out of memory at each) is planned for the H100; an explicit --gpu-budget is kept as given."""
    from slidedp.problem import GPU_USABLE_FRACTION

    hw = load_hardware("h200-x1")
    assert resolve_budget(hw, None, None, 79.2).gpu_bytes == pytest.approx(GPU_USABLE_FRACTION * 79.2 * GIB)
    assert resolve_budget(hw, None, None, 200.0).gpu_bytes == resolve_budget(hw, None, None).gpu_bytes
    assert resolve_budget(hw, 100.0, None, 79.2).gpu_bytes == 100.0 * GIB


def test_policy_auto_plans_for_each_ranks_share_of_the_card(monkeypatch):
    import argparse

    from slidedp.commands import train_args
    from slidedp.runtime import device

    monkeypatch.setattr(device, "cuda_memory_gib", lambda name: 80.0 if name != "cpu" else None)
    assert train_args.device_gpu_gib(argparse.Namespace(device="cuda", ranks_per_gpu=2)) == 40.0
    assert train_args.device_gpu_gib(argparse.Namespace(device="cuda")) == 80.0
    assert train_args.device_gpu_gib(argparse.Namespace(device="cpu", ranks_per_gpu=1)) is None


def test_the_cards_memory_is_read_from_the_device_named_or_refused_in_one_line(monkeypatch):
    from types import SimpleNamespace

    import torch

    from slidedp.runtime.device import cuda_memory_gib

    assert cuda_memory_gib("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * 2**30))
    assert cuda_memory_gib("cuda") == cuda_memory_gib("cuda:0") == cuda_memory_gib("auto") == 80.0
    from slidedp.runtime.device import rank_gpu_gib

    assert rank_gpu_gib("cuda:0", 2) == 40.0 and rank_gpu_gib("cpu", 2) is None
    for bad, match in (("cuda:x", "expected auto, cpu, cuda or cuda:N"), ("cuda:3", "1 visible GPU")):
        with pytest.raises(SlideDPError, match=match):
            cuda_memory_gib(bad)


def test_a_top_k_beyond_the_candidates_refines_them_all_and_the_progress_ends_at_its_total():
    """--top-k larger than the feasible candidates simulates each once; the progress total becomes the real count
    (it had stayed at policies + top-k, so a bar of 100,000 sat far below full until the end), and the count only
    grows."""
    model, hw = load_model_spec("qwen3-0.6b"), load_hardware("h200-x1")
    calls = []
    result = tune(model, hw, 2048, 4, resolve_budget(hw, None, None), SMALL, refine_top=100_000,
                  progress=lambda done, total: calls.append((done, total)))
    simulated = [c for c in result.candidates if c.sim is not None]
    assert len(simulated) == len(result.candidates)
    assert calls[-1] == (result.enumerated + len(simulated),) * 2
    done = [d for d, _ in calls]
    assert done == sorted(done) and all(d <= t for d, t in calls)
