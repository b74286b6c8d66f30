"""The GPU benchmark scripts on a tiny model on the CPU, run as `python -m benchmarks.<name>` subprocesses from the
repository root: they run, compare like with like, and write what RESULTS.md is built from. Nothing here is timed;
the figures come from the H200 runs. (The table and figure code is tested in test_report_peers.py.)"""

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from slidedp.report.peers import load_rows
from tests.builders import REPO, process_gone, read_when_written


def bench(name: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<name> ARGS`` from the repository root, as a user runs it; fails the test on a
    non-zero exit and shows the script's stderr."""
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_peers_chunked_loss_equals_full_cross_entropy():
    """The peers' chunked loss (logits recomputed per chunk) has the plain loss's value and gradients: the
    script's self-check asserts both (float64, a chunk that leaves a short last one) and exits non-zero otherwise."""
    proc = bench("peer_systems", "--self-check")
    assert "self-check ok" in proc.stdout


def test_the_resident_trainer_times_its_phases_when_asked(tiny_config):
    """--phases for the single-GPU GPU-resident peer: each step's forward, backward, clip, optimizer and zero_grad,
    and nothing recorded without it (benchmarks/RESULTS.md, call49: where its fixed part goes)."""
    import torch

    from benchmarks.peer_setup import PhaseClock
    from benchmarks.peer_systems import resident_trainer

    x = torch.randint(0, 97, (2, 16))
    clock = PhaseClock(True, cuda=False)
    _, _, step = resident_trainer(str(tiny_config), "cpu", clock)
    for _ in range(3):
        step(x, x)
    assert len(clock.steps) == 3
    assert set(clock.medians()) == {"forward", "backward", "clip", "optimizer", "zero_grad"}
    assert all(v > 0 for v in clock.medians().values())
    silent = PhaseClock(False, cuda=False)
    _, _, step = resident_trainer(str(tiny_config), "cpu", silent)
    step(x, x)
    assert silent.steps == []


@pytest.mark.slow
def test_peer_compare_runs_every_cpu_capable_system(tmp_path, tiny_config):
    out = tmp_path / "peers"
    systems = ("slidedp", "slidedp-host", "slidedp-compact", "slidedp-int8", "fsdp2-offload", "resident")
    bench("peer_compare", "--model", tiny_config, "--seq", "16", "--batches", "1", "2", "--steps", "2", "--device",
          "cpu", "--systems", *systems, "--out", out)
    rows = load_rows(out)
    assert {(r["system"], r["batch"], r["status"]) for r in rows} == {(s, b, "ok") for s in systems for b in (1, 2)}
    policies = {r["system"]: r["policy"] for r in rows if r["batch"] == 1 and "policy" in r}
    held = {system: policy["gpu_state_units"] for system, policy in policies.items()}
    assert held["slidedp-host"] == 0 and held["slidedp"] > 0  # a tiny model: the tuner holds units on the GPU
    assert held["slidedp-compact"] == 0 and policies["slidedp-compact"]["state"] == "bf16+int8"
    assert held["slidedp-int8"] == 0 and policies["slidedp-int8"]["state"] == "fp32+int8"
    assert policies["slidedp-host"]["state"] == "fp32"
    losses = {r["system"]: r["final_loss"] for r in rows if r["batch"] == 1}
    # Same model init, data and optimizer: after two steps every system reports a loss near ln(vocab).
    assert all(abs(v - math.log(97)) < 0.5 for v in losses.values()), losses
    assert (out / "table.md").exists() and (out / "peer_compare.png").exists()
    assert (out / "slidedp_runs.tar.gz").exists()


@pytest.mark.slow
def test_peer_compare_with_two_ranks_per_system(tmp_path, tiny_config):
    """--gpus 2: SlideDP through slidedp train --nproc 2, FSDP2 offload under torchrun; a global batch that
    does not split over the ranks is a row saying so, not a failure."""
    out = tmp_path / "peers2"
    bench("peer_compare", "--model", tiny_config, "--seq", "16", "--batches", "2", "3", "--steps", "2", "--device",
          "cpu", "--gpus", "2", "--systems", "slidedp", "fsdp2-offload", "--out", out)
    rows = {(r["system"], r["batch"]): r for r in load_rows(out)}
    assert rows[("slidedp", 2)]["status"] == "ok" and rows[("fsdp2-offload", 2)]["status"] == "ok"
    assert rows[("slidedp", 2)]["gpus"] == 2 and rows[("fsdp2-offload", 2)]["gpus"] == 2
    assert rows[("fsdp2-offload", 3)]["status"].startswith("skipped") and rows[("slidedp", 3)]["status"] != "ok"


@pytest.mark.slow
def test_validation_and_long_sequence_scripts_write_run_directories(tmp_path, tiny_config):
    from slidedp.calibration.from_run import load_record

    val = tmp_path / "val"
    bench("validation_runs", "--model", tiny_config, "--device", "cpu", "--steps", "2", "--only", "s1024-b8-keep-c4",
          "--out", val)
    record = load_record(val / "runs" / "tiny-s1024-b8-keep-c4")
    assert record.seq == 1024 and record.batch == 8 and record.policy.chunks_per_layer == 4
    bench("validation_runs", "--model", tiny_config, "--device", "cpu", "--steps", "2", "--set", "gpu_state", "--only",
          "s2048-b4-keep-c4-g8", "--out", val)
    held = load_record(val / "runs" / "tiny-s2048-b4-keep-c4-g8")
    assert held.policy.gpu_state_units == 5  # all of the tiny model's units (3 layers + embedding + head)
    long_seq = tmp_path / "ls"
    bench("long_seq_runs", "--base", tiny_config, "--layers", "2", "--seqs", "32", "64", "--steps", "1", "--device",
          "cpu", "--out", long_seq)
    rows = [json.loads(line) for line in (long_seq / "results.jsonl").read_text().splitlines()]
    assert [(r["seq"], r["status"]) for r in rows] == [(32, "ok"), (64, "ok")]
    assert all(r["model_spec"]["layers"] == 2 for r in rows)


def test_long_seq_tiled_driver_runs_tiled_layers_and_its_search(tmp_path, tiny_config):
    """The #19 H200 driver's CPU path: the capped run and the whole-GPU search's first run, tile 16 forced, each
    a `slidedp train` run that finishes with the tile in its policy; the search stops at --max-seq."""
    out = tmp_path / "tiled"
    bench("long_seq_tiled", "--base", tiny_config, "--layers", "2", "--cap-seq", "32", "--granule", "32", "--max-seq",
          "64", "--seq-tile", "16", "--steps", "1", "--device", "cpu", "--out", out)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["part"], r.get("seq"), r["status"]) for r in rows] == [
        ("cap", 32, "ok"), ("whole", None, "prediction"), ("whole", 64, "ok")]
    assert rows[1]["longest_predicted_seq"] == 64
    for r in (rows[0], rows[2]):
        assert r["policy"]["seq_tile_tokens"] == 16 and r["model_spec"]["layers"] == 2
        assert r["step_time_s"] > 0 and r["tuner_gpu_peak_gib"] > 0 and r["final_loss"] > 0


@pytest.mark.slow
def test_multi_gpu_correctness_part_compares_ranks_with_one_process(tmp_path, tiny_config):
    out = tmp_path / "mg"
    bench("multi_gpu", "--model", tiny_config, "--gpus", "2", "--seq", "16", "--check-steps", "2", "--device", "cpu",
          "--only", "correctness", "--out", out)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    summary = next(r for r in rows if r["experiment"] == "correctness-summary")
    assert summary["status"] == "ok" and summary["max_loss_diff"] < 1e-5  # fp32 on the CPU: the same sums
    assert {r["label"] for r in rows if r["experiment"] == "correctness"} == {"correct-g1-b4", "correct-g2-b4"}


def test_contention_predictions_follow_the_profiles_caps(tmp_path):
    """The contention experiment's predictions (the simulator's fluid network): copies alone get their PCIe
    and duplex caps, two H2D streams share one link, and AdamW slows down while copies share host DRAM."""
    bench("contention", "--out", tmp_path, "--predict-only", "--params", str(2**24))
    p = json.loads((tmp_path / "predictions.json").read_text())
    assert p["h2d_x1_gbps"] == pytest.approx(55.14) and p["h2d_x2_gbps"] == pytest.approx(55.14)  # one link
    assert p["dma_h2d_gbps"] + p["dma_d2h_gbps"] == pytest.approx(101.1)  # both directions: the duplex cap
    assert p["adam16+h2d+d2h_s"] > p["adam16+h2d_s"] > p["adam16_s"]
    assert p["dma@adam16_h2d_gbps"] < p["dma@adam8_h2d_gbps"] < p["dma_h2d_gbps"]  # a faster pass takes more DRAM
    # alone: the one-pass rate at 16 threads (4.523 G params/s x 28 B), below host DRAM (149.6 GB/s)
    assert p["adam16_s"] == pytest.approx(2**24 * 28 / (4.523e9 * 28))
    # with both copies: the pass's solo rate divided by the interference (1.469) and weighted 1.469 (the DRAM
    # weight, host.cpu_dram_weight) against the copies' solo rates (55.14 / 55.04 GB/s alone) while DRAM is full
    limit = 4.523e9 * 28 / 1.469
    share = 149.6e9 * 1.469 * limit / (1.469 * limit + 55.14e9 + 55.04e9)
    assert p["adam16+h2d+d2h_s"] == pytest.approx(2**24 * 28 / share, rel=1e-3)


def test_contention_refit_redoes_an_earlier_calls_predictions_with_this_code(tmp_path):
    """--refit: an earlier call's profile and calibration refitted (its contention fields fitted afresh, here with
    the copies' curve from two thread counts) and compared with what it measured; measured values equal to this
    code's own predictions compare at 0% and count as within 10%."""
    from slidedp.hardware import load_hardware

    load_hardware("h200-x1").save(tmp_path / "profile.yaml")
    gb = 2**28 * 28 / 1e9
    calibration = {"params": 2**28, "adam_bytes_per_param": 28, "threads": 16, "adam_alone_s": gb / 120,
                   "adam_with_h2d+d2h_s": gb / 90, "dma_gbps_alone": 100.0, "dma_gbps_with_adam": 70.0,
                   "adam8_alone_s": gb / 100, "adam8_with_h2d+d2h_s": gb / 80, "dma_gbps_with_adam8": 80.0}
    (tmp_path / "calibration.json").write_text(json.dumps({"contention": calibration}))
    (tmp_path / "measured.json").write_text(json.dumps({"params": 2**24, "adam12_s": 1.0, "dma_h2d_gbps": 1.0}))
    out = bench("contention", "--refit", "--out", tmp_path).stdout
    refit = load_hardware(str(tmp_path / "refit.yaml")).host
    assert set(refit.copy_slowdown) == {108, 126} and set(refit.dma_interference_curve) == {108, 126}
    assert "0 of 2 within 10%" in out and "adam12_s" in out
    predicted = {line.split()[0]: float(line.split()[2]) for line in out.splitlines() if " predicted " in line}
    (tmp_path / "measured.json").write_text(json.dumps({"params": 2**24, **predicted}))
    assert "2 of 2 within 10%" in bench("contention", "--refit", "--out", tmp_path).stdout
    # A call that timed the all-core pass before and after its experiments says how far it moved, and against the
    # calibration's own pass where that was the same size.
    (tmp_path / "measured.json").write_text(json.dumps({"params": 2**28, **predicted, "reference_start_s": 0.25,
                                                        "reference_end_s": 0.275}))
    out = bench("contention", "--refit", "--out", tmp_path).stdout
    assert "0.2500 s before the experiments, 0.2750 s after (+10.0%)" in out
    assert f"the calibration's {gb / 120:.4f} s ({100 * (0.25 / (gb / 120) - 1):+.1f}% at the start)" in out


def test_compact_state_driver_runs_every_part_on_the_cpu(tmp_path, tiny_config):
    """benchmarks/compact_state.py's CPU path: update rates per mode, a host-only step time, and the fine-tune on
    real text with its held-out curve and plot (one mode each: every run is a subprocess)."""
    out = tmp_path / "compact"
    bench("compact_state", "rates", "--params", "300000", "--threads", "1", "--repeats", "1", "--states", "fp32",
          "bf16+int8", "--out", out)
    bench("compact_state", "rates", "--params", "300000", "--threads", "1", "--repeats", "1", "--states", "fp32",
          "--first-touch", "serial", "--out", tmp_path / "serial")
    serial = [json.loads(line) for line in (tmp_path / "serial" / "results.jsonl").read_text().splitlines()]
    assert [(r["state"], r["first_touch"]) for r in serial] == [("fp32", "serial")] and serial[0]["gparams_per_s"] > 0
    bench("compact_state", "steps", "--model", tiny_config, "--seq", "16", "--batches", "2", "--steps", "2",
          "--states", "bf16+int8", "--adam-threads", "1", "--device", "cpu", "--no-tune", "--out", out)
    text = tmp_path / "text.txt"
    text.write_text("Host memory and host DRAM bandwidth are the two walls of host-resident training. " * 200)
    byte_vocab = tmp_path / "tiny300.json"  # the byte-level tokenizer needs 256 ids
    byte_vocab.write_text(json.dumps(dict(json.loads(tiny_config.read_text()), vocab_size=300)))
    bench("compact_state", "finetune", "--model", byte_vocab, "--seq", "32", "--batches", "2", "--steps", "4",
          "--eval-every", "2", "--micro-batch", "2", "--states", "fp32+int8", "--device", "cpu", "--text", text,
          "--out", out)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    rates = {r["state"]: r for r in rows if r["part"] == "rates"}
    assert set(rates) == {"fp32", "bf16+int8"} and all(r["gparams_per_s"] > 0 for r in rates.values())
    steps = {r["state"]: r for r in rows if r["part"] == "steps"}
    assert set(steps) == {"bf16+int8"} and steps["bf16+int8"]["rc"] == 0 and steps["bf16+int8"]["step_time_s"] > 0
    assert steps["bf16+int8"]["measured_host_state_bytes_per_param"] == pytest.approx(6.03, abs=0.05)
    assert steps["bf16+int8"]["adam_threads"] == 1  # the policy the run trained with says so too
    assert "adam_threads: 1" in (out / "runs" / "steps-tiny-b2-bf16+int8-t1" / "policy.yaml").read_text()
    tuned = {r["state"]: r for r in rows if r["part"] == "finetune"}
    assert set(tuned) == {"fp32+int8"} and tuned["fp32+int8"]["rc"] == 0 and tuned["fp32+int8"]["final_eval_loss"] > 0
    assert (out / "finetune_losses.png").exists() and "fp32+int8" in (out / "finetune.md").read_text()


def test_multihost_scaling_writes_a_row_per_point_and_says_why(tmp_path):
    """The #20 scaling study, analytical and small: one host and two, both layouts, strong and weak, one NIC."""
    import pandas as pd

    proc = bench("multihost_scaling", "--analytical", "--models", "llama-3-70b", "--hosts", "1", "2", "--nics", "1",
                 "--out", tmp_path)
    table = pd.read_csv(tmp_path / "scaling.csv")
    assert len(table) == 8 and set(table.layout) == {"replicated", "sharded"}
    assert set(table.scaling) == {"strong", "weak"} and table.why.notna().all()
    one = table[table.hosts == 1]
    assert (one.efficiency == 1.0).all()
    two = table[(table.hosts == 2) & (table.scaling == "weak")].set_index("layout")
    assert two.host_gib_per_host["sharded"] < two.host_gib_per_host["replicated"]
    assert "| llama-3-70b | weak | 1 | 2 | sharded |" in proc.stdout


def test_chat_sft_driver_trains_chat_and_text_and_plots_the_tensorboard_curves(tmp_path, tiny_config):
    """benchmarks/chat_sft.py on the CPU: stdlib functions become conversations, a BPE tokenizer with a chat
    template is made, the chat run trains on answers with eval, the plain-text run on the same text, and the
    curves come back from the TensorBoard event files."""
    model = tmp_path / "tiny600.json"  # the BPE tokenizer made here needs 256 byte ids + merges + 3 specials
    model.write_text(json.dumps(dict(json.loads(tiny_config.read_text()), vocab_size=600,
                                     max_position_embeddings=512)))
    out = tmp_path / "sft"
    bench("chat_sft", "--model", model, "--device", "cpu", "--steps", "2", "--seq", "192", "--batch", "1",
          "--eval-every", "1", "--vocab", "512", "--max-chars", "300", "--text-mb", "0.03", "--out", out)
    rows = {r["run"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"chat", "text"} and all(r["rc"] == 0 and r["tokens_per_s"] > 0 for r in rows.values())
    assert [s for s, _ in rows["chat"]["train_loss"]] == [1, 2] and len(rows["chat"]["eval_loss"]) == 2
    assert rows["text"]["eval_loss"] == [] and len(rows["text"]["train_loss"]) == 2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    assert "<|im_start|>" in tok.chat_template and tok.eos_token == "<|im_end|>"
    first = json.loads((out / "data" / "chat.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert (out / "chat_sft.png").exists() and "| chat |" in (out / "chat_sft.md").read_text()


@pytest.mark.slow
def test_rank_memory_driver_reports_every_ranks_host_memory(tmp_path, tiny_config):
    """benchmarks/rank_memory.py on the CPU: one and two ranks sharing the host state, every rank's RSS and PSS."""
    out = tmp_path / "rm"
    bench("rank_memory", "--model", tiny_config, "--ranks", "1", "2", "--seq", "16", "--batch", "2", "--steps", "2",
          "--device", "cpu", "--out", out)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["ranks"] for r in rows] == [1, 2] and all(r["rc"] == 0 for r in rows)
    for r in rows:
        assert len(r["pss_gib_by_rank"]) == len(r["rss_gib_by_rank"]) == r["ranks"]
        assert 0 < r["pss_sum_gib"] <= r["rss_sum_gib"] and r["state_gib"] > 0
    bad = subprocess.run([sys.executable, "-m", "benchmarks.rank_memory", "--ranks", "4", "--batch", "6", "--out",
                          str(out)], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not divisible" in bad.stderr


def test_compact_state_tunes_under_the_gpu_budget_it_is_given(tmp_path, tiny_config):
    """On an H100 with h200-x1's measured host, the tuner must plan for the 80 GiB card, not the profile's 139 GiB
    (2026-12-06: batch 4 planned 104 GiB and the preflight refused it): --gpu-budget reaches `slidedp tune`."""
    from benchmarks.compact_state import _policy

    roomy = _policy(str(tiny_config), 16, 2, "fp32", tmp_path, True, "h200-x1", gpu_budget=8.0)
    assert (tmp_path / "tuned-b2-fp32-g8.yaml").exists() and roomy.exists()
    _policy(str(tiny_config), 16, 2, "fp32", tmp_path, True, "h200-x1", gpu_budget=1e-6)
    assert not (tmp_path / "tuned-b2-fp32-g1e-06.yaml").exists()  # nothing fits: the default policy, said so


def test_kernel_ab_times_two_builds_of_the_exact_update():
    """benchmarks/kernel_ab.py against the current build itself (the only one CI has): both columns and a ratio."""
    from slidedp.runtime.cpu_adam import build_directory, fused_kernel

    if fused_kernel() is None:
        pytest.skip("no C++ toolchain")
    build = next(build_directory().glob("*.so"))
    out = bench("kernel_ab", build, "--params", "50000", "--threads", "1", "--repeats", "2").stdout
    row = out.splitlines()[-1].split()
    assert row[0] == "50,000" and float(row[2]) > 0 and float(row[3]) > 0 and float(row[4]) > 0
    assert subprocess.run([sys.executable, "-m", "benchmarks.kernel_ab", "/nonexistent.so"], capture_output=True,
                          cwd=REPO).returncode == 2
    out = bench("kernel_ab", build, "--params", "50000", "--threads", "1", "--repeats", "2", "--state", "bf16+int8")
    assert "state bf16+int8" in out.stdout and float(out.stdout.splitlines()[-1].split()[4]) > 0
    bad = subprocess.run([sys.executable, "-m", "benchmarks.kernel_ab", str(build), "--state", "fp16+int8"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1



def _train_summary() -> SimpleNamespace:
    """What benchmarks.common.train_run returns for a run that trained (the fields run_slidedp_train reads)."""
    return SimpleNamespace(policy={"kept_layers": 0}, step_time_s=1.0, tokens_per_s=16.0, model_tflops_per_gpu=1.0,
                           gpu_peak_gib=1.0, host_rss_peak_gib=1.0, limiter="cpu", predicted_step_time_s=1.1,
                           predicted_limiter="cpu", given={"predicted_limiter"}, final_loss=4.0)

def test_slidedp_train_driver_plans_again_for_less_after_running_out_of_gpu_memory(tmp_path, tiny_config, monkeypatch):
    """`slidedp train` exiting with OutOfGpuMemory's code makes the driver tune again for 85% of the budget, into
    a run directory of its own, and the row says which budgets ran out; any other failure is a row at once."""
    from argparse import Namespace

    import benchmarks.common
    from benchmarks.peer_systems import run_slidedp_train
    from slidedp.errors import OutOfGpuMemory
    from slidedp.problem import REPLAN_BUDGET_FRACTION

    calls = []

    def fake_train(model, seq, policy_path, steps, out, **kw):
        calls.append(out.name)
        if len(calls) == 1:
            return OutOfGpuMemory.exit_code, None
        return 0, _train_summary()

    monkeypatch.setattr(benchmarks.common, "train_run", fake_train)
    args = Namespace(profile="h200-x1", gpus=1, model=str(tiny_config), slidedp_gpu_budget=40.0, device="cpu",
                     out=str(tmp_path), batches=[2], seq=16, steps=2)
    rows = []
    run_slidedp_train(args, rows.append, "slidedp-compact")
    assert calls == ["tiny-s16-b2-g1-slidedp-compact", "tiny-s16-b2-g1-slidedp-compact-retry1"]
    assert rows[0]["status"] == "ok" and rows[0]["oom_retries"] == ["40 GiB budget: out of GPU memory"]
    assert rows[0]["planned_gpu_budget_gib"] == pytest.approx(40.0 * REPLAN_BUDGET_FRACTION)

    calls.clear()
    monkeypatch.setattr(benchmarks.common, "train_run", lambda *a, **kw: (calls.append(1), (1, None))[1])
    rows.clear()
    run_slidedp_train(args, rows.append, "slidedp-compact")
    assert calls == [1] and rows[0]["status"] == "failed (exit 1)" and "error" not in rows[0]

    # Out of memory at every budget: three plans, then the larger batches are rows without runs.
    calls.clear()
    monkeypatch.setattr(benchmarks.common, "train_run",
                        lambda *a, **kw: (calls.append(1), (OutOfGpuMemory.exit_code, None))[1])
    rows.clear()
    run_slidedp_train(Namespace(**{**vars(args), "batches": [2, 4]}), rows.append, "slidedp-compact")
    assert len(calls) == 3 and [r["status"] for r in rows] == ["oom", "skipped (oom at smaller)"]
    assert rows[0]["error"].count("out of GPU memory") == 3


def _statuses_after_oom(batches: list[int], oom_from: int) -> list[tuple[int, str]]:
    """Each batch's status in a run where every batch from ``oom_from`` up runs out of GPU memory."""
    from benchmarks.peer_setup import SKIPPED_AFTER_OOM, BatchesAfterOom

    after_oom, rows = BatchesAfterOom(), []
    for batch in batches:
        if after_oom.skips(batch):
            rows.append((batch, SKIPPED_AFTER_OOM))
        elif batch >= oom_from:
            after_oom.ran_out(batch)
            rows.append((batch, "oom"))
        else:
            rows.append((batch, "ok"))
    return rows


def test_only_batches_at_least_as_large_as_one_that_ran_out_of_memory_are_skipped():
    skipped = "skipped (oom at smaller)"
    assert _statuses_after_oom([1, 2, 4, 8], 4) == [(1, "ok"), (2, "ok"), (4, "oom"), (8, skipped)]
    assert _statuses_after_oom([1, 4, 8, 1], 8) == [(1, "ok"), (4, "ok"), (8, "oom"), (1, "ok")]
    assert _statuses_after_oom([8, 4, 2, 1], 8) == [(8, "oom"), (4, "ok"), (2, "ok"), (1, "ok")]
    assert _statuses_after_oom([8, 4, 2, 16, 1], 4) == [(8, "oom"), (4, "oom"), (2, "ok"), (16, skipped), (1, "ok")]


def test_slidedp_train_driver_still_runs_smaller_batches_that_come_after_an_oom(tmp_path, tiny_config, monkeypatch):
    """Batches out of order (device scripts pass ``--batches 1 4 8 1``): after batch 4 runs out of GPU memory at
    every budget, batch 8 is a row without a run and the final batch 1 still runs; descending, all smaller run."""
    from argparse import Namespace

    import benchmarks.common
    from benchmarks.peer_systems import run_slidedp_train
    from slidedp.errors import OutOfGpuMemory

    calls = []

    def fake_train(model, seq, policy_path, steps, out, *, batch, **kw):
        calls.append(batch)
        if batch >= 4:
            return OutOfGpuMemory.exit_code, None
        return 0, _train_summary()

    monkeypatch.setattr(benchmarks.common, "train_run", fake_train)
    args = Namespace(profile="h200-x1", gpus=1, model=str(tiny_config), slidedp_gpu_budget=40.0, device="cpu",
                     out=str(tmp_path), batches=[1, 4, 8, 1], seq=16, steps=2)
    rows = []
    run_slidedp_train(args, rows.append, "slidedp-compact")
    assert calls == [1, 4, 4, 4, 1]
    assert [(r["batch"], r["status"]) for r in rows] == [(1, "ok"), (4, "oom"), (8, "skipped (oom at smaller)"),
                                                         (1, "ok")]
    assert rows[2] == {"system": "slidedp-compact", "model": str(tiny_config), "seq": 16, "batch": 8,
                       "tokens_per_step": 128, "gpus": 1, "status": "skipped (oom at smaller)"}

    calls.clear()
    rows.clear()
    run_slidedp_train(Namespace(**{**vars(args), "batches": [8, 2, 1]}), rows.append, "slidedp-compact")
    assert calls == [8, 8, 8, 2, 1] and [r["status"] for r in rows] == ["oom", "ok", "ok"]


def test_peer_timing_loop_skips_batches_no_smaller_than_one_that_ran_out_and_runs_the_rest(tiny_config):
    """time_batches on one rank with a step that runs out of GPU memory from batch 4 up: a skipped row is the OOM
    row's fields with its own batch; a smaller batch after the OOM (``--batches 1 4 8 1``) still runs."""
    from argparse import Namespace

    import torch

    from benchmarks.peer_setup import Ranks, time_batches

    def step(x, y):
        if x.shape[0] >= 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return torch.tensor(1.5)

    rows = []
    args = Namespace(model=str(tiny_config), seq=8, batches=[1, 4, 8, 1], steps=2)
    time_batches("fake", args, Ranks(0, 1, "cpu"), 64, step, rows.append)
    assert [(r["batch"], r["status"]) for r in rows] == [(1, "ok"), (4, "oom"), (8, "skipped (oom at smaller)"),
                                                         (1, "ok")]
    oom = rows[1]
    assert rows[2] == {**oom, "batch": 8, "tokens_per_step": 64, "status": "skipped (oom at smaller)"}
    assert oom["error"].startswith("CUDA out of memory") and rows[3]["final_loss"] == 1.5
    assert "after_oom_in_process" not in rows[0] and rows[3]["after_oom_in_process"] == 4  # its peaks may show it
    rows.clear()
    time_batches("fake", Namespace(**{**vars(args), "batches": [8, 4, 2, 1]}), Ranks(0, 1, "cpu"), 64, step,
                 rows.append)
    assert [r["status"] for r in rows] == ["oom", "oom", "ok", "ok"]
    assert [r.get("after_oom_in_process") for r in rows] == [None, 8, 4, 4]


def test_each_of_our_variants_has_a_search_space_a_worker_and_a_colour():
    """slidedp.report.peers names SlideDP's variants (OURS) and benchmarks.our_variants gives each its search
    space: the two lists are the same, and every system the comparison can run has a worker and a colour."""
    from benchmarks.our_variants import VARIANT_SPACES
    from benchmarks.peer_systems import WORKERS
    from slidedp.report.peers import COLORS, OURS, SYSTEMS

    assert set(OURS) == set(VARIANT_SPACES) and set(SYSTEMS) == set(WORKERS) == set(COLORS)
    assert VARIANT_SPACES["slidedp-int8"].states == ("fp32+int8",) and not VARIANT_SPACES["slidedp-int8"].gpu_state


def test_slidedp_rows_are_fresh_train_runs_unless_asked_in_process(monkeypatch):
    """Each batch of every SlideDP variant is a `slidedp train` run of its own by default; only the exact-state
    variants on one GPU may run in the worker's process, and only when asked."""
    from argparse import Namespace

    import benchmarks.peer_systems as ps

    calls = []
    monkeypatch.setattr(ps, "run_slidedp_train", lambda args, emit, system: calls.append(system))
    for system in ("slidedp", "slidedp-host", "slidedp-compact"):
        ps.run_slidedp(Namespace(gpus=1, slidedp_in_process=False), None, system)
    assert calls == ["slidedp", "slidedp-host", "slidedp-compact"]
    calls.clear()
    ps.run_slidedp(Namespace(gpus=1, slidedp_in_process=True), None, "slidedp-compact")  # compact: always train
    ps.run_slidedp(Namespace(gpus=2, slidedp_in_process=True), None, "slidedp")  # several GPUs: always train
    assert calls == ["slidedp-compact", "slidedp"]


def test_a_worker_stopped_at_its_limit_takes_what_it_started_with_it(tmp_path):
    """peer_compare's driver stops a worker at its time limit; a `slidedp train` the worker started must not run
    on beside the next system. Here the worker starts a child that would outlive it, then hangs."""
    import time

    from benchmarks.common import run_in_own_session

    pid_file = tmp_path / "child.pid"
    worker = (f"import subprocess, time; c = subprocess.Popen(['sleep', '60']); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    t0 = time.monotonic()
    assert run_in_own_session([sys.executable, "-c", worker], timeout=3, grace_s=2) is None
    assert time.monotonic() - t0 < 20
    assert process_gone(int(pid_file.read_text()))
    # A worker that finishes in time: its exit code, and a child it left behind is ended too.
    worker = (f"import subprocess; c = subprocess.Popen(['sleep', '60']); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid)); raise SystemExit(3)")
    assert run_in_own_session([sys.executable, "-c", worker], timeout=30, grace_s=2) == 3
    assert process_gone(int(pid_file.read_text()))


def test_a_driver_ended_by_sigterm_ends_its_workers_session_first(tmp_path):
    """The device scripts bound each driver with `timeout`, which signals only its own process group; the
    worker's session is outside it, so the driver's SIGTERM must end that session before the driver exits."""
    import signal

    pid_file = tmp_path / "child.pid"
    worker = (f"import subprocess, time; c = subprocess.Popen(['sleep', '60']); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    driver = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from benchmarks.common import run_in_own_session; "
              f"run_in_own_session([sys.executable, '-c', {worker!r}], timeout=60, grace_s=2)")
    proc = subprocess.Popen([sys.executable, "-c", driver])
    child = int(read_when_written(pid_file))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert process_gone(child)


def test_resident_kernels_sorts_kernels_by_kind_and_refuses_a_machine_without_a_gpu():
    from benchmarks.resident_kernels import kernel_kind

    assert kernel_kind("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128>>") == \
        "attention"
    assert kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert kernel_kind("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN") == "gemm"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>") == \
        "other"
    import torch

    if not torch.cuda.is_available():
        proc = subprocess.run([sys.executable, "-m", "benchmarks.resident_kernels", "--out", "x.jsonl"],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_resident_kernels_prices_a_resident_step_by_kind_in_closed_form(tmp_path):
    """With no small-shape penalties and no fixed costs, the model's GEMM seconds of one GPU-resident step are its
    matmul FLOPs (every layer's forward, recomputed forward and twice-as-long backward; the head's forward and
    backward) over the GEMM rate, its attention seconds two forwards and one 2.5x backward at their rates, and all
    kinds together what the plan prices the step's passes and optimizer at (autocast's fp32 work included)."""
    from dataclasses import replace

    from benchmarks.resident_kernels import model_kernel_seconds
    from slidedp.hardware import load_hardware
    from slidedp.model_spec import ModelSpec
    from slidedp.peers import SYSTEMS, PeerStep, system_workload

    hw = load_hardware("h200-x1")
    curves = replace(hw.gpu.compute, gemm_half_m=0.0, gemm_half_n=0.0, gemm_half_k=0.0, kernel_us=0.0,
                     attention_half_seq=0.0, attention_fwd_us=0.0, attention_bwd_us=0.0, step_factor=1.0,
                     layer_dispatch_us=0.0, backward_dispatch_us=0.0, layer_overhead_us=0.0, backward_overhead_us=0.0)
    hw = replace(hw, gpu=replace(hw.gpu, compute=curves))
    spec = ModelSpec(name="plain", layers=3, hidden=256, ffn=768, heads=4, kv_heads=2, head_dim=64, vocab=1000,
                     tied_embeddings=True)
    batch, seq = 2, 512
    tokens = batch * seq
    got = model_kernel_seconds(spec, hw, batch, seq)
    gemm_flops = tokens * (4 * spec.layers * spec.layer_linear_flops_per_token() + 3 * spec.head_flops_per_token())
    assert got["gemm"] == pytest.approx(gemm_flops / (curves.gemm_tflops * 1e12), rel=1e-9)
    attention = tokens * spec.layers * spec.layer_attention_flops_per_token(seq)
    assert got["attention"] == pytest.approx(2 * attention / (curves.attention_fwd_tflops * 1e12)
                                             + 2.5 * attention / (curves.attention_bwd_tflops * 1e12), rel=1e-9)
    system = SYSTEMS["ddp-resident"]
    step = PeerStep(system, system_workload(system, spec, hw, seq, batch))
    plan = sum(step.forward_s(u) + step.backward_s(u)[0] for u in range(step.w.num_units)) + step.gpu_adam_s()
    assert sum(got.values()) == pytest.approx(plan, rel=1e-9)

    rows = tmp_path / "k.jsonl"
    rows.write_text('{"model": "qwen3-0.6b", "batch": 1, "seq": 512, "kind_s": {"gemm": 0.1, "attention": 0.01,'
                    ' "other": 0.1}}\n{"isolated_vs_queued": {}}\n')
    cmd = [sys.executable, "-m", "benchmarks.resident_kernels", "--compare"]
    ok = subprocess.run([*cmd, str(rows)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert ok.returncode == 0 and len([line for line in ok.stdout.splitlines() if line.strip().startswith("1 ")]) == 3
    for bad, why in [([str(tmp_path / "missing.jsonl")], "No such file"), ([str(rows), "--profile", "h100-sxm-x8"],
                                                                          "one-GPU profile")]:
        proc = subprocess.run([*cmd, *bad], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 2 and why in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("model_type", ["qwen3", "llama", "qwen2"])
def test_the_byte_model_of_a_layer_is_what_its_aten_calls_move(model_type):
    """An HF decoder layer's memory-bound aten calls, counted under a dispatch mode on the CPU, move what
    ModelSpec.layer_forward_ops and its backward_ops say per token within 2% forward and 3% backward, with bf16
    weights and with fp32 weights under autocast (the amp stream's counts), in as many kernels within 3 a pass."""
    from benchmarks.layer_bytes import per_token
    from slidedp.compute import AMP_FP32, BF16

    for precision in (BF16, AMP_FP32):
        r = per_token(model_type, precision, (64, 192))
        assert r.counted_fwd == pytest.approx(r.model_fwd, rel=0.02), precision
        assert r.counted_bwd == pytest.approx(r.model_bwd, rel=0.03), precision
        for counted, model in zip(r.counted_kernels, r.model_kernels, strict=True):
            assert abs(counted - model) <= 3, (precision, r.counted_kernels, r.model_kernels)


def test_layer_bytes_refuses_bad_lengths_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.layer_bytes", "--tokens", "9", "3"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "--tokens" in proc.stderr and "Traceback" not in proc.stderr


def test_each_eager_modules_bytes_alone_match_its_constants():
    """Alone, each eager module moves its slidedp.compute.EagerModule count per element forward and backward: RMSNorm
    (its weight's gradient included), SwiGLU and the residual add exactly, rotary within 5% per q/k element; a
    residual add's backward passes the gradient through (0 B)."""
    import torch

    from benchmarks.layer_bytes import module_bytes
    from slidedp import compute as c

    got = module_bytes(torch.bfloat16, 128)
    for name, module, rel in (("rmsnorm", c.RMSNORM, 0.02), ("swiglu", c.SWIGLU, 1e-6), ("residual", c.RESIDUAL, 1e-6),
                              ("rotary", c.ROTARY, 0.05)):
        assert got[name][0] == pytest.approx(module.fwd_bytes, rel=rel), name
        assert got[name][1] == pytest.approx(module.bwd_bytes, rel=rel), name
    assert got["residual"][1] == 0


def test_gemm_conditions_prices_each_layout_on_the_curve_and_refuses_bad_input(tmp_path):
    """--compare sets each measured GEMM beside the fitted curve's price of the GEMM that condition runs: F.linear's
    forward shape, its input gradient (tokens x in from tokens x out) and its weight gradient (out x in over tokens);
    a missing file and a machine without a GPU give one line and exit code 2."""
    from benchmarks.gemm_conditions import main
    from slidedp.compute import Gemm
    from slidedp.hardware import load_hardware

    curves = load_hardware("h100-sxm-x1").gpu.compute
    rows = [{"tokens": 4096, "out": 1024, "in": 2560, "condition": cond, "seconds": s, "tflops": 0.0}
            for cond, s in (("mm_randn", curves.gemm_seconds(Gemm(4096, 1024, 2560))),
                            ("grad_input", curves.gemm_seconds(Gemm(4096, 2560, 1024))),
                            ("grad_weight", 2 * curves.gemm_seconds(Gemm(1024, 2560, 4096))))]
    path = tmp_path / "gemms.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gemm_conditions", "--compare", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    errors = [line.split()[-1] for line in proc.stdout.splitlines()[1:]]
    assert errors == ["+0.0%", "+0.0%", "-50.0%"]
    assert main(["--compare", str(tmp_path / "missing.jsonl")]) == 2
    import torch

    if torch.cuda.is_available():
        return  # the refusal is for machines without a GPU
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gemm_conditions", "--out", str(tmp_path / "x.jsonl")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "GPU host" in proc.stderr and "Traceback" not in proc.stderr


def test_kernel_seconds_keeps_cuda_kernels_only_with_their_kind():
    """resident_kernels and gemm_conditions read a profiler session through one helper: CUDA kernels with their
    kind and seconds; CPU events and record_function spans left out."""
    from types import SimpleNamespace

    from benchmarks.resident_kernels import kernel_seconds

    def event(name, device, us, span=False):
        return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device), device_time=us,
                               is_user_annotation=span)

    prof = SimpleNamespace(events=lambda: [event("nvjet_tst_128x256", "CUDA", 500.0),
                                           event("flash_fwd_kernel", "CUDA", 200.0),
                                           event("aten::mm", "CPU", 900.0),
                                           event("step", "CUDA", 800.0, span=True)])
    assert list(kernel_seconds(prof)) == [("nvjet_tst_128x256", "gemm", 5e-4), ("flash_fwd_kernel", "attention", 2e-4)]
