"""slidedp train end to end on CPU: run directory, resume, export, data handling and bad input."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from slidedp.cli import main
from slidedp.errors import SlideDPError
from slidedp.runtime.data import ByteTokenizer, DataSpec, load_data
from slidedp.runtime.formats import Example
from slidedp.runtime.packing import pack_stream
from tests.builders import TINY


@pytest.fixture
def model_json(tmp_path):
    cfg = dict(TINY["qwen3"], vocab_size=300)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"document {i}: " + "lorem ipsum dolor " * 5}) for i in range(40)))
    return path


def train(tmp_path, model_json, text_file, out, *extra):
    return main(["train", "--model", str(model_json), "--data", str(text_file), "--seq", "32", "--batch", "2",
                 "--out", str(out), "--lr", "1e-2", "--warmup", "1", "--total-steps", "6", *extra])


def test_train_writes_a_complete_run_directory(tmp_path, model_json, text_file):
    out = tmp_path / "run"
    assert train(tmp_path, model_json, text_file, out, "--steps", "3", "--export-hf", str(tmp_path / "hf")) == 0
    for name in ("trace.parquet", "exposure.csv", "summary.json", "policy.yaml", "hardware.yaml", "metrics.csv"):
        assert (out / name).exists(), name
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics.step) == [1, 2, 3] and metrics.loss.notna().all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["source"] == "measured" and summary["steps"] == 3 and summary["predicted_step_time_s"] > 0
    trace = pd.read_parquet(out / "trace.parquet")
    assert {"h2d_param", "fwd", "bwd", "d2h_grad", "adam", "cast"} <= set(trace.op)
    # The exported checkpoint loads into transformers and carries the trained weights.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    state = load_file(str(out / "checkpoint" / "state.safetensors"))
    exported = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    assert exported.numel() == state["master"].numel()
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0


def test_resume_is_bit_identical(tmp_path, model_json, text_file):
    straight, first = tmp_path / "straight", tmp_path / "first"
    assert train(tmp_path, model_json, text_file, straight, "--steps", "4") == 0
    assert train(tmp_path, model_json, text_file, first, "--steps", "2") == 0
    assert train(tmp_path, model_json, text_file, first, "--steps", "2", "--resume", str(first / "checkpoint")) == 0
    a = load_file(str(straight / "checkpoint" / "state.safetensors"))
    b = load_file(str(first / "checkpoint" / "state.safetensors"))
    for key in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(a[key], b[key]), key
    la = pd.read_csv(straight / "metrics.csv").loss.tolist()
    lb = pd.read_csv(first / "metrics.csv").loss.tolist()
    assert la == lb


@pytest.mark.parametrize("case, message", [
    ("missing_model", "not a preset nor a directory"),
    ("malformed_config", "cannot read config.json"),
    ("unsupported", "not supported"),
    ("short_data", "shorter than one sequence"),
    ("over_budget", "preflight: GPU peak"),
    ("bad_policy_batch", "disagrees with the policy"),
    ("bad_jsonl", "cannot parse as json"),
    ("missing_data", "--data"),
    ("missing_eval_data", "--eval-data"),
    ("model_dir_without_config", "has no config.json"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, model_json, text_file, capsys, case, message):
    model, data, extra = str(model_json), str(text_file), []
    if case == "missing_model":
        model = str(tmp_path / "no-such-model")
    elif case == "malformed_config":
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "config.json").write_text("{oops")
        model = str(tmp_path / "bad")
    elif case == "unsupported":
        (tmp_path / "gpt.json").write_text(json.dumps({"model_type": "gpt2"}))
        model = str(tmp_path / "gpt.json")
    elif case == "short_data":
        (tmp_path / "short.txt").write_text("tiny")
        data = str(tmp_path / "short.txt")
    elif case == "over_budget":
        extra = ["--gpu-budget", "0.5"]
    elif case == "bad_policy_batch":
        (tmp_path / "p.yaml").write_text("micro_batch: 1\naccumulation: 3\n")
        extra = ["--policy", str(tmp_path / "p.yaml")]
    elif case == "bad_jsonl":
        (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
        data = str(tmp_path / "bad.jsonl")
    elif case == "missing_data":
        data = str(tmp_path / "nothing.txt")
    elif case == "missing_eval_data":
        extra = ["--eval-data", str(tmp_path / "nothing.jsonl")]
    elif case == "model_dir_without_config":
        (tmp_path / "empty_model").mkdir()
        model = str(tmp_path / "empty_model")
    out = tmp_path / "run"
    code = main(["train", "--model", model, "--data", data, "--seq", "32", "--batch", "2", "--steps", "1",
                 "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and err.strip().count("\n") == 0 and "Traceback" not in err
    assert not out.exists()


def test_data_packing_and_tokenizers(tmp_path, text_file):
    assert ByteTokenizer(300).encode("hé") == [104, 195, 169]
    with pytest.raises(SlideDPError, match="at least 257"):
        ByteTokenizer(100)
    rows, _ = pack_stream([Example(list(range(100)), [True] * 100)], 10)
    assert rows.input_ids.shape == (9, 10) and torch.equal(rows.input_ids[1, :2], torch.tensor([10, 11]))
    assert torch.equal(rows.labels[0], torch.arange(1, 11))  # the windows overlap by the shifted label
    data = load_data(DataSpec(str(text_file)), 300, 32, 2, seed=3).train
    b0, b0_again = data.batch(0), data.batch(0)
    assert b0.input_ids.shape == (2, 32) and torch.equal(b0.input_ids, b0_again.input_ids)
    assert not torch.equal(data.batch(0).input_ids, data.batch(1).input_ids)
    synthetic = load_data(DataSpec("synthetic"), 300, 32, 2, seed=0).train
    assert synthetic.batch(5).input_ids.max() < 300


def test_local_hf_tokenizer_directory(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>")
    fast.save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "d.txt").write_text("hello world " * 20)
    data = load_data(DataSpec(str(tmp_path / "d.txt"), str(tmp_path / "tok")), 300, 16, 1, seed=0).train
    assert int(data.rows.input_ids.max()) < len(vocab)
    # A model directory saved without its tokenizer (config.json only): refused, not an empty tokenizer that
    # turns every text into one token.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 300}))
    with pytest.raises(SlideDPError, match="holds no tokenizer"):
        load_data(DataSpec(str(tmp_path / "d.txt"), str(tmp_path / "model")), 300, 16, 1, seed=0)


def test_checkpoint_write_is_atomic(tmp_path):
    from slidedp.runtime.host_state import HostState

    host = HostState.allocate(10, torch.float32, torch.float32, pin=False)
    host.master.fill_(1.0)
    host.save(tmp_path / "ckpt", {"data_step": 1})
    host.master.fill_(2.0)
    host.save(tmp_path / "ckpt", {"data_step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    other = HostState.allocate(10, torch.float32, torch.float32, pin=False)
    assert other.load(Path(tmp_path / "ckpt"))["data_step"] == 2 and float(other.master[0]) == 2.0


def test_out_of_gpu_memory_is_one_line_with_its_own_exit_code(tmp_path, model_json, text_file, capsys, monkeypatch):
    """A plan that does not fit the GPU after all (the allocator raises mid-step) ends in one line naming the
    predicted peak and the budget, and exit code 4, which drivers read to plan again for less."""
    from slidedp.errors import OutOfGpuMemory
    from slidedp.runtime.trainer import Trainer

    def oom(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nmore detail")

    monkeypatch.setattr(Trainer, "run", oom)
    code = train(tmp_path, model_json, text_file, tmp_path / "run", "--steps", "1", "--no-checkpoint")
    err = capsys.readouterr().err
    assert code == OutOfGpuMemory.exit_code == 4
    line = next(line for line in err.splitlines() if "out of GPU memory" in line)
    assert "predicted peak" in line and "Tried to allocate 2.00 GiB" in line and "--gpu-budget" in line
    assert "Traceback" not in err and "more detail" not in err
