"""Records to training examples: token ids and which of them carry loss.

Three formats, picked by ``--format`` or detected from the first record's fields:
  text               - a document; every token is trained (continued pretraining; packed as one stream)
  prompt_completion  - ``prompt`` then ``completion``; only the completion (and the end token) is trained
  messages           - a list of ``{role, content}`` turns rendered with the tokenizer's own chat template;
                       only the assistant turns are trained
``train_on_prompt`` keeps the loss on system/user/prompt tokens too. ``FieldMap`` renames the fields a
dataset uses (``--fields prompt=question,completion=answer`` or ``role=from,content=value``).

A record is first cut into text segments that are trained or not, and the segments are tokenized
separately and concatenated, so the mask boundary is exact for any tokenizer (no character offsets).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields

from slidedp.config_io import quote
from slidedp.errors import SlideDPError

FORMATS = ("auto", "text", "prompt_completion", "messages")
KNOWN_ROLES = ("system", "user", "assistant", "tool")
TRAINED_ROLE = "assistant"
ENCODE_BLOCK = 512  # records tokenized per batched tokenizer call


@dataclass(frozen=True)
class FieldMap:
    """The dataset's name for each field the formats read."""

    text: str = "text"
    prompt: str = "prompt"
    completion: str = "completion"
    messages: str = "messages"
    role: str = "role"
    content: str = "content"

    @classmethod
    def parse(cls, spec: str | dict | None) -> FieldMap:
        """``"prompt=question,completion=answer"`` (CLI) or a mapping (config file)."""
        if not spec:
            return cls()
        if isinstance(spec, str):
            pairs = {}
            for item in spec.split(","):
                key, sep, value = item.partition("=")
                if not sep or not key.strip() or not value.strip():
                    raise SlideDPError(f"--fields expects name=column pairs separated by commas, got {quote(spec)}")
                if key.strip() in pairs:
                    raise SlideDPError(f"--fields names {quote(key.strip())} twice, in {quote(spec)}")
                pairs[key.strip()] = value.strip()
            spec = pairs
        known = [f.name for f in fields(cls)]
        unknown = [k for k in spec if k not in known]
        if unknown:
            raise SlideDPError(f"--fields: unknown name {quote(unknown[0])} (known: {', '.join(known)})")
        if not all(isinstance(v, str) and v for v in spec.values()):
            raise SlideDPError("--fields: every column name must be a non-empty string")
        return cls(**spec)


@dataclass(frozen=True)
class Example:
    """Token ids of one example and, per token, whether predicting it carries loss."""

    ids: list[int]
    trained: list[bool]


def detect_format(record: dict, fm: FieldMap) -> str:
    if fm.messages in record:
        return "messages"
    if fm.prompt in record and fm.completion in record:
        return "prompt_completion"
    if fm.text in record:
        return "text"
    raise SlideDPError(f"cannot tell the data's format from its fields {quote(sorted(record))}: expected "
                       f"{fm.text!r}, {fm.prompt!r} + {fm.completion!r}, or {fm.messages!r} (or give --format "
                       f"and --fields)")


class Formatter:
    """Cuts records of one format into (text, trained, add_special_tokens) segments, then tokenizes them."""

    def __init__(self, fmt: str, fm: FieldMap, tokenizer, train_on_prompt: bool):
        if fmt not in FORMATS or fmt == "auto":
            raise SlideDPError(f"unknown format {fmt!r}")
        self.fmt, self.fm, self.tok, self.train_on_prompt = fmt, fm, tokenizer, train_on_prompt
        if fmt == "messages":
            tokenizer.render_chat([{"role": "user", "content": "x"}], False)  # no template: one clear error now

    def examples(self, records: Iterable[tuple[str, dict]]) -> Iterator[Example]:
        block: list[list[tuple[str, bool, bool]]] = []
        for n, (label, record) in enumerate(records, start=1):
            try:
                block.append(self.segments(record))
            except SlideDPError as exc:
                raise SlideDPError(f"data {label} record {n}: {exc}") from None
            if len(block) == ENCODE_BLOCK:
                yield from self._encode(block)
                block = []
        yield from self._encode(block)

    def _encode(self, block: list[list[tuple[str, bool, bool]]]) -> Iterator[Example]:
        flat = [seg for segs in block for seg in segs]
        ids: list[list[int] | None] = [None] * len(flat)
        for special in (True, False):  # one batched call per add_special_tokens setting
            where = [i for i, s in enumerate(flat) if s[2] == special]
            for i, toks in zip(where, self.tok.encode_batch([flat[i][0] for i in where], special), strict=True):
                ids[i] = list(toks)
        k = 0
        eos = self.tok.eos_token_id
        for segs in block:
            tokens: list[int] = []
            trained: list[bool] = []
            for _text, train, _special in segs:
                tokens.extend(ids[k])
                trained.extend([train] * len(ids[k]))
                k += 1
            if self.fmt != "messages":  # the chat template closes its own turns
                tokens.append(eos)
                trained.append(True)
            yield Example(tokens, trained)

    # ---- one record ---------------------------------------------------------------------------------------
    def segments(self, record: dict) -> list[tuple[str, bool, bool]]:
        if not isinstance(record, dict):
            raise SlideDPError(f"expected an object, got {type(record).__name__}")
        if self.fmt == "text":
            return [(self._string(record, self.fm.text), True, True)]
        if self.fmt == "prompt_completion":
            prompt = self._string(record, self.fm.prompt)
            completion = self._string(record, self.fm.completion)
            return [(prompt, self.train_on_prompt, True), (completion, True, False)]
        return self._chat(self._messages(record))

    @staticmethod
    def _string(record: dict, name: str) -> str:
        if record.get(name) is None:
            raise SlideDPError(_absent(record, name))
        value = record[name]
        if not isinstance(value, str):
            raise SlideDPError(f"field {name!r} must be a string, got {type(value).__name__}")
        return value

    def _messages(self, record: dict) -> list[dict]:
        fm = self.fm
        if record.get(fm.messages) is None:
            raise SlideDPError(_absent(record, fm.messages))
        turns = record[fm.messages]
        if not isinstance(turns, list) or not turns:
            raise SlideDPError(f"field {fm.messages!r} must be a non-empty list of turns")
        out = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise SlideDPError(f"turn {i} must be an object with {fm.role!r} and {fm.content!r}")
            role, content = turn.get(fm.role), turn.get(fm.content)
            if role not in KNOWN_ROLES:
                raise SlideDPError(f"turn {i}: unknown role {quote(role)} (known: {', '.join(KNOWN_ROLES)}; "
                                   f"--fields role=... names the field)")
            if not isinstance(content, str):
                raise SlideDPError(f"turn {i}: {fm.content!r} must be a string, got {type(content).__name__}")
            out.append({"role": role, "content": content})
        return out

    def _chat(self, msgs: list[dict]) -> list[tuple[str, bool, bool]]:
        """The rendered conversation cut at each assistant turn: the text up to the assistant header (the
        prompt, rendered with add_generation_prompt) is not trained, the turn itself is."""
        render = self.tok.render_chat
        full = render(msgs, False)
        segs: list[tuple[str, bool, bool]] = []
        pos = 0
        for i, m in enumerate(msgs):
            if m["role"] != TRAINED_ROLE:
                continue
            start = len(render(msgs[:i], True)) if i else 0
            end_text = render(msgs[:i + 1], False)
            if not full.startswith(end_text) or not pos <= start <= len(end_text):
                raise SlideDPError("the chat template renders a conversation's earlier turns differently once "
                                   "later turns follow, so the assistant tokens cannot be located; use a "
                                   "prefix-stable template or --format prompt_completion")
            segs += [(full[pos:start], self.train_on_prompt, False), (full[start:len(end_text)], True, False)]
            pos = len(end_text)
        segs.append((full[pos:], self.train_on_prompt, False))
        return [s for s in segs if s[0]]


def _absent(record: dict, name: str) -> str:
    """Why a record's field ``name`` cannot be read: absent (the fields it has), or null, which is also how a
    JSONL record without a field that other records have arrives (datasets gives every record all columns)."""
    if name in record:
        return f"field {name!r} is missing or null"
    return f"missing field {name!r} (fields: {quote(sorted(record))})"
