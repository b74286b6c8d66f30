"""A sweep of bad inputs across every command and loader: each ends as one `slidedp: error:` line and exit
code 2, quickly, with no traceback and no huge message (issue #15's probe, kept as a test)."""

from __future__ import annotations

import json
import time

import pytest

from slidedp.cli import main
from tests.builders import TINY

NINE = ", ".join(["*{p}"] * 9)
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{NINE.format(p=p)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def _files(tmp) -> dict[str, str]:
    """Name -> path of each bad file a case refers to as {name}."""
    good = dict(TINY["qwen3"], vocab_size=300)
    configs = {
        "cfg_zero_heads": dict(good, num_attention_heads=0),
        "cfg_zero_head_dim": dict(good, head_dim=0),
        "cfg_huge_layers": dict(good, num_hidden_layers=10**9),
        "cfg_float_layers": dict(good, num_hidden_layers=1e9),
        "cfg_rope0": dict(good, rope_theta=0.0),
        "cfg_eps_neg": dict(good, rms_norm_eps=-1e-6),
        "cfg_no_hidden": {k: v for k, v in good.items() if k != "hidden_size"},
        "cfg_bad_type": dict(good, model_type="gpt2"),
        "cfg_kv_mismatch": dict(good, num_key_value_heads=3),
        "cfg_string_size": dict(good, hidden_size="big"),
        "cfg_list": [1, 2, 3],
    }
    out = {}
    for name, data in configs.items():
        (tmp / f"{name}.json").write_text(json.dumps(data))
        out[name] = str(tmp / f"{name}.json")
    (tmp / "cfg_deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "cfg_bigint.json").write_text('{"model_type": "qwen3", "num_hidden_layers": ' + "9" * 5000 + "}")
    (tmp / "cfg_garbage.json").write_bytes(b"\xff\xfe\x00garbage")
    out.update(cfg_deep=str(tmp / "cfg_deep.json"), cfg_bigint=str(tmp / "cfg_bigint.json"),
               cfg_garbage=str(tmp / "cfg_garbage.json"))
    policies = {
        "pol_bomb": BOMB + "chunks_per_layer: *i\n",
        "pol_huge_chunks": "chunks_per_layer: 1000000000000000000000\n",
        "pol_float_chunks": "chunks_per_layer: 1e12\n",
        "pol_inf": "micro_batch: .inf\n",
        "pol_unknown": "chunkz: 3\n",
        "pol_route": "param_route: broadcast\n",
        "pol_list": "- 1\n- 2\n",
        "pol_neg": "prefetch_depth: -1\n",
        "pol_bool": "accumulation: true\n",
        "pol_long_string": "activation: " + "x" * 100_000 + "\n",
        "pol_syntax": "a: [1, 2\n",
        "pol_gsu": "gpu_state_units: -3\n",
        "pol_tile_neg": "seq_tile_tokens: -4096\n",
        "pol_tile_float": "seq_tile_tokens: 4096.5\n",
        "pol_tile_str": "seq_tile_tokens: big\n",
        "pol_many_chunks": "chunks_per_layer: 100000\n",
    }
    for name, text in policies.items():
        (tmp / f"{name}.yaml").write_text(text)
        out[name] = str(tmp / f"{name}.yaml")
    hardware = (tmp / "hw.yaml")
    from slidedp.hardware import load_hardware

    base = load_hardware("h200-x1").to_dict()
    for name, change in {"hw_inf": ("h2d_gbps", float("inf")), "hw_nan": ("d2h_gbps", float("nan")),
                         "hw_tiny": ("matmul_tflops", 1e-300), "hw_neg_latency": ("pcie_latency_us", -1.0)}.items():
        data = json.loads(json.dumps(base))
        data["gpu"][change[0]] = change[1]
        (tmp / f"{name}.yaml").write_text(__import__("yaml").safe_dump(data))
        out[name] = str(tmp / f"{name}.yaml")
    del hardware
    (tmp / "data.txt").write_text("some text " * 200)
    (tmp / "surrogate.jsonl").write_text('{"text": "\\udc80 lone"}\n' * 50)
    (tmp / "bigint.jsonl").write_text('{"text": ' + "9" * 5000 + "}\n")
    out.update(surrogate=str(tmp / "surrogate.jsonl"), bigint=str(tmp / "bigint.jsonl"))
    (tmp / "empty_dir").mkdir()
    for name in ("dir.json", "dir.csv", "dir.yaml"):  # directories where a command writes a file
        (tmp / name).mkdir()
    (tmp / "not_a_trace.csv").write_text("a,b\n1,2\n")
    profiler_event = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
                      "args": {"stream": 7}}  # a torch.profiler-style event: none of SlideDP's columns
    for name, data in {"trace_profiler": {"traceEvents": [profiler_event]}, "trace_int": {"traceEvents": 5},
                       "trace_list": [], "trace_ints": {"traceEvents": [1, 2]},
                       "trace_no_args": {"traceEvents": [{"ph": "X", "name": "k"}]}}.items():
        (tmp / f"{name}.json").write_text(json.dumps(data))
        out[name] = str(tmp / f"{name}.json")
    (tmp / "foreign_run").mkdir()
    (tmp / "foreign_run" / "trace.json").write_text(json.dumps({"traceEvents": [profiler_event]}))
    out["foreign_run"] = str(tmp / "foreign_run")
    out.update(data=str(tmp / "data.txt"), empty_dir=str(tmp / "empty_dir"), not_a_trace=str(tmp / "not_a_trace.csv"),
               good=str(tmp / "cfg_good.json"), tmp=str(tmp))
    (tmp / "cfg_good.json").write_text(json.dumps(good))
    return out


TRAIN = ["train", "--data", "{data}", "--seq", "16", "--steps", "1", "--device", "cpu", "--out", "{tmp}/run"]
CASES: list[list[str]] = [
    ["simulate", "--model", "no-such-model"],
    ["simulate", "--hardware", "no-such-hardware"],
    ["simulate", "--seq", "-5"],
    ["simulate", "--batch", "0"],
    ["simulate", "--batch", "7"],
    ["simulate", "--gpus", "99"],
    ["simulate", "--gpu-budget", "nan"],
    ["simulate", "--gpu-budget", "1e9"],
    ["simulate", "--policy", "{pol_bomb}"],
    ["simulate", "--policy", "{pol_huge_chunks}"],
    ["simulate", "--policy", "{pol_float_chunks}"],
    ["simulate", "--policy", "{pol_inf}"],
    ["simulate", "--policy", "{pol_unknown}"],
    ["simulate", "--policy", "{pol_route}"],
    ["simulate", "--policy", "{pol_list}"],
    ["simulate", "--policy", "{pol_neg}"],
    ["simulate", "--policy", "{pol_bool}"],
    ["simulate", "--policy", "{pol_long_string}"],
    ["simulate", "--policy", "{pol_syntax}"],
    ["simulate", "--policy", "{pol_gsu}"],
    ["simulate", "--policy", "{pol_tile_neg}"],
    ["simulate", "--policy", "{pol_tile_float}"],
    ["simulate", "--policy", "{pol_tile_str}"],
    ["tune", "--seq-tiles", "-4096"],
    ["tune", "--seq-tiles", "4k"],
    ["tune", "--model", "qwen3-14b", "--hardware", "h100-sxm-x4", "--seq", "262144", "--batch", "4",
     "--gpu-budget", "80", "--seq-tiles", "0", "--chunks", "4"],
    ["simulate", "--policy", "/dev/zero"],
    ["simulate", "--policy", "{tmp}/missing.yaml"],
    ["simulate", "--hardware", "{hw_inf}"],
    ["simulate", "--hardware", "{hw_nan}"],
    ["simulate", "--hardware", "{hw_tiny}"],
    ["simulate", "--hardware", "{hw_neg_latency}"],
    ["simulate", "--model", "{cfg_zero_heads}"],
    ["simulate", "--model", "{cfg_huge_layers}"],
    ["simulate", "--model", "{cfg_float_layers}"],
    ["simulate", "--model", "{cfg_deep}"],
    ["simulate", "--model", "{cfg_bigint}"],
    ["simulate", "--model", "{cfg_garbage}"],
    ["simulate", "--model", "{cfg_list}"],
    ["simulate", "--trace", "{tmp}/trace.txt"],
    ["simulate", "--system", "no-such-system"],
    ["tune", "--model", "no-such-model"],
    ["tune", "--batch", "3", "--gpus", "2", "--hardware", "h100-sxm-x4"],
    ["tune", "--gpu-budget", "0.5"],
    ["sweep", "--policies", "nonsense"],
    ["sweep", "--out", "{tmp}/sweep.txt"],
    ["sweep", "--gpu-counts", "64"],
    ["report", "{tmp}/missing-run"],
    ["report", "{not_a_trace}"],
    ["validate", "{empty_dir}"],
    ["calibrate", "--base", "no-such-profile"],
    ["calibrate", "--model", "{tmp}/missing.json"],
    ["calibrate", "--from-run", "{empty_dir}"],
    [*TRAIN, "--model", "{cfg_zero_heads}"],
    [*TRAIN, "--model", "{cfg_zero_head_dim}"],
    [*TRAIN, "--model", "{cfg_rope0}"],
    [*TRAIN, "--model", "{cfg_eps_neg}"],
    [*TRAIN, "--model", "{cfg_no_hidden}"],
    [*TRAIN, "--model", "{cfg_bad_type}"],
    [*TRAIN, "--model", "{cfg_kv_mismatch}"],
    [*TRAIN, "--model", "{cfg_string_size}"],
    [*TRAIN, "--model", "{good}", "--lr", "inf"],
    [*TRAIN, "--model", "{good}", "--lr", "1e300"],
    [*TRAIN, "--model", "{good}", "--weight-decay", "nan"],
    [*TRAIN, "--model", "{good}", "--max-grad-norm", "nan"],
    [*TRAIN, "--model", "{good}", "--min-lr-ratio", "2"],
    [*TRAIN, "--model", "{good}", "--resume", "{tmp}/missing-ckpt"],
    [*TRAIN, "--model", "{good}", "--policy", "{pol_bomb}"],
    [*TRAIN, "--model", "{good}", "--policy", "{pol_tile_neg}"],
    [*TRAIN[:2], "/dev/zero", *TRAIN[3:], "--model", "{good}"],
    [*TRAIN[:2], "{tmp}/missing-data", *TRAIN[3:], "--model", "{good}"],
    [*TRAIN, "--model", "{good}", "--device", "cuda"],
    [*TRAIN, "--model", "{good}", "--nproc", "0"],
    # found by benchmarks/fault_census.py at #15's first part
    [*TRAIN[:2], "{surrogate}", *TRAIN[3:], "--model", "{good}"],
    [*TRAIN[:2], "{bigint}", *TRAIN[3:], "--model", "{good}"],
    [*TRAIN, "--model", "{good}", "--seed", "1" + "0" * 30],
    [*TRAIN, "--model", "{good}", "--warmup", "1" + "0" * 30],
    [*TRAIN, "--model", "{good}", "--save-every", "-1"],
    [*TRAIN, "--model", "{good}", "--gpu-budget", "inf"],
    [*TRAIN, "--model", "{good}", "--batch", "9" * 5000],
    ["simulate", "--policy", "{pol_many_chunks}"],
    ["tune", "--model", "qwen3-0.6b", "--batch", "8", "--chunks", "100000"],
    # where a command writes: checked before any work (a path under a regular file, a directory where a file
    # goes, /proc, which root's permission bits call writable)
    ["simulate", "--trace", "{data}/x.json"],
    ["simulate", "--trace", "{tmp}/dir.json"],
    ["simulate", "--trace", "/proc/slidedp-x.json"],
    ["simulate", "--out", "{data}/run"],
    ["simulate", "--system", "zero2-offload", "--trace", "{tmp}/dir.json"],
    ["sweep", "--out", "{data}/s.csv"],
    ["sweep", "--out", "{tmp}/dir.csv"],
    ["tune", "--model", "qwen3-0.6b", "--batch", "8", "--out", "{data}/p.yaml"],
    ["tune", "--model", "qwen3-0.6b", "--batch", "8", "--out", "{tmp}/dir.yaml"],
    ["tune", "--model", "qwen3-0.6b", "--batch", "8", "--table", "{tmp}/dir.csv"],
    ["tune", "--model", "qwen3-0.6b", "--batch", "8", "--out", "{tmp}/p.yaml", "--table", "{tmp}/p.yaml"],
    [*TRAIN, "--model", "{good}", "--data", "synthetic", "--eval-fraction", "0.5"],
    [*TRAIN, "--model", "{good}", "--data", "synthetic", "--format", "messages"],
    [*TRAIN, "--model", "{good}", "--data", "synthetic", "--tokenizer", "{tmp}/no-such-tokenizer"],
    [*TRAIN, "--model", "{good}", "--data", "synthetic", "--tokenizer", "{empty_dir}"],
    [*TRAIN, "--model", "{good}", "--export-hf", "{tmp}/run"],
    [*TRAIN, "--model", "{good}", "--device", "cuda:abc"],
    ["calibrate", "--quick", "--out", "{tmp}/p.txt"],
    ["simulate", "--hardware", "{tmp}"],
    ["report", "{not_a_trace}", "--out", "{data}/r"],
    ["report", "{trace_profiler}", "--out", "{tmp}/r"],
    ["report", "{trace_int}", "--out", "{tmp}/r"],
    ["report", "{trace_list}", "--out", "{tmp}/r"],
    ["report", "{trace_ints}", "--out", "{tmp}/r"],
    ["report", "{trace_no_args}", "--out", "{tmp}/r"],
    ["validate", "{foreign_run}"],
    ["calibrate", "--from-run", "{foreign_run}", "--out", "{tmp}/c.yaml"],
    ["validate", "{empty_dir}", "--out", "{tmp}/dir.csv"],
    ["calibrate", "--quick", "--out", "{data}/p.yaml"],
    ["calibrate", "--quick", "--out", "/proc/slidedp-p.yaml"],
    [*TRAIN, "--model", "{good}", "--out", "{data}/run"],
    [*TRAIN, "--model", "{good}", "--out", "/proc/slidedp-run"],
    [*TRAIN, "--model", "{good}", "--cache-dir", "{data}/cache"],
    [*TRAIN, "--model", "{good}", "--export-hf", "{data}/export"],
]


def test_the_sweep_has_at_least_fifty_cases():
    assert len(CASES) >= 50


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c[:1] + c[-2:])[:60] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, tmp_path, capsys):
    files = _files(tmp_path)
    args = [a.format(**files) for a in argv]
    t0 = time.monotonic()
    code = main(args)
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    errors = [line for line in err if line.startswith("slidedp: error:")]
    assert len(errors) == 1 and len(errors[0]) < 600, err
    assert elapsed < 20


def test_a_config_that_transformers_refuses_keeps_the_reason_after_its_heading(tmp_path, capsys):
    """transformers puts a validator's reason on the lines after "Class validation error for validator ...:";
    the one error line carries it (it ended at the colon)."""
    layers = TINY["qwen3"]["num_hidden_layers"]
    (tmp_path / "odd.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300,
                                                       layer_types=["full_attention"] * (layers + 1))))
    argv = [a.format(data="synthetic", tmp=tmp_path) for a in TRAIN]
    assert main([*argv, "--model", str(tmp_path / "odd.json")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("slidedp: error:") and "\n" not in line and not line.endswith(":)"), line
    assert "layer_types" in line.split("invalid config", 1)[1], line


def test_an_activation_transformers_does_not_know_is_one_line_not_a_traceback(tmp_path, capsys):
    (tmp_path / "act.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300, hidden_act="nosuch")))
    argv = [a.format(data="synthetic", tmp=tmp_path) for a in TRAIN]
    assert main([*argv, "--model", str(tmp_path / "act.json")]) == 2
    assert "hidden_act 'nosuch' is not an activation transformers knows" in capsys.readouterr().err
