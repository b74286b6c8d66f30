"""Training data: text or jsonl files, a local HF tokenizer or a byte-level fallback, packed into sequences.

Packing concatenates documents separated by an end-of-sequence token and cuts windows of seq + 1 tokens
(inputs plus the shifted labels), so no token is padding. Batches are drawn in a seeded permutation per
epoch and addressed by step number, which is all a resumed run needs to continue where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from slidedp.errors import SlideDPError

BYTE_EOS = 256


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255 and 256 as end-of-sequence: works for any vocabulary of 257+."""

    eos_token_id = BYTE_EOS

    def __init__(self, vocab_size: int):
        if vocab_size < 257:
            raise SlideDPError("the byte-level tokenizer needs a vocabulary of at least 257, "
                               f"the model has {vocab_size}")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


def load_tokenizer(path: str | None, vocab_size: int):
    if path is None or path == "bytes":
        return ByteTokenizer(vocab_size)
    if not Path(path).is_dir():
        raise SlideDPError(f"tokenizer {path!r}: not a directory (give a local HF tokenizer directory or 'bytes')")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise SlideDPError(f"tokenizer {path!r}: cannot load ({str(exc).splitlines()[0]})") from None
    if len(tok) > vocab_size:
        raise SlideDPError(f"tokenizer {path!r} has {len(tok)} tokens but the model's vocabulary is {vocab_size}")
    return tok


MAX_DATA_BYTES = 8 * 2**30  # text read and tokenized in memory at start


def _documents(path: Path):
    files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl", ".json")) if path.is_dir() else [path]
    if not files:
        raise SlideDPError(f"data {str(path)!r}: no .txt or .jsonl files")
    total = 0
    for f in files:
        if not f.is_file():  # /dev/zero, a FIFO: reads that never end
            raise SlideDPError(f"data {str(f)!r} is not a regular file")
        total += f.stat().st_size
        if total > MAX_DATA_BYTES:
            raise SlideDPError(f"data {str(path)!r} holds more than {MAX_DATA_BYTES / 2**30:.0f} GiB of text; this "
                               f"loader tokenizes in memory: split it or pre-tokenize")
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SlideDPError(f"data {str(f)!r}: cannot read ({type(exc).__name__}: {str(exc)[:80]})") from None
        if f.suffix in (".jsonl", ".json"):
            for n, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SlideDPError(f"data {f.name} line {n}: not JSON ({exc.msg})") from None
                except RecursionError:
                    raise SlideDPError(f"data {f.name} line {n}: JSON nested too deeply") from None
                except ValueError as exc:  # e.g. an integer of more than 4,300 digits
                    raise SlideDPError(f"data {f.name} line {n}: {str(exc)[:80]}") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise SlideDPError(f"data {f.name} line {n}: expected an object with a 'text' string")
                try:  # JSON escapes can spell lone surrogates, which no tokenizer can encode
                    record["text"].encode("utf-8")
                except UnicodeEncodeError:
                    raise SlideDPError(f"data {f.name} line {n}: the text holds a lone surrogate (invalid "
                                       f"Unicode)") from None
                yield record["text"]
        else:
            yield text


@dataclass
class PackedData:
    """Sequences of seq + 1 tokens; ``batch(step)`` returns the step's sequences, deterministically."""

    sequences: torch.Tensor  # [n, seq + 1] int64
    per_step: int
    seed: int

    def __post_init__(self) -> None:
        if self.sequences.shape[0] < self.per_step:
            raise SlideDPError(f"data packs into {self.sequences.shape[0]} sequence(s) of "
                               f"{self.sequences.shape[1] - 1} tokens; one step needs {self.per_step}")

    @property
    def steps_per_epoch(self) -> int:
        return self.sequences.shape[0] // self.per_step

    def batch(self, step: int) -> torch.Tensor:
        epoch, within = divmod(step, self.steps_per_epoch)
        order = torch.randperm(self.sequences.shape[0], generator=torch.Generator().manual_seed(self.seed + epoch))
        idx = order[within * self.per_step:(within + 1) * self.per_step]
        return self.sequences[idx]


def pack(tokens: list[int], seq: int) -> torch.Tensor:
    window = seq + 1
    n = (len(tokens) - 1) // seq
    if n < 1:
        raise SlideDPError(f"data is shorter than one sequence: {len(tokens)} tokens, a sequence needs {window}")
    t = torch.tensor(tokens[: n * seq + 1], dtype=torch.int64)
    return torch.stack([t[i * seq:i * seq + window] for i in range(n)])


def load_data(source: str, tokenizer_path: str | None, vocab_size: int, seq: int, per_step: int,
              seed: int) -> PackedData:
    """``synthetic`` for random tokens (benchmarks), else a file or directory of .txt/.jsonl."""
    if source == "synthetic":
        g = torch.Generator().manual_seed(seed)
        return PackedData(torch.randint(0, vocab_size, (max(per_step * 4, 16), seq + 1), generator=g), per_step, seed)
    path = Path(source)
    if not path.exists():
        raise SlideDPError(f"data {source!r} does not exist")
    tok = load_tokenizer(tokenizer_path, vocab_size)
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    stream: list[int] = []
    for doc in _documents(path):
        stream.extend(tok.encode(doc))
        stream.append(eos)
    return PackedData(pack(stream, seq), per_step, seed)
