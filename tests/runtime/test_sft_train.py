"""slidedp train for SFT (#17): eval, logs, the run config, --policy auto, the HF export, resume of the schedule,
--keep, and the run directory checks that come before any state."""

from __future__ import annotations

import argparse
import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from slidedp.cli import build_parser, main
from tests.builders import REPO, TINY
from tests.runtime.sft_helpers import chats, make_tokenizer, write_jsonl


@pytest.fixture
def files(tmp_path):
    make_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "chat.jsonl", chats(24))
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    return tmp_path


def train(tmp, out, *extra):
    return main(["train", "--model", str(tmp / "tiny.json"), "--data", str(tmp / "chat.jsonl"), "--tokenizer",
                 str(tmp / "tok"), "--seq", "96", "--batch", "2", "--out", str(out), "--lr", "1e-2", *extra])


def test_chat_sft_with_eval_logs_keep_and_export(files, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, hf = files / "run", files / "hf"
    assert train(files, out, "--steps", "4", "--eval-fraction", "0.25", "--eval-every", "2", "--save-every", "1",
                 "--keep", "2", "--export-hf", str(hf)) == 0
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics.step) == [1, 2, 3, 4]
    assert metrics.eval_loss.notna().tolist() == [False, True, False, True]
    said = capsys.readouterr()
    said = said.out + said.err
    assert said.count("step 2: eval loss") == 1 and "step 4: eval loss" not in said  # the last one said once,
    assert said.count("eval: loss") == 1  # in the closing lines
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_loss"] == pytest.approx(metrics.eval_loss.iloc[-1], rel=1e-5)
    assert summary["eval_perplexity"] == pytest.approx(float(torch.tensor(summary["eval_loss"]).exp()), rel=1e-5)
    assert summary["data_format"] == "messages" and summary["global_step"] == 4
    assert summary["bottleneck"] == "compute on cpu" and summary["device"] == "cpu"
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("eval/loss")] == [2, 4]
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint", "checkpoint-step3"]
    assert json.loads((out / "checkpoint-step3" / "meta.json").read_text())["data_step"] == 3
    # The export loads as it is in the ecosystem, states bf16, and generates.
    config = json.loads((hf / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert (hf / "generation_config.json").is_file() and (hf / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(hf))
    tok = AutoTokenizer.from_pretrained(str(hf))
    assert model.dtype == torch.bfloat16
    prompt = tok.apply_chat_template([{"role": "user", "content": "what is 1 plus 1?"}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 4
    master = load_file(str(out / "checkpoint" / "state.safetensors"))["master"]
    exported = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    torch.testing.assert_close(exported, master.bfloat16().float())


def test_sharded_export_has_an_index_and_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    from slidedp.runtime.export import export_hf
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
    from slidedp.runtime.host_state import HostState

    (tmp_path / "tiny.json").write_text(json.dumps(TINY["qwen3"]))
    config = load_hf_config(str(tmp_path / "tiny.json"))
    adapter = ModelAdapter(config)
    host = HostState.allocate(adapter.total_params, torch.float32, torch.float32, pin=False)
    host.init_random(adapter, 0)
    export_hf(host, adapter, tmp_path / "hf", None, config, shard_bytes=16_000)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((tmp_path / "hf" / s).is_file() for s in shards)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    exported = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    torch.testing.assert_close(exported, host.master.bfloat16().float())


def test_resume_continues_the_checkpoints_schedule(files):
    straight, split = files / "straight", files / "split"
    assert train(files, straight, "--steps", "4", "--warmup", "1", "--log", "none") == 0
    assert train(files, split, "--steps", "2", "--total-steps", "4", "--warmup", "1", "--log", "none") == 0
    # No schedule flags on the resume: lr, warmup and total steps come from the checkpoint.
    assert main(["train", "--model", str(files / "tiny.json"), "--data", str(files / "chat.jsonl"), "--tokenizer",
                 str(files / "tok"), "--seq", "96", "--batch", "2", "--out", str(split), "--steps", "2",
                 "--resume", str(split / "checkpoint"), "--log", "none"]) == 0
    a = load_file(str(straight / "checkpoint" / "state.safetensors"))
    b = load_file(str(split / "checkpoint" / "state.safetensors"))
    assert torch.equal(a["master"], b["master"])
    assert pd.read_csv(straight / "metrics.csv").lr.tolist() == pd.read_csv(split / "metrics.csv").lr.tolist()
    assert json.loads((split / "summary.json").read_text())["global_step"] == 4


def test_run_config_file_flags_override_and_resolved_copy(files, capsys):
    cfg = files / "run.yaml"
    cfg.write_text(f"model: {files / 'tiny.json'}\ndata: {files / 'chat.jsonl'}\ntokenizer: {files / 'tok'}\n"
                   f"seq: 96\nbatch: 2\nsteps: 5\nout: {files / 'cfgrun'}\nlog: none\nlr: 0.001\n"
                   f"fields:\n  messages: messages\npacking: false\n")
    assert main(["train", "--config", str(cfg), "--steps", "1"]) == 0
    resolved = (files / "cfgrun" / "config.yaml").read_text()
    import yaml

    saved = yaml.safe_load(resolved)
    assert saved["steps"] == 1 and saved["lr"] == 0.001 and saved["packing"] is False
    assert saved["total_steps"] is None  # left out: a rerun with other --steps has its schedule follow them
    assert len(pd.read_csv(files / "cfgrun" / "metrics.csv")) == 1
    # The resolved copy is itself a run config.
    capsys.readouterr()
    assert main(["train", "--config", str(files / "cfgrun" / "config.yaml"), "--out", str(files / "again"),
                 "--steps", "3", "--warmup", "0"]) == 0
    lrs = pd.read_csv(files / "again" / "metrics.csv").lr.tolist()
    assert lrs[0] > lrs[1] > lrs[2]  # a 3-step schedule, not the first run's 1 step and its floor after
    assert "schedule ends" not in capsys.readouterr().err
    assert main(["train", "--config", str(files / "cfgrun" / "config.yaml"), "--out", str(files / "short"),
                 "--steps", "3", "--total-steps", "1", "--warmup", "0", "--host-layout", "sharded"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "the learning-rate schedule ends at step 1 (--total-steps); steps 2-3 run at its floor" in err
    assert "host_layout sharded splits the state across hosts; on one host it is kept whole" in err
    cfg.write_text("steps: many\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "--steps: expected a positive integer" in capsys.readouterr().err
    cfg.write_text("stepz: 3\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "unknown setting 'stepz'" in capsys.readouterr().err
    assert main(["train", "--steps", "1"]) == 2
    assert "missing --model, --data, --out" in capsys.readouterr().err


def test_the_resolved_config_reruns_from_another_directory(files, monkeypatch, tmp_path):
    """Relative paths given in one directory are written absolute; preset names stay names."""
    import yaml

    monkeypatch.chdir(files)
    (files / "h200-x1").write_text("a file named like the hardware preset: the preset is what the run read")
    assert main(["train", "--model", "tiny.json", "--data", "chat.jsonl", "--tokenizer", "tok", "--seq", "96",
                 "--batch", "2", "--steps", "1", "--out", "rel", "--log", "none", "--no-checkpoint"]) == 0
    saved = yaml.safe_load((files / "rel" / "config.yaml").read_text())
    assert saved["model"] == str(files / "tiny.json") and saved["data"] == str(files / "chat.jsonl")
    assert saved["out"] == str(files / "rel") and saved["hardware"] == "h200-x1"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["train", "--config", str(files / "rel" / "config.yaml"), "--out", "again"]) == 0
    assert (elsewhere / "again" / "metrics.csv").exists()


@pytest.mark.parametrize("name", ["pretrain_text.yaml", "chat_sft.yaml"])
def test_shipped_example_configs_parse(name):
    from slidedp.commands.train_args import resolve_settings

    args = build_parser().parse_args(["train", "--config", str(REPO / "examples" / name)])
    args.argv = ["train", "--config", str(REPO / "examples" / name)]
    resolved = resolve_settings(args)
    assert isinstance(resolved, argparse.Namespace) and resolved.model and resolved.steps > 0


def test_policy_auto_tunes_prints_and_reports(files, capsys):
    out = files / "auto"
    assert train(files, out, "--steps", "2", "--policy", "auto", "--log", "none") == 0
    err = capsys.readouterr().err
    assert "policy auto: tuned for h200-x1" in err and "predicted" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy_source"] == "auto" and summary["tuner_step_time_s"] > 0
    assert summary["policy"]["micro_batch"] * summary["policy"]["accumulation"] == 2


@pytest.mark.parametrize("case, message", [
    ("out_is_file", "--out"),
    ("export_is_file", "--export-hf"),
    ("export_not_empty", "not an earlier export"),
    ("wandb_missing", "wandb is not installed"),
])
def test_run_directory_checks_come_first(files, capsys, case, message):
    out, extra = files / "run", []
    if case == "out_is_file":
        out.write_text("x")
    elif case == "export_is_file":
        (files / "hf").write_text("x")
        extra = ["--export-hf", str(files / "hf")]
    elif case == "export_not_empty":
        (files / "hf").mkdir()
        (files / "hf" / "notes.txt").write_text("mine")
        extra = ["--export-hf", str(files / "hf")]
    else:
        pytest.importorskip("tokenizers")
        import importlib.util

        if importlib.util.find_spec("wandb") is not None:
            pytest.skip("wandb is installed here")
        extra = ["--log", "wandb"]
    assert train(files, out, "--steps", "1", *extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0
    assert out.is_file() if case == "out_is_file" else not out.exists()


def test_two_ranks_train_and_evaluate_packed_chat_like_one(files):
    """Packed chat rows, eval split over the ranks: the same losses and eval loss as one process."""
    import os
    import subprocess
    import sys

    common = ["--model", str(files / "tiny.json"), "--data", str(files / "chat.jsonl"), "--tokenizer",
              str(files / "tok"), "--seq", "96", "--batch", "4", "--steps", "2", "--lr", "1e-2", "--eval-fraction",
              "0.3", "--log", "none", "--device", "cpu", "--no-checkpoint"]
    assert main(["train", *common, "--out", str(files / "one")]) == 0
    proc = subprocess.run([sys.executable, "-m", "slidedp.cli", "train", *common, "--nproc", "2", "--out",
                           str(files / "two")], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    one = json.loads((files / "one" / "summary.json").read_text())
    two = json.loads((files / "two" / "summary.json").read_text())
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-5)
    loss_one = pd.read_csv(files / "one" / "metrics.csv").loss.tolist()
    loss_two = pd.read_csv(files / "two" / "metrics.csv").loss.tolist()
    assert loss_two == pytest.approx(loss_one, rel=1e-5)


def test_busiest_resource_counts_overlaps_once():
    from slidedp.trace import busiest_resource, make_trace

    rows = [(0, "cpu", "adam", 1, 0, -1, 0.0, 1.0, 0, 0, 0), (0, "cpu", "adam", 1, 1, -1, 0.5, 1.5, 0, 0, 0),
            (0, "gpu[0]", "fwd", 1, -1, 0, 0.0, 1.2, 0, 0, 0)]
    assert busiest_resource(make_trace(rows)) == "cpu"  # 1.5 s of union beats 1.2 s
    assert busiest_resource(make_trace(rows[1:])) == "gpu[0]"


@pytest.mark.parametrize("state, allowed", [(None, ("fp32",)), ("auto", None), ("bf16+int8", ("bf16+int8",))])
def test_policy_auto_passes_the_allowed_states_to_the_tuner(files, monkeypatch, state, allowed):
    """train --policy auto tunes among the host-state precisions --state allows (auto: every one, logging the
    choice and why); --state auto without --policy auto is refused."""
    from dataclasses import replace

    import slidedp.tune as tuner
    from slidedp.commands.train_args import build_train_spec
    from slidedp.errors import SlideDPError
    from slidedp.state_choice import state_options

    seen, real = [], tuner.tune

    def narrow(model, hw, seq, batch, budget, space, **kw):  # one layout per mode keeps the test fast
        seen.append(space.states)
        space = replace(space, chunks_per_layer=(1,), prefetch_depths=(2,), activations=("recompute",),
                        thread_fractions=(1.0,), gpu_state=False)
        return real(model, hw, seq, batch, budget, space, **kw)

    monkeypatch.setattr(tuner, "tune", narrow)
    argv = ["train", "--model", str(files / "tiny.json"), "--data", "synthetic", "--steps", "1", "--seq", "64",
            "--batch", "2", "--out", str(files / "run"), "--policy", "auto", *(["--state", state] if state else [])]
    args = build_parser().parse_args(argv)
    args.argv = argv
    lines = []
    spec = build_train_spec(args, log=lines.append)
    assert seen == [allowed or state_options("auto")]
    assert spec.policy.state in seen[0]
    assert any(line.startswith("state auto:") for line in lines) == (state == "auto")
    if state == "auto":
        fixed = [a for a in argv if a not in ("--policy", "--state", "auto")] + ["--state", "auto"]
        args = build_parser().parse_args(fixed)
        args.argv = fixed
        with pytest.raises(SlideDPError, match="needs --policy auto"):
            build_train_spec(args)


def test_unpacked_rows_are_not_called_packed(files, capsys):
    assert main(["train", "--model", str(files / "tiny.json"), "--data", str(files / "chat.jsonl"), "--tokenizer",
                 str(files / "tok"), "--seq", "96", "--batch", "2", "--steps", "1", "--out", str(files / "unpacked"),
                 "--log", "none", "--no-checkpoint", "--no-packing"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "rows of one example and padding: attention through a block-causal mask" in err
    assert "packed rows" not in err
