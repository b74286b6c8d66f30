import json
import subprocess
import sys
from pathlib import Path

import pytest

from slidedp.cli import main
from slidedp.problem import resolve_problem
from slidedp.sim import simulate
from slidedp.trace import load_trace

GOLDEN = Path(__file__).parent / "golden" / "simulate_qwen3-0.6b_h100-sxm-x4.json"
ARGS = ["simulate", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--seq", "2048", "--batch", "8"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_default_simulate_prints_tables(capsys):
    code, out, err = run(capsys, "simulate")
    assert code == 0, err
    for text in ("qwen3-14b", "h100-sxm-x4", "Step", "tokens/s", "exposed cpu", "Busiest resources", "GPU peak"):
        assert text in out


def test_golden_json(capsys):
    code, out, _ = run(capsys, *ARGS, "--json")
    assert code == 0
    got = json.loads(out)
    golden = json.loads(GOLDEN.read_text())
    assert got.keys() == golden.keys()
    for section in ("simulated", "analytical"):
        for key in ("step_time_s", "tokens_per_s"):
            assert got[section][key] == pytest.approx(golden[section][key], rel=1e-9)
        assert got[section]["bottleneck"] == golden[section]["bottleneck"]
    assert got["memory"] == pytest.approx(golden["memory"], rel=1e-9)


def test_json_matches_the_api(capsys):
    _, out, _ = run(capsys, *ARGS, "--json")
    *_, w = resolve_problem("qwen3-0.6b", "h100-sxm-x4", None, 2048, 8, None)
    assert json.loads(out)["simulated"]["step_time_s"] == simulate(w).step_time_s


def test_trace_export_formats(capsys, tmp_path):
    for suffix in ("json", "csv", "parquet"):
        path = tmp_path / f"trace.{suffix}"
        if suffix == "parquet":
            pytest.importorskip("pyarrow")
        code, _, err = run(capsys, *ARGS, "--trace", str(path))
        assert code == 0, err
        trace = load_trace(path)
        assert len(trace) > 100 and {"h2d_param", "fwd", "bwd", "adam"} <= set(trace.op)
    chrome = json.loads((tmp_path / "trace.json").read_text())
    assert any(e["ph"] == "X" for e in chrome["traceEvents"])


def test_policy_file(capsys, tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("param_route: replicated\ngrad_route: per_rank\nmicro_batch: 1\naccumulation: 2\n")
    code, out, err = run(capsys, *ARGS, "--policy", str(policy), "--json")
    assert code == 0, err
    assert json.loads(out)["policy"]["param_route"] == "replicated"


@pytest.mark.parametrize("left", ["metrics.csv", "checkpoint", "checkpoint-step4"])
def test_simulate_never_writes_over_a_training_run(capsys, tmp_path, left):
    out = tmp_path / "run"
    assert run(capsys, *ARGS, "--out", str(out))[0] == 0  # an earlier simulation's directory: written again
    assert run(capsys, *ARGS, "--out", str(out))[0] == 0
    before = (out / "summary.json").read_bytes()
    (out / left).mkdir() if left.startswith("checkpoint") else (out / left).write_text("step,loss\n1,2.0\n")
    code, _, err = run(capsys, *ARGS, "--out", str(out))
    assert code == 2 and "holds a training run" in err and err.count("\n") == 1, err
    assert (out / "summary.json").read_bytes() == before


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--model", "gpt-17"], "unknown model"),
    (["simulate", "--hardware", "tpu-v9"], "unknown hardware"),
    (["simulate", "--seq", "-5"], "expected a positive integer"),
    (["simulate", "--batch", "0"], "expected a positive integer"),
    (["simulate", "--batch", "6"], "multiple of the GPU count"),
    (["simulate", "--gpus", "9"], "has only 4 GPU"),
    (["simulate", "--gpu-budget", "10"], "does not fit"),
    (["simulate", "--gpu-budget", "500"], "exceeds the GPU"),
    (["simulate", "--trace", "out.txt"], "suffix"),
    (["simulate", "--frobnicate"], "unrecognized arguments"),
    (["simulate", "--state", "int4"], "state 'int4'"),
    (["simulate", "--state", "fp32+fp8"], "state moments must be one of"),
    (["simulate", "--model", "qwen3-14b", "--hardware", "h200-x1", "--batch", "1"], "host state fp32"),
    (["launch"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("slidedp: error:") and message in err


@pytest.mark.parametrize("content, message", [
    ("param_route: [unclosed", "malformed policy"),
    ("activation: sometimes\n", "is not one of"),
    ("micro_batch: 3\naccumulation: 3\n", "batch 32 != GPUs 4"),
    ("activation: keep\nmicro_batch: 8\naccumulation: 1\n", "does not fit"),
])
def test_bad_policy_files(capsys, tmp_path, content, message):
    policy = tmp_path / "p.yaml"
    policy.write_text(content)
    code, _, err = run(capsys, "simulate", "--policy", str(policy))
    assert code == 2 and message in err and err.count("\n") == 1


def test_missing_policy_file_via_subprocess_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "slidedp.cli", "simulate", "--policy", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip().startswith("slidedp: error: cannot read policy")


H200_14B = ["simulate", "--model", "qwen3-14b", "--hardware", "h200-x1", "--seq", "4096", "--batch", "1"]


@pytest.fixture
def unmeasured_h200(tmp_path) -> str:
    """h200-x1 as it was before its compact update rates were measured (2026-12-04): the derived-rate path."""
    from dataclasses import replace

    from slidedp.hardware import load_hardware

    hw = load_hardware("h200-x1")
    path = tmp_path / "h200-unmeasured.yaml"
    replace(hw, host=replace(hw.host, state_update_gparams_per_s={})).save(path)
    return str(path)


def test_state_auto_chooses_a_mode_that_fits_and_says_why(capsys, monkeypatch, unmeasured_h200):
    """Qwen3-14B does not fit the H200's host in fp32: auto simulates every mode, picks by the rule, prints the
    mode's bytes per parameter (from StatePrecision), whether its rate is measured or derived, and with --peers
    what each peer would need on the host."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run(capsys, *H200_14B, "--state", "auto", "--peers")
    assert code == 0, err
    assert "--state auto chose" in out and "fp32 does not fit" in out
    assert "DERIVED" not in out  # h200-x1 has measured every mode's rate
    code, derived, err = run(capsys, *H200_14B[:4], unmeasured_h200, *H200_14B[5:], "--state", "auto")
    assert code == 0, err
    assert "DERIVED from the measured fp32 rate" in derived
    chosen = out.split("--state auto chose ")[1].split(":")[0]
    held = {"fp32+int8": "8.03", "bf16+bf16": "8", "bf16+int8": "6.03"}[chosen]
    assert f"({held} B/param state)" in out and f"host state {chosen}" in out
    for peer in ("zero2-offload", "fsdp2-offload", "ddp-resident"):
        assert peer in out
    code, out, err = run(capsys, *H200_14B, "--state", "bf16+int8", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["policy"]["state"] == "bf16+int8"
    assert got["memory"]["host_state_bytes_per_param"] == pytest.approx(6 + 8 / 256)


def test_tune_and_sweep_take_the_state(capsys, tmp_path, monkeypatch, unmeasured_h200):
    """tune --state auto writes the mode it chose and says why (fp32 here: see slidedp.state_choice); sweep
    --state gives one row per mode, the auto row the mode the rule picks, and says the compact rates are derived."""
    import pandas as pd
    import yaml

    monkeypatch.setenv("COLUMNS", "200")
    problem = ["--model", "qwen3-4b", "--hardware", unmeasured_h200, "--seq", "4096", "--batch", "1"]
    out = tmp_path / "p.yaml"
    code, text, err = run(capsys, "tune", *problem, "--chunks", "2", "--no-gpu-state", "--top-k", "1",
                          "--state", "auto", "--out", str(out))
    assert code == 0, err
    chosen = yaml.safe_load(out.read_text())["state"]
    # No compact update rate measured: exact state fits, and a derived rate buys no mode for speed.
    assert chosen == "fp32" and f"host state {chosen}" in text and "chosen by --state auto" in text
    assert "not chosen for speed" in text
    ranked = pd.read_csv(tmp_path / "p_ranked.csv")
    assert ranked.state.iloc[0] == chosen and len(set(ranked.state)) > 1
    table = tmp_path / "s.csv"
    code, text, err = run(capsys, "sweep", *problem[:6], "--batches", "1", "--policies", "sharded", "--analytical",
                          "--state", "fp32", "bf16+int8", "auto", "--out", str(table))
    assert code == 0, err
    rows = pd.read_csv(table)
    assert list(rows.state[:2]) == ["fp32", "bf16+int8"] and rows.state_reason.iloc[2].startswith("auto:")
    assert rows.host_state_bytes_per_param[0] == 14 and "DERIVED" in text


def test_a_state_mode_keeps_the_hosts_and_the_attention_span(capsys):
    """`--state` (and auto) re-prices the same step under another state: over 2 hosts the workload kept its hosts
    (it was rebuilt without them and refused the batch: "batch 16 != GPUs 8 x ..."), and packed rows their span."""
    two_hosts = ["simulate", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x8-ib", "--hosts", "2", "--batch", "16",
                 "--json"]
    for state in ("bf16+int8", "auto"):
        code, out, err = run(capsys, *two_hosts, "--state", state)
        assert code == 0, err
        assert json.loads(out)["gpus"] == 8
    code, out, err = run(capsys, *ARGS, "--attention-span", "512", "--state", "bf16+int8", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["attention_span"] == 512 and got["policy"]["state"] == "bf16+int8"


def test_json_carries_the_state_choice_and_the_peers_the_tables_show(capsys):
    code, out, err = run(capsys, *ARGS, "--state", "auto", "--peers", "--json")
    assert code == 0, err
    got = json.loads(out)
    choice = got["state_choice"]
    assert choice["state"] == got["policy"]["state"] and choice["reason"] and "fp32" in choice["step_s"]
    systems = [row["system"] for row in got["peers"]]
    assert systems[0] == f"slidedp ({choice['state']})" and "zero2-offload" in systems
    assert all(row["host_gib"] >= 0 and isinstance(row["fits"], bool) for row in got["peers"])
    _, table, _ = run(capsys, *ARGS, "--state", "auto", "--peers")
    assert all(name in table for name in systems)  # every system's name printed whole


def test_the_header_names_the_hosts(capsys):
    code, out, err = run(capsys, "simulate", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x8-ib", "--hosts", "2",
                         "--batch", "16")
    assert code == 0, err
    assert "(8 GPUs on each of 2 hosts)" in out.splitlines()[0]


@pytest.mark.parametrize("tile, phrase", [
    (1024, "over sequence tiles of 1,024 tokens"),
    (8192, "over one sequence tile (the whole micro-batch of 4,096 tokens)"),
])
def test_the_policy_line_gives_the_tile_a_layer_runs_over(capsys, tmp_path, tile, phrase):
    policy = tmp_path / "p.yaml"
    policy.write_text(f"micro_batch: 2\naccumulation: 1\nseq_tile_tokens: {tile}\n")
    code, out, err = run(capsys, *ARGS, "--policy", str(policy))
    assert code == 0, err
    assert phrase in " ".join(out.split())
