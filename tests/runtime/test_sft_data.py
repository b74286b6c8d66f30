"""SFT data (#17): formats, loss masks, field mapping, file types through `datasets`, long examples, the
tokenization cache, and bad data as one line with exit code 2."""

from __future__ import annotations

import json

import pytest
import torch

from slidedp.cli import main
from slidedp.errors import SlideDPError
from slidedp.runtime.data import DataSpec, load_data
from slidedp.runtime.packing import IGNORE
from tests.runtime.sft_helpers import chats, make_tokenizer, pairs, write_jsonl

VOCAB = 300


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def trained_text(rows, tok_dir, row: int) -> list[str]:
    """The trained label tokens of one row, decoded and split at the ends of turns."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    labels = rows.labels[row]
    runs, cur = [], []
    for lab in labels.tolist():
        if lab == IGNORE:
            if cur:
                runs.append("".join(tok.convert_ids_to_tokens(cur)))
                cur = []
        else:
            cur.append(lab)
    if cur:
        runs.append("".join(tok.convert_ids_to_tokens(cur)))
    return runs


def test_messages_train_only_on_assistant_turns(tmp_path, tok_dir):
    data = write_jsonl(tmp_path / "chat.jsonl", chats(6))
    loaded = load_data(DataSpec(str(data), str(tok_dir), packing=False), VOCAB, 96, 1, seed=0)
    assert loaded.format == "messages"
    rows = loaded.train.rows
    answers = {f"it is {2 * i}.<|im_end|>\n" for i in range(6)}
    for r in range(len(rows)):
        (run,) = trained_text(rows, tok_dir, r)  # exactly one trained stretch: the assistant's turn
        assert run in answers
    # Keeping the prompt trains every token but the first of each example.
    keep = load_data(DataSpec(str(data), str(tok_dir), packing=False, train_on_prompt=True), VOCAB, 96, 1, 0)
    n_inputs = int((keep.train.rows.segments == 0).sum())
    assert keep.train.rows.label_tokens() == n_inputs > rows.label_tokens()


def test_prompt_completion_masks_and_field_mapping(tmp_path, tok_dir):
    records = [{"question": p["prompt"], "answer": p["completion"]} for p in pairs(5)]
    data = write_jsonl(tmp_path / "qa.jsonl", records)
    spec = DataSpec(str(data), str(tok_dir), format="prompt_completion", fields="prompt=question,completion=answer",
                    packing=False)
    rows = load_data(spec, VOCAB, 40, 1, seed=0).train.rows
    got = sorted(trained_text(rows, tok_dir, r)[0] for r in range(len(rows)))
    assert got == sorted(f"{i} {i}<|im_end|>" for i in range(5))
    with pytest.raises(SlideDPError, match="missing field 'prompt'"):
        load_data(DataSpec(str(data), str(tok_dir), format="prompt_completion"), VOCAB, 40, 1, seed=0)
    nulls = write_jsonl(tmp_path / "nulls.jsonl", [{"prompt": None, "completion": "x"}])
    with pytest.raises(SlideDPError, match="record 1: field 'prompt' is missing or null"):
        load_data(DataSpec(str(nulls), str(tok_dir), format="prompt_completion"), VOCAB, 40, 1, seed=0)


@pytest.mark.parametrize("kind", ["json", "parquet", "csv", "arrow_dir"])
def test_file_types_through_datasets(tmp_path, tok_dir, kind):
    import datasets

    ds = datasets.Dataset.from_list(pairs(8))
    if kind == "json":
        path = tmp_path / "d.json"
        ds.to_json(str(path))
    elif kind == "parquet":
        path = tmp_path / "d.parquet"
        ds.to_parquet(str(path))
    elif kind == "csv":
        path = tmp_path / "d.csv"
        ds.to_csv(str(path), index=False)
    else:
        path = tmp_path / "saved"
        ds.save_to_disk(str(path))
    loaded = load_data(DataSpec(str(path), str(tok_dir)), VOCAB, 64, 1, seed=0)
    assert loaded.format == "prompt_completion"
    assert loaded.train.rows.label_tokens() == sum(len(p["completion"]) + 1 for p in pairs(8))


def test_packing_layout_and_long_examples(tmp_path, tok_dir):
    data = write_jsonl(tmp_path / "qa.jsonl", pairs(10) + [{"prompt": "x", "completion": "y" * 80}])
    packed = load_data(DataSpec(str(data), str(tok_dir)), VOCAB, 64, 1, seed=0)
    rows = packed.train.rows
    assert len(rows) < 11  # several examples share a row
    starts = (rows.position_ids == 0) & (rows.labels != IGNORE).roll(-1, 1)
    assert int(starts.sum()) >= 1
    # Each example's positions restart at 0 where its segment starts.
    change = torch.cat([torch.ones(len(rows), 1, dtype=torch.bool), rows.segments[:, 1:] != rows.segments[:, :-1]], 1)
    assert torch.equal(change, rows.position_ids == 0)
    assert any("1 longer than --seq truncated" in n for n in packed.notes)
    dropped = load_data(DataSpec(str(data), str(tok_dir), too_long="drop"), VOCAB, 64, 1, seed=0)
    assert any("1 longer than --seq dropped" in n for n in dropped.notes)
    assert dropped.train.rows.label_tokens() < rows.label_tokens()


def test_tokenization_is_cached_and_keyed(tmp_path, tok_dir):
    data = write_jsonl(tmp_path / "chat.jsonl", chats(8))
    cache = tmp_path / "cache"
    first = load_data(DataSpec(str(data), str(tok_dir), eval_fraction=0.25), VOCAB, 64, 1, 0, cache_dir=cache)
    again = load_data(DataSpec(str(data), str(tok_dir), eval_fraction=0.25), VOCAB, 64, 1, 0, cache_dir=cache)
    assert not first.cached and again.cached and len(list(cache.iterdir())) == 1
    assert torch.equal(first.train.rows.labels, again.train.rows.labels)
    assert torch.equal(first.eval.input_ids, again.eval.input_ids)
    other = load_data(DataSpec(str(data), str(tok_dir), eval_fraction=0.25), VOCAB, 80, 1, 0, cache_dir=cache)
    assert not other.cached and len(list(cache.iterdir())) == 2  # another seq: another key


def _bad(tmp_path, tok_dir, case):
    """(data path, extra CLI args, expected message) for one kind of bad data."""
    extra = ["--tokenizer", str(tok_dir)]
    if case == "missing_field":
        return write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "c"}]), \
            extra + ["--format", "prompt_completion"], "record 2: field 'completion' is missing or null"
    if case == "unknown_role":
        return write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "wizard", "content": "hi"}]}]), extra, \
            "unknown role 'wizard'"
    if case == "wrong_type":
        return write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": 5}]), extra, \
            "field 'completion' must be a string, got int"
    if case == "empty":
        (tmp_path / "d.jsonl").write_text("")
        return tmp_path / "d.jsonl", extra, "is empty"
    if case == "not_utf8":
        (tmp_path / "d.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
        return tmp_path / "d.jsonl", extra, "not UTF-8 (byte offset 13)"
    if case == "no_template":
        make_tokenizer(tmp_path / "plain", chat_template=None)
        return write_jsonl(tmp_path / "d.jsonl", chats(2)), ["--tokenizer", str(tmp_path / "plain")], \
            "has no chat template"
    if case == "bad_fields":
        return write_jsonl(tmp_path / "d.jsonl", pairs(2)), extra + ["--fields", "answer"], "name=column pairs"
    if case == "twice_named_field":
        return write_jsonl(tmp_path / "d.jsonl", pairs(2)), extra + ["--fields", "prompt=q,prompt=r"], \
            "--fields names 'prompt' twice"
    if case == "unknown_columns":
        return write_jsonl(tmp_path / "d.jsonl", [{"q": "a"}]), extra, "cannot tell the data's format"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing_field", "unknown_role", "wrong_type", "empty", "not_utf8", "no_template",
                                  "bad_fields", "twice_named_field", "unknown_columns"])
def test_bad_data_is_one_line_and_exit_2(tmp_path, tok_dir, capsys, case):
    (tmp_path / "tiny.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": 32,
                                                    "intermediate_size": 64, "num_hidden_layers": 2,
                                                    "num_attention_heads": 4, "num_key_value_heads": 2,
                                                    "head_dim": 8, "max_position_embeddings": 128}))
    data, extra, message = _bad(tmp_path, tok_dir, case)
    out = tmp_path / "run"
    code = main(["train", "--model", str(tmp_path / "tiny.json"), "--data", str(data), "--seq", "32", "--steps", "1",
                 "--out", str(out), "--log", "none", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert not out.exists()
