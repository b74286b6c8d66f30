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
