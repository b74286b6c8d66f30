"""Packed rows through a variable-length attention kernel (runtime/packed_attention.py) compute what the
block-causal mask computes. torch's varlen kernel is CUDA-only (tests/runtime/test_gpu_packed_attention.py runs
it); here a reference kernel, causal SDPA per example, stands in, so what is tested on the CPU is everything
around the kernel: the example offsets, the layouts in and out, grouped-query heads, the keywords through the
transformers layers, and the engine's choice of path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slidedp.policy import Policy
from slidedp.runtime.formats import Example
from slidedp.runtime.packed_attention import causal_varlen, packed_attention, varlen_rows
from slidedp.runtime.packing import pack_examples
from tests.builders import write_config
from tests.runtime.helpers import make_engine

SEQ = 24


class ReferenceVarlen:
    """Causal SDPA over each example of the flattened stream; counts its calls (a test that never reached the
    kernel would otherwise pass by comparing the mask path with itself)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v, cu_q, cu_k, max_q, max_k, *, scale):
        self.calls += 1
        assert torch.equal(cu_q, cu_k) and max_q == max_k == int((cu_q[1:] - cu_q[:-1]).max())
        assert cu_q.dtype == torch.int32 and int(cu_q[-1]) == q.shape[0]
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        outs = []
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1))
        return torch.cat(outs)


def examples(n: int = 7) -> list[Example]:
    g = torch.Generator().manual_seed(11)
    out = []
    for i in range(n):
        length = 5 + (3 * i) % 9
        ids = torch.randint(1, 97, (length,), generator=g).tolist()
        out.append(Example(ids, [j >= 2 for j in range(length)]))
    return out


def test_offsets_start_each_example_and_each_row():
    rows = varlen_rows(torch.tensor([[0, 0, 1, 1, 2], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]]), kernel=None)
    assert rows.cu_seq.tolist() == [0, 2, 4, 5, 8, 10, 11, 15] and rows.cu_seq.dtype == torch.int32
    assert rows.max_len == 4
    # The same id in two neighbouring rows is still two examples: a row start is always a boundary.
    assert varlen_rows(torch.zeros(2, 3, dtype=torch.int64), kernel=None).cu_seq.tolist() == [0, 3, 6]


def test_the_attention_function_is_sdpa_without_a_kernel():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Module(torch.nn.Module):
        is_causal = True
        num_key_value_groups = 2

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    out, _ = packed_attention(Module(), q, k, v, None, scaling=0.3)
    ref, _ = sdpa_attention_forward(Module(), q, k, v, None, scaling=0.3)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # With a kernel and one example per row it is the same causal attention, in the same output layout.
    kernel = ReferenceVarlen()
    rows = varlen_rows(torch.zeros(2, 6, dtype=torch.int64), kernel)
    out, _ = packed_attention(Module(), q, k, v, None, scaling=0.3, **rows.layer_kwargs())
    assert kernel.calls == 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def _fake_varlen(signature: str):
    seen = {}

    def with_window(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
        seen.update(window_size=window_size, enable_gqa=enable_gqa, kv_heads=k.shape[1])
        return q

    def with_is_causal(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, is_causal=False):
        seen.update(is_causal=is_causal, kv_heads=k.shape[1])
        return q
    return (with_window if signature == "window" else with_is_causal), seen


def test_both_torch_signatures_are_called_causal():
    q, k = torch.zeros(10, 4, 8), torch.zeros(10, 2, 8)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    fn, seen = _fake_varlen("window")  # torch > 2.10: window_size, enable_gqa
    causal_varlen(fn)(q, k, k, cu, cu, 10, 10, scale=None)
    assert seen == {"window_size": (-1, 0), "enable_gqa": True, "kv_heads": 2}
    fn, seen = _fake_varlen("is_causal")  # torch 2.10: is_causal, no GQA: the heads are expanded
    causal_varlen(fn)(q, k, k, cu, cu, 10, 10, scale=None)
    assert seen == {"is_causal": True, "kv_heads": 4}


def _step(tmp_path, name: str, rows, policy: Policy, kernel=None):
    engine, _, host = make_engine(write_config(tmp_path, name), policy, SEQ, varlen_kernel=kernel)
    try:
        return engine.step(rows).loss, host.grad_buffer.clone()
    finally:
        engine.close()


def test_the_varlen_path_trains_like_the_mask(tmp_path):
    rows, _ = pack_examples(examples(), SEQ, pad_id=0)
    assert len(rows) == 3
    # grouped-query heads (qwen3, 4/2) and plain heads (llama); three rows in one micro-batch (the offsets must
    # not run across rows) and one row per micro-batch
    for name, policy in (("qwen3", Policy(micro_batch=3)), ("llama", Policy(micro_batch=1, accumulation=3))):
        kernel = ReferenceVarlen()
        loss_v, grad_v = _step(tmp_path, name, rows, policy, kernel)
        loss_m, grad_m = _step(tmp_path, name, rows, policy)
        assert kernel.calls > 0
        assert abs(loss_v - loss_m) < 1e-5 * max(1.0, abs(loss_m))
        assert float(grad_m.abs().sum()) > 0
        torch.testing.assert_close(grad_v, grad_m, rtol=1e-4, atol=1e-6)


def test_unpacked_rows_never_reach_the_kernel(tmp_path):
    rows, _ = pack_examples(examples(3), SEQ, pad_id=0, packing=False)
    plain = type(rows)(rows.input_ids, rows.labels)  # stream rows: no positions, no segments
    kernel = ReferenceVarlen()
    loss_k, _ = _step(tmp_path, "qwen3", plain, Policy(micro_batch=len(plain)), kernel)
    loss_p, _ = _step(tmp_path, "qwen3", plain, Policy(micro_batch=len(plain)))
    assert kernel.calls == 0 and loss_k == loss_p


def test_train_takes_the_kernel_and_prices_attention_by_the_examples(tmp_path, monkeypatch, capsys):
    """`slidedp train` on packed chat data with a varlen kernel (the reference one standing in for CUDA's): the
    same losses as `--packed-attention mask`, and the summary prices attention at the examples' span."""
    import json

    import pandas as pd

    from slidedp.cli import main
    from slidedp.runtime import trainer
    from slidedp.runtime.data import DataSpec, load_data
    from slidedp.runtime.packed_attention import example_lengths
    from slidedp.units import attention_span
    from tests.builders import TINY
    from tests.runtime.sft_helpers import chats, make_tokenizer, write_jsonl

    make_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "chat.jsonl", chats(24))
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    kernel = ReferenceVarlen()
    monkeypatch.setattr(trainer, "varlen_available", lambda device: True)
    monkeypatch.setattr(trainer, "torch_varlen_kernel", lambda: kernel)

    def run(name: str, *extra: str) -> tuple[list[float], dict]:
        out = tmp_path / name
        assert main(["train", "--model", str(tmp_path / "tiny.json"), "--data", str(tmp_path / "chat.jsonl"),
                     "--tokenizer", str(tmp_path / "tok"), "--seq", "96", "--batch", "2", "--steps", "3",
                     "--no-checkpoint", "--out", str(out), *extra]) == 0
        return pd.read_csv(out / "metrics.csv").loss.tolist(), json.loads((out / "summary.json").read_text())

    losses_v, summary_v = run("varlen")
    assert kernel.calls > 0 and "flash's variable-length kernel" in capsys.readouterr().err
    losses_m, summary_m = run("mask", "--packed-attention", "mask")
    assert losses_v == pytest.approx(losses_m, rel=1e-5)
    rows = load_data(DataSpec(str(tmp_path / "chat.jsonl"), str(tmp_path / "tok")), 300, 96, 2, 0).train.rows
    span = attention_span(example_lengths(rows.segments))
    assert summary_v["attention_span"] == pytest.approx(span) and span < 96
    assert summary_m.get("attention_span") is None
