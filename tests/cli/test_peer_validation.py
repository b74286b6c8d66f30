"""benchmarks.peer_validation and the DeepSpeed workers' configs: what the held-out peer check writes and reads,
without a GPU (the runs themselves need one)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.peer_systems import DEEPSPEED_STAGES, WORKERS, deepspeed_config
from benchmarks.peer_validation import compare_folder, first_oom
from slidedp.peers.systems import SYSTEMS as SIMULATED
from slidedp.peers.systems import ZERO_BUCKET_PARAMS
from slidedp.report.peers import COLORS, SIMULATED_AS, SYSTEMS

REPO = Path(__file__).resolve().parents[2]


def test_each_measured_peer_is_simulated_by_a_registered_system_and_has_a_worker_and_colour():
    for measured, simulated in SIMULATED_AS.items():
        assert measured in SYSTEMS and measured in WORKERS and measured in COLORS
        assert simulated in SIMULATED
    assert SIMULATED_AS["deepspeed-zero3-offload"] == "zero3-offload"


def test_zero2_config_is_the_one_the_earlier_sessions_measured():
    zero = deepspeed_config(2)["zero_optimization"]
    assert zero == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                    "contiguous_gradients": True, "reduce_bucket_size": 200_000_000,
                    "allgather_bucket_size": 200_000_000}
    assert "offload_param" not in zero


def test_zero3_config_offloads_parameters_too_and_keeps_the_bucket_the_simulator_assumes():
    config = deepspeed_config(3)
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zero["reduce_bucket_size"] == ZERO_BUCKET_PARAMS == SIMULATED["zero3-offload"].grad_bucket_params
    assert config["bf16"] == {"enabled": True} and config["gradient_clipping"] == 1.0
    assert {DEEPSPEED_STAGES[m] for m in ("deepspeed-offload", "deepspeed-zero3-offload")} == {2, 3}
    with pytest.raises(ValueError, match="stage 1"):
        deepspeed_config(1)


def test_first_oom_names_the_smallest_batch_that_ran_out():
    assert first_oom({1: False, 4: True, 2: False, 8: True}) == "4"
    assert first_oom({1: False, 2: False}) == "none up to 2"


def test_comparison_from_fetched_files_gives_errors_memory_and_first_oom(tmp_path):
    predictions = {"profile": "p", "peers": {
        "resident": {"1": {"step_s": 0.55, "limiter": "compute", "alloc_gib": 64.0, "reserved_gib": 68.0,
                           "peak_gib": 70.0, "host_gib": 0.0, "fits": True},
                     "2": {"step_s": 1.1, "limiter": "compute", "peak_gib": 90.0, "host_gib": 0.0, "fits": False}},
        "deepspeed-zero3-offload": {"1": {"refused": "no rate"}}},
        "contention": {"adam16_s": 0.05, "profile": "p"}}
    rows = [{"system": "resident", "batch": 1, "status": "ok", "step_time_s": 0.5, "gpu_peak_gib": 66.0,
             "gpu_reserved_gib": 69.0, "host_rss_peak_gib": 1.6},
            {"system": "resident", "batch": 2, "status": "oom"},
            {"system": "deepspeed-zero3-offload", "batch": 1, "status": "ok", "step_time_s": 3.0}]
    (tmp_path / "predictions.json").write_text(json.dumps(predictions))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "contention_measured.json").write_text(json.dumps({"adam16_s": 0.04}))
    text = compare_folder(tmp_path)
    # allocated beside allocated, reserved beside reserved (the card's 70 GiB adds the profile's reserve: not shown)
    assert "| resident | 1 | 0.550 (compute) | 0.500 | +10.0% | 64.0 / 66.0 | 68.0 / 69.0 | 0.0 / 1.6 |" in text
    assert "| resident | 2 | 1.100 (compute) OOM | oom | - |" in text
    assert "| deepspeed-zero3-offload | 1 | no rate | 3.000 | - |" in text
    assert "- resident: MAPE 10.0%, worst +10.0%, 1 of 1 within 10%" in text
    assert "| resident | 2 | 2 |" in text  # predicted and measured first OOM batch
    assert "| adam16_s | 0.0500 | 0.0400 | +25.0% |" in text


def test_calibrate_none_takes_the_base_profile_as_it_is(tmp_path):
    from benchmarks.peer_validation import calibrated_profile
    from slidedp.hardware import load_hardware

    hw = calibrated_profile("none", "h100-sxm-x1", tmp_path)
    assert (tmp_path / "profile.yaml").exists()
    assert load_hardware(str(tmp_path / "profile.yaml")) == hw == load_hardware("h100-sxm-x1")


def test_comparison_reads_the_peers_rows_a_stopped_call_left_in_its_peers_folder(tmp_path):
    predictions = {"peers": {"fsdp2-offload": {"1": {"step_s": 4.0, "limiter": "cpu", "peak_gib": 10.0,
                                                     "host_gib": 70.0, "fits": True}}}}
    (tmp_path / "predictions.json").write_text(json.dumps(predictions))
    (tmp_path / "peers").mkdir()
    (tmp_path / "peers" / "results.jsonl").write_text(json.dumps(
        {"system": "fsdp2-offload", "batch": 1, "status": "ok", "step_time_s": 5.0}) + "\n")
    assert "| fsdp2-offload | 1 | 4.000 (cpu) | 5.000 | -20.0% |" in compare_folder(tmp_path)


def test_steady_step_skips_the_warm_up_steps():
    from benchmarks.peer_setup import PhaseClock, steady_step

    times = [3.435, 4.156, 0.845, 0.868, 0.907]  # c44: ZeRO-3's first batch of a process
    assert steady_step(times, 1) == pytest.approx((0.868 + 0.907) / 2)  # the second step still in it
    assert steady_step(times, 2) == 0.868
    assert steady_step([1.0, 2.0], 2) == 2.0  # too few steps: the last
    clock = PhaseClock(on=True, cuda=False)
    for forward in (3.0, 2.0, 0.2, 0.3, 0.25):
        clock.steps.append({"forward": forward})
    assert clock.medians(2) == {"forward": 0.25}
    assert clock.medians(9) == {"forward": 0.25}


def test_measured_phases_fold_everything_after_backward_and_keep_the_clip_apart():
    from benchmarks.peer_validation import measured_phases

    fsdp2 = {"forward": 0.4, "backward": 0.6, "clip": 1.8, "optimizer": 1.0, "zero_grad": 0.002}
    assert measured_phases(fsdp2) == pytest.approx({"forward": 0.4, "backward": 0.6, "after_backward": 2.802,
                                                    "clip": 1.8})
    assert "clip" not in measured_phases({"forward": 0.1, "backward": 0.8, "optimizer": 1.7})  # DeepSpeed


def test_comparison_puts_predicted_phases_beside_the_measured_ones(tmp_path):
    phases = {"forward": 0.3, "backward": 0.4, "after_backward": 3.1, "clip": 2.1}
    predictions = {"profile": "p", "peers": {"fsdp2-offload": {"1": {
        "step_s": 3.8, "limiter": "cpu", "peak_gib": 12.0, "host_gib": 72.0, "fits": True, "phase_s": phases}}}}
    rows = [{"system": "fsdp2-offload", "batch": 1, "status": "ok", "step_time_s": 3.9,
             "phase_s": {"forward": 0.4, "backward": 0.6, "clip": 1.9, "optimizer": 1.0}}]
    (tmp_path / "predictions.json").write_text(json.dumps(predictions))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = compare_folder(tmp_path)
    assert ("| fsdp2-offload | 1 | 0.300 / 0.400 (-25.0%) | 0.400 / 0.600 (-33.3%) | 3.100 / 2.900 (+6.9%) "
            "| 2.100 / 1.900 (+10.5%) |") in text
    rows[0].pop("phase_s")  # a run without --phases: no phase table
    (tmp_path / "results.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert "Phases" not in compare_folder(tmp_path)


def test_repredict_predicts_a_calls_rows_again_from_another_profile(tmp_path):
    """--compare DIR --repredict PROFILE: today's models on the call's measured rows (the model and sequence from
    the rows), without touching DIR's files; bad input is one line and exit 2."""
    predictions = {"profile": "old", "peers": {"resident": {"1": {"step_s": 9.0, "limiter": "compute",
                                                                  "fits": True}}}}
    row = {"system": "resident", "batch": 1, "status": "ok", "step_time_s": 0.5, "model": "qwen3-0.6b",
           "seq": 1024, "head_as_configured": True, "phase_s": {"forward": 0.1, "backward": 0.3, "clip": 0.02,
                                                                 "optimizer": 0.05}}
    (tmp_path / "predictions.json").write_text(json.dumps(predictions))
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    from benchmarks.peer_predictions import predict
    from slidedp.hardware import load_hardware

    hw = load_hardware("h200-x1")
    text = compare_folder(tmp_path, hw)
    expected = predict("ddp-resident", "qwen3-0.6b", hw, 1024, 1)
    assert f"| resident | 1 | {expected['step_s']:.3f} ({expected['limiter']}) | 0.500 |" in text
    assert "9.000" not in text and "| resident | 1 | " in text.split("Phases")[1]
    assert json.loads((tmp_path / "predictions.json").read_text()) == predictions  # nothing rewritten

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "benchmarks.peer_validation", *argv], capture_output=True,
                              text=True, timeout=120, cwd=REPO)

    run = cli("--repredict", "h200-x1")
    assert run.returncode == 2 and "--repredict needs --compare DIR" in run.stderr
    run = cli("--compare", str(tmp_path), "--repredict", "no-such-profile")
    assert run.returncode == 2 and "Traceback" not in run.stderr and "--repredict no-such-profile" in run.stderr
    (tmp_path / "results.jsonl").write_text(json.dumps({**row, "model": "/no/such/config.json"}) + "\n")
    run = cli("--compare", str(tmp_path), "--repredict", "h200-x1")  # a row naming a model not on this machine
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--compare" in run.stderr.strip().splitlines()[-1] and "config" in run.stderr.strip().splitlines()[-1]
    (tmp_path / "results.jsonl").unlink()
    run = cli("--compare", str(tmp_path))  # a folder without its rows
    assert run.returncode == 2 and "Traceback" not in run.stderr


def test_a_phase_table_row_shows_only_the_phases_both_sides_have():
    from benchmarks.peer_validation import measured_phases, phase_table

    assert measured_phases({"forward": 0.2, "backward": 0.5}) == {"forward": 0.2, "backward": 0.5}
    peers = {"resident": {1: {"phase_s": {"forward": 0.1, "backward": 0.4, "after_backward": 0.05}}}}
    rows = [{"system": "resident", "batch": 1, "status": "ok", "phase_s": {"forward": 0.2, "backward": 0.5}}]
    assert "| resident | 1 | 0.100 / 0.200 (-50.0%) | 0.400 / 0.500 (-20.0%) | - | - |" in phase_table(peers, rows)
