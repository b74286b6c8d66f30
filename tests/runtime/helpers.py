"""Runtime test helpers: seeded token batches, a streaming engine on a tiny config, the plain-PyTorch reference
trainer it must match, `slidedp train` in a subprocess, and what a run directory holds (losses, a checkpoint's
master). The tiny configs themselves are in tests/builders.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.runtime.checkpoint_files import STATE_FILE
from slidedp.runtime.device import Device
from slidedp.runtime.engine import EngineConfig, StreamingEngine
from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
from slidedp.runtime.host_state import HostState
from slidedp.runtime.optim import OptimConfig, lr_at
from slidedp.runtime.tracing import TraceRecorder
from tests.builders import TINY

OPTIM = OptimConfig(lr=3e-3, weight_decay=0.1, max_grad_norm=0.05, warmup_steps=2, total_steps=6)


def batches(vocab: int, seq: int, n_seq: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """``steps`` seeded batches of ``n_seq`` sequences of seq + 1 tokens (inputs plus the shifted labels), so the
    engine and the reference see identical data."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n_seq, seq + 1), generator=g) for _ in range(steps)]


def make_engine(config_path: str, policy: Policy, seq: int, optim: OptimConfig = OPTIM, seed: int = 0,
                varlen_kernel=None):
    """A CPU fp32 streaming engine on an unpinned host state with a seeded init: (engine, adapter, host).
    ``varlen_kernel``: packed rows attend through it instead of the block-causal mask."""
    cfg = load_hf_config(config_path)
    adapter = ModelAdapter(cfg)
    host = HostState.allocate(adapter.total_params, torch.float32, torch.float32, pin=False,
                              precision=policy.state_precision, unit_numels=[u.numel for u in adapter.units])
    host.init_random(adapter, seed)
    spec = ModelSpec.from_hf_config(json.loads(Path(config_path).read_text()), name="tiny")
    device = Device("cpu")
    engine = StreamingEngine(EngineConfig(policy, optim, seq, torch.float32, varlen_kernel=varlen_kernel), adapter,
                             spec, host, device, TraceRecorder(device))
    return engine, adapter, host


def hf_model_with(adapter: ModelAdapter, flat: torch.Tensor):
    """The transformers model of ``adapter``'s config in fp32, its weights taken from the flat host layout."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(adapter.config).float()
    named = dict(model.named_parameters())
    with torch.no_grad():
        for unit in adapter.units:
            for p in unit.params:
                start = unit.offset + p.offset
                named[p.hf_name].copy_(flat[start:start + p.numel].view(p.shape))
    return model


def reference_training(adapter: ModelAdapter, initial: torch.Tensor, data: list[torch.Tensor], micro_batch: int,
                       optim: OptimConfig = OPTIM) -> tuple[list[float], torch.Tensor]:
    """Plain PyTorch: the HF model in fp32, mean token loss over the whole batch, global-norm clipping,
    torch.optim.AdamW, the same warmup + cosine schedule."""
    model = hf_model_with(adapter, initial)
    named = dict(model.named_parameters())
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps,
                            weight_decay=optim.weight_decay)
    losses = []
    for step, tokens in enumerate(data):
        opt.zero_grad()
        total = 0.0
        n_tokens = tokens.shape[0] * (tokens.shape[1] - 1)
        for i in range(0, tokens.shape[0], micro_batch):
            chunk = tokens[i:i + micro_batch]
            logits = model(chunk[:, :-1]).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1),
                                   reduction="sum") / n_tokens
            loss.backward()
            total += loss.item()
        if optim.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, optim.max_grad_norm)
        for group in opt.param_groups:
            group["lr"] = lr_at(optim, step)
        opt.step()
        losses.append(total)
    flat = torch.empty_like(initial)
    for unit in adapter.units:
        for p in unit.params:
            start = unit.offset + p.offset
            flat[start:start + p.numel].copy_(named[p.hf_name].detach().reshape(-1))
    return losses, flat


def run_cli_train(tmp_path, out, *extra, env=None, text="streaming layers through a shared host state "):
    """`slidedp train` in a subprocess on a tiny Qwen3 and a small text file (CPU)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "slidedp.cli", *train_argv(tmp_path, out, text, extra)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def train_argv(tmp_path, out, text: str, extra) -> list[str]:
    """`slidedp train`'s arguments for a tiny Qwen3 on a small text file, both written into ``tmp_path``."""
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "data.txt").write_text(text * 60)
    return ["train", "--model", str(tmp_path / "tiny.json"), "--data", str(tmp_path / "data.txt"), "--seq", "32",
            "--out", str(out), *extra]


def train_in_process(tmp_path, out, *extra, capsys, text="streaming layers through a shared host state "):
    """run_cli_train's run through ``slidedp.cli.main`` in this process, for checks that stop before training
    or need no process of their own (no interpreter and torch start-up, ~4 s a run): (exit code, stderr)."""
    from slidedp.cli import main

    argv = train_argv(tmp_path, out, text, extra)
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


def run_losses(out: Path) -> list[float]:
    """Every step's loss of the run in ``out`` (its metrics.csv)."""
    with open(out / "metrics.csv") as fh:
        return [float(row["loss"]) for row in csv.DictReader(fh)]


def checkpoint_master(checkpoint: Path) -> torch.Tensor:
    """The master weights of the checkpoint (or host share) directory ``checkpoint``."""
    from safetensors.torch import load_file

    return load_file(str(checkpoint / STATE_FILE))["master"]
