"""Packed rows compute what the examples compute one per row (#17): same loss and same gradients through
the streaming engine's layer calls; without the block-diagonal mask they would not."""

from __future__ import annotations

import torch

from slidedp.policy import Policy
from slidedp.runtime.formats import Example
from slidedp.runtime.packing import IGNORE, Rows, block_causal_mask, pack_examples
from tests.builders import write_config
from tests.runtime.helpers import hf_model_with, make_engine

SEQ = 32


def examples() -> list[Example]:
    g = torch.Generator().manual_seed(5)
    out = []
    for n, prompt in ((10, 4), (7, 3), (12, 6)):
        ids = torch.randint(1, 97, (n,), generator=g).tolist()
        out.append(Example(ids, [i >= prompt for i in range(n)]))
    return out


def step(tmp_path, rows: Rows, policy: Policy, name: str = "qwen3"):
    """Loss and the step's gradient: with next_forward the update waits, so the gradient is still in the slot."""
    engine, _, host = make_engine(write_config(tmp_path, name), policy, SEQ)
    try:
        stats = engine.step(rows)
        return stats.loss, host.grad_buffer.clone()
    finally:
        engine.close()


def test_block_causal_mask():
    mask = block_causal_mask(torch.tensor([[0, 0, 1, 1, 2]]))[0, 0]
    assert mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]


def test_packed_and_unpacked_give_the_same_loss_and_gradients(tmp_path):
    packed, stats = pack_examples(examples(), SEQ, pad_id=0)
    unpacked, _ = pack_examples(examples(), SEQ, pad_id=0, packing=False)
    assert len(packed) == 1 and len(unpacked) == 3 and stats.padding == SEQ - 26
    assert packed.label_tokens() == unpacked.label_tokens() == 6 + 4 + 6
    for name in ("qwen3", "qwen3-tied"):
        loss_p, grad_p = step(tmp_path, packed, Policy(micro_batch=1, accumulation=1), name)
        loss_u, grad_u = step(tmp_path, unpacked, Policy(micro_batch=3), name)
        assert abs(loss_p - loss_u) < 1e-5 * max(1.0, abs(loss_u))
        assert float(grad_p.abs().sum()) > 0
        torch.testing.assert_close(grad_p, grad_u, rtol=1e-4, atol=1e-6)
    # The mask and the restarted positions are what make it exact: one plain causal row differs.
    leaky = Rows(packed.input_ids, packed.labels)
    loss_l, _ = step(tmp_path, leaky, Policy())
    loss_p, _ = step(tmp_path, packed, Policy())
    assert abs(loss_l - loss_p) > 1e-4


def test_unpacked_rows_match_the_hf_model_per_example(tmp_path):
    """Each example alone through transformers: the mean over trained tokens equals the engine's loss."""
    import torch.nn.functional as F
    packed, _ = pack_examples(examples(), SEQ, pad_id=0)
    engine, adapter, host = make_engine(write_config(tmp_path, "qwen3"), Policy(), SEQ)
    initial = host.master.clone()
    loss = engine.step(packed).loss
    engine.close()
    model = hf_model_with(adapter, initial)
    total, count = 0.0, 0
    for ex in examples():
        ids = torch.tensor([ex.ids])
        labels = torch.tensor([[t if keep else IGNORE for t, keep in zip(ex.ids[1:], ex.trained[1:], strict=True)]])
        with torch.no_grad():
            logits = model(ids[:, :-1]).logits
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"))
        count += int((labels != IGNORE).sum())
    assert abs(loss - total / count) < 1e-5
