"""Examples into fixed-length rows of ``seq`` tokens, and the attention mask packed rows need.

Two layouts:
  stream  - (format text) documents concatenated, each followed by its end token, cut into windows of
            seq + 1 tokens: inputs and labels shifted by one, every token trained, no padding; attention is
            plain causal across the whole row (as continued pretraining is usually run).
  packed  - (prompt/completion, messages) whole examples placed one after another in a row until the next
            one does not fit, the rest padded. Each example's position ids restart at 0 and its ``segment``
            id differs from its neighbours', so :func:`block_causal_mask` keeps attention inside the example:
            a packed row computes exactly what the examples would compute one per row. ``packing=False``
            puts one example per row.
Labels are the next token, or -100 where no loss is taken (prompt tokens, padding). An example longer than
``seq`` tokens (seq + 1 ids) is truncated or dropped (``too_long``); an example left with no trained token
is dropped. :class:`PackStats` counts both so the trainer can say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from slidedp.errors import SlideDPError
from slidedp.runtime.formats import Example

IGNORE = -100  # the label that takes no loss (torch.nn.functional.cross_entropy's ignore_index)
TOO_LONG = ("truncate", "drop")


@dataclass(frozen=True)
class Rows:
    """Rows of ``seq`` tokens: what a step consumes. ``position_ids``/``segments`` are None for stream rows
    (positions 0..seq-1, one causal sequence)."""

    input_ids: torch.Tensor  # [n, seq] int64
    labels: torch.Tensor  # [n, seq] int64, IGNORE where no loss
    position_ids: torch.Tensor | None = None  # [n, seq]
    segments: torch.Tensor | None = None  # [n, seq]: example index within its row (padding has its own)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq(self) -> int:
        return self.input_ids.shape[1]

    def select(self, index: torch.Tensor | slice) -> Rows:
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return Rows(self.input_ids[index], self.labels[index], pick(self.position_ids), pick(self.segments))

    def to(self, device) -> Rows:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Rows(move(self.input_ids), move(self.labels), move(self.position_ids), move(self.segments))

    def label_tokens(self) -> int:
        """Tokens that carry loss: the denominator of the mean token loss."""
        return int((self.labels != IGNORE).sum())

    @classmethod
    def from_windows(cls, windows: torch.Tensor) -> Rows:
        """[n, seq + 1] token windows: inputs and the labels shifted by one, every token trained."""
        return cls(windows[:, :-1], windows[:, 1:])

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """For the tokenization cache (int32 on disk: vocabularies are far below 2**31)."""
        out = {f"{prefix}input_ids": self.input_ids.int(), f"{prefix}labels": self.labels.int()}
        if self.position_ids is not None:
            out[f"{prefix}position_ids"] = self.position_ids.int()
            out[f"{prefix}segments"] = self.segments.int()
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str) -> Rows:
        get = lambda k: tensors[prefix + k].long() if prefix + k in tensors else None  # noqa: E731
        return cls(get("input_ids"), get("labels"), get("position_ids"), get("segments"))


@dataclass
class PackStats:
    examples: int = 0
    truncated: int = 0
    dropped_long: int = 0
    dropped_untrained: int = 0
    rows: int = 0
    label_tokens: int = 0
    padding: int = 0

    def describe(self, too_long: str) -> str:
        parts = [f"{self.examples} examples -> {self.rows} rows", f"{self.label_tokens:,} trained tokens"]
        if self.padding:
            parts.append(f"{self.padding:,} padding tokens")
        if self.truncated:
            parts.append(f"{self.truncated} longer than --seq truncated (--too-long {too_long})")
        if self.dropped_long:
            parts.append(f"{self.dropped_long} longer than --seq dropped (--too-long {too_long})")
        if self.dropped_untrained:
            parts.append(f"{self.dropped_untrained} with no trained token dropped")
        return "; ".join(parts)


def pack_stream(examples: Iterable[Example], seq: int) -> tuple[Rows, PackStats]:
    stream: list[int] = []
    stats = PackStats()
    for ex in examples:
        stream.extend(ex.ids)
        stats.examples += 1
    window = seq + 1
    n = (len(stream) - 1) // seq
    if n < 1:
        raise SlideDPError(f"data is shorter than one sequence: {len(stream)} tokens, a sequence needs {window}")
    t = torch.tensor(stream[: n * seq + 1], dtype=torch.int64)
    rows = Rows.from_windows(torch.stack([t[i * seq:i * seq + window] for i in range(n)]))
    stats.rows, stats.label_tokens = n, n * seq
    return rows, stats


def pack_examples(examples: Iterable[Example], seq: int, pad_id: int, packing: bool = True,
                  too_long: str = "truncate") -> tuple[Rows, PackStats]:
    if too_long not in TOO_LONG:
        raise SlideDPError(f"--too-long must be truncate or drop, got {too_long!r}")
    stats = PackStats()
    rows: list[tuple[list[int], list[int], list[int], list[int]]] = []
    cur: tuple[list[int], list[int], list[int], list[int]] | None = None
    for ex in examples:
        stats.examples += 1
        ids, trained = ex.ids, ex.trained
        if len(ids) > seq + 1:
            if too_long == "drop":
                stats.dropped_long += 1
                continue
            stats.truncated += 1
            ids, trained = ids[:seq + 1], trained[:seq + 1]
        inputs = ids[:-1]
        labels = [t if keep else IGNORE for t, keep in zip(ids[1:], trained[1:], strict=True)]
        if not inputs or all(lab == IGNORE for lab in labels):
            stats.dropped_untrained += 1
            continue
        if cur is None or not packing or len(cur[0]) + len(inputs) > seq:
            cur = ([], [], [], [])
            rows.append(cur)
        segment = (cur[3][-1] + 1) if cur[3] else 0
        cur[0].extend(inputs)
        cur[1].extend(labels)
        cur[2].extend(range(len(inputs)))
        cur[3].extend([segment] * len(inputs))
        stats.label_tokens += sum(lab != IGNORE for lab in labels)
    if not rows:
        raise SlideDPError(f"no usable example: {stats.describe(too_long)}")
    n = len(rows)
    out = Rows(torch.full((n, seq), pad_id, dtype=torch.int64), torch.full((n, seq), IGNORE, dtype=torch.int64),
               torch.zeros((n, seq), dtype=torch.int64), torch.zeros((n, seq), dtype=torch.int64))
    for r, (ids, labels, pos, seg) in enumerate(rows):
        k = len(ids)
        out.input_ids[r, :k] = torch.tensor(ids)
        out.labels[r, :k] = torch.tensor(labels)
        out.position_ids[r, :k] = torch.tensor(pos)
        out.position_ids[r, k:] = torch.arange(seq - k)
        out.segments[r, :k] = torch.tensor(seg)
        out.segments[r, k:] = seg[-1] + 1  # padding: a segment of its own, attending only to itself
        stats.padding += seq - k
    stats.rows = n
    return out, stats


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """[b, 1, s, s] boolean (True: may attend): causal and within the same segment. SDPA takes it as is."""
    s = segments.shape[-1]
    same = segments[:, :, None] == segments[:, None, :]
    causal = torch.ones(s, s, dtype=torch.bool, device=segments.device).tril_()
    return (same & causal).unsqueeze(1)
