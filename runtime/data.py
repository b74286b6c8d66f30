"""Training and eval data: files -> records (``datasets``) -> examples (format, mask) -> rows, cached.

``load_data`` is the one entry point. Its result is keyed by everything that shapes the rows (the data
files' identity, the tokenizer's files, format, field names, masking, ``seq``, packing, the long-example
rule, the eval split and the seed) and stored in ``cache_dir`` as safetensors, so a resumed run (or a
second run on the same data) skips tokenization. Batches are drawn in a seeded permutation per epoch and
addressed by step number, which is all a resumed run needs to continue where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from slidedp.errors import SlideDPError
from slidedp.runtime.data_sources import DataSource
from slidedp.runtime.formats import FORMATS, FieldMap, Formatter, detect_format
from slidedp.runtime.packing import TOO_LONG, PackStats, Rows, pack_examples, pack_stream
from slidedp.runtime.text_tokenizers import BYTE_EOS, BYTE_TOKENIZER, ByteTokenizer, check_tokenizer_dir, load_tokenizer

__all__ = ["BYTE_EOS", "ByteTokenizer", "DataSpec", "LoadedData", "PackStats", "PackedData", "Rows", "load_data",
           "load_tokenizer"]

CACHE_VERSION = 1  # bump when the row layout changes
SYNTHETIC_DATA = "synthetic"  # --data synthetic: random tokens (benchmarks), read before any file of that name


@dataclass(frozen=True)
class DataSpec:
    """What the data is and how it becomes rows; every field is part of the cache key."""

    source: str
    tokenizer: str | None = None
    format: str = "auto"
    fields: str | dict | None = None
    train_on_prompt: bool = False
    packing: bool = True
    too_long: str = "truncate"
    eval_source: str | None = None
    eval_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise SlideDPError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.too_long not in TOO_LONG:
            raise SlideDPError(f"--too-long must be truncate or drop, got {self.too_long!r}")
        if not (isinstance(self.eval_fraction, (int, float)) and 0 <= self.eval_fraction < 1):
            raise SlideDPError(f"--eval-fraction must be in [0, 1), got {self.eval_fraction!r}")
        if self.eval_source and self.eval_fraction:
            raise SlideDPError("give --eval-data or --eval-fraction, not both")
        if self.source == SYNTHETIC_DATA:
            given = [flag for flag, on in (("--eval-data", self.eval_source), ("--eval-fraction", self.eval_fraction),
                                           ("--format", self.format != "auto"), ("--fields", self.fields),
                                           ("--train-on-prompt", self.train_on_prompt)) if on]
            if given:
                raise SlideDPError(f"--data synthetic is random tokens with no examples to read or hold out: "
                                   f"{', '.join(given)} cannot apply")
            if self.tokenizer not in (None, BYTE_TOKENIZER):  # read by --export-hf only: checked now, not then
                check_tokenizer_dir(self.tokenizer)
        FieldMap.parse(self.fields)


@dataclass
class PackedData:
    """Rows; ``batch(step)`` returns the step's ``per_step`` rows, deterministically."""

    rows: Rows
    per_step: int
    seed: int

    def __post_init__(self) -> None:
        if len(self.rows) < self.per_step:
            raise SlideDPError(f"data packs into {len(self.rows)} sequence(s) of {self.rows.seq} tokens; one step "
                               f"needs {self.per_step}")

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.per_step

    def batch(self, step: int) -> Rows:
        epoch, within = divmod(step, self.steps_per_epoch)
        order = torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(self.seed + epoch))
        return self.rows.select(order[within * self.per_step:(within + 1) * self.per_step])


@dataclass
class LoadedData:
    train: PackedData
    eval: Rows | None
    format: str
    notes: list[str]  # what happened to the data, for the log
    cache_file: Path | None = None
    cached: bool = False


def rows_digest(rows: Rows, seed: int) -> str:
    """What a run trains on, by content: its rows' tokens, labels, positions and segments, and the seed that
    orders them. A checkpoint keeps it, so a resume can say when the data changed; unlike the cache key it
    does not change when a file is touched, copied or moved, or when a path is spelled another way."""
    h = hashlib.blake2b(str(seed).encode(), digest_size=12)
    for t in (rows.input_ids, rows.labels, rows.position_ids, rows.segments):
        if t is not None:
            h.update(t.contiguous().numpy())
    return h.hexdigest()


def load_data(spec: DataSpec, vocab_size: int, seq: int, per_step: int, seed: int,
              cache_dir: Path | None = None, log: Callable[[str], None] | None = None) -> LoadedData:
    """``synthetic`` for random tokens (benchmarks); else files through the format pipeline, cached."""
    if spec.source == SYNTHETIC_DATA:
        g = torch.Generator().manual_seed(seed)
        windows = torch.randint(0, vocab_size, (max(per_step * 4, 16), seq + 1), generator=g)
        return LoadedData(PackedData(Rows.from_windows(windows), per_step, seed), None, SYNTHETIC_DATA, [])
    source = DataSource.resolve(spec.source)
    eval_source = DataSource.resolve(spec.eval_source, "--eval-data") if spec.eval_source else None
    tok = load_tokenizer(spec.tokenizer, vocab_size)
    key = _cache_key(spec, source, eval_source, tok, seq, seed)
    cache_file = cache_dir / f"tokens-{key}.safetensors" if cache_dir is not None else None
    if cache_file is not None and cache_file.is_file():
        loaded = _read_cache(cache_file, per_step, seed)
        if loaded is not None:
            return loaded
    fields = FieldMap.parse(spec.fields)
    fmt, train, notes = _rows(source, spec, fields, tok, seq, seed)
    evaluation = None
    if eval_source is not None:
        _, evaluation, eval_notes = _rows(eval_source, spec, fields, tok, seq, seed, fmt)
        notes += [f"eval: {n}" for n in eval_notes]
    elif spec.eval_fraction:
        train, evaluation = _split(train, spec.eval_fraction, seed)
        notes.append(f"eval: {len(evaluation)} of {len(train) + len(evaluation)} rows held out "
                     f"(--eval-fraction {spec.eval_fraction:g})")
    result = LoadedData(PackedData(train, per_step, seed), evaluation, fmt, notes, cache_file)
    if cache_file is not None:
        _write_cache(cache_file, result)
    return result


def _rows(source: DataSource, spec: DataSpec, fields: FieldMap, tok, seq: int, seed: int,
          fmt: str | None = None) -> tuple[str, Rows, list[str]]:
    records = source.records()
    first = next(records, None)
    if first is None:
        raise SlideDPError(f"data {str(source.path)!r} holds no records")
    fmt = fmt or (spec.format if spec.format != "auto" else detect_format(first[1], fields))

    def all_records():
        yield first
        yield from records

    examples = Formatter(fmt, fields, tok, spec.train_on_prompt).examples(all_records())
    if fmt == "text":
        rows, stats = pack_stream(examples, seq)
    else:
        examples = list(examples)
        order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
        rows, stats = pack_examples((examples[i] for i in order), seq, tok.pad_token_id, spec.packing,
                                    spec.too_long)
    return fmt, rows, [f"{source.path.name}: format {fmt}; {stats.describe(spec.too_long)}"]


def _split(rows: Rows, fraction: float, seed: int) -> tuple[Rows, Rows]:
    """Hold out whole rows (a packed row's examples stay together), chosen by a seeded permutation."""
    n_eval = max(1, math.ceil(len(rows) * fraction))
    if n_eval >= len(rows):
        raise SlideDPError(f"--eval-fraction {fraction:g} of {len(rows)} rows leaves nothing to train on")
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed + 7919))
    return rows.select(order[n_eval:].sort().values), rows.select(order[:n_eval].sort().values)


def _cache_key(spec: DataSpec, source: DataSource, eval_source: DataSource | None, tok, seq: int, seed: int) -> str:
    ident = {"version": CACHE_VERSION, "spec": {k: v for k, v in asdict(spec).items() if k not in ("source",
                                                                                                     "eval_source")},
             "data": source.fingerprint(), "eval": eval_source.fingerprint() if eval_source else None,
             "tokenizer": tok.fingerprint(), "seq": seq, "seed": seed}
    return hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=12).hexdigest()


def _write_cache(path: Path, data: LoadedData) -> None:
    from safetensors.torch import save_file

    tensors = data.train.rows.tensors("train.")
    if data.eval is not None:
        tensors.update(data.eval.tensors("eval."))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")  # two hosts' launchers may write one shared cache at once
    save_file(tensors, str(tmp), metadata={"format": data.format, "notes": json.dumps(data.notes)})
    tmp.replace(path)


def _read_cache(path: Path, per_step: int, seed: int) -> LoadedData | None:
    """The cached rows, or None when the file is unreadable (then it is rebuilt and overwritten)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__
        notes = json.loads(meta["notes"])
        train = Rows.from_tensors(tensors, "train.")
        evaluation = Rows.from_tensors(tensors, "eval.") if "eval.input_ids" in tensors else None
    except Exception:  # a torn or foreign file: tokenize again
        return None
    return LoadedData(PackedData(train, per_step, seed), evaluation, meta.get("format", "?"), notes, path, cached=True)

