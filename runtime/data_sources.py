"""Records from local data files, read by Hugging Face ``datasets``: jsonl/json, parquet, csv, arrow, txt,
or a directory written by ``Dataset.save_to_disk``.

Files are read in ``datasets``' streaming mode: tokenization makes one pass over the records, so a
streamed read keeps memory flat for files larger than memory and writes no Arrow copy of the data into
a cache. Everything that can be wrong with the files themselves (missing, not regular, empty, not UTF-8,
unparsable) is one :class:`SlideDPError` naming the file.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from slidedp.errors import SlideDPError

# File suffix -> the `datasets` packaged builder that reads it.
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow",
            ".txt": "text"}
TEXT_BUILDERS = ("json", "csv", "text")  # read as UTF-8 text: checked byte by byte before parsing
SAVED_DATASET_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
UTF8_CHECK_BLOCK = 1 << 20


@dataclass(frozen=True)
class DataSource:
    """One data argument resolved to files grouped by builder, or a ``save_to_disk`` directory."""

    path: Path
    files: dict[str, tuple[Path, ...]]  # builder -> files
    saved: bool = False  # a Dataset.save_to_disk directory

    @classmethod
    def resolve(cls, source: str, flag: str = "--data") -> DataSource:
        path = Path(source)
        if not path.exists():
            raise SlideDPError(f"{flag} {source!r} does not exist")
        if path.is_dir() and any((path / m).exists() for m in SAVED_DATASET_MARKERS):
            return cls(path, {}, saved=True)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in BUILDERS)
            if not found:
                raise SlideDPError(f"data {source!r}: no {', '.join(BUILDERS)} files")
        else:
            if path.suffix not in BUILDERS:
                raise SlideDPError(f"data {source!r}: unknown file type {path.suffix or '(none)'!r} "
                                   f"(expected one of {', '.join(BUILDERS)})")
            found = [path]
        groups: dict[str, list[Path]] = {}
        for f in found:
            if not f.is_file():  # /dev/zero, a FIFO: reads that never end
                raise SlideDPError(f"data {str(f)!r} is not a regular file")
            if f.stat().st_size == 0:
                raise SlideDPError(f"data {str(f)!r} is empty")
            groups.setdefault(BUILDERS[f.suffix], []).append(f)
        return cls(path, {b: tuple(fs) for b, fs in groups.items()})

    def fingerprint(self) -> str:
        """Identity of the data for the tokenization cache: every file's path, size and modification time
        (what ``datasets`` itself keys its caches on; reading gigabytes to hash them would cost a pass)."""
        files = sorted(p for p in self.path.rglob("*") if p.is_file()) if self.saved else \
            [f for fs in self.files.values() for f in fs]
        h = hashlib.blake2b(digest_size=16)
        for f in files:
            st = f.stat()
            h.update(json.dumps([str(f.resolve()), st.st_size, st.st_mtime_ns]).encode())
        return h.hexdigest()

    def check_utf8(self) -> None:
        """Non-UTF-8 bytes in a text file: one line with the file and byte offset, before any parser sees it."""
        for builder in TEXT_BUILDERS:
            for f in self.files.get(builder, ()):
                decoder = codecs.getincrementaldecoder("utf-8")()
                offset = 0
                with open(f, "rb") as fh:
                    while block := fh.read(UTF8_CHECK_BLOCK):
                        try:
                            decoder.decode(block)
                        except UnicodeDecodeError as exc:
                            raise SlideDPError(f"data {str(f)!r}: not UTF-8 (byte offset "
                                               f"{offset + max(0, exc.start)})") from None
                        offset += len(block)
                    try:
                        decoder.decode(b"", final=True)
                    except UnicodeDecodeError:
                        raise SlideDPError(f"data {str(f)!r}: not UTF-8 (truncated character at the end)") from None

    def records(self) -> Iterator[tuple[str, dict]]:
        """(file label, record) pairs in a fixed order; parse errors become one line naming the file."""
        import datasets

        # datasets logs a parse failure at ERROR level before raising it; the raise becomes our one line, so its
        # own log line would be a second (and, under a replaced stderr, a "--- Logging error ---" traceback).
        level = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        try:
            yield from self._records(datasets)
        finally:
            datasets.logging.set_verbosity(level)

    def _records(self, datasets) -> Iterator[tuple[str, dict]]:
        if self.saved:
            yield from self._saved_records()
            return
        self.check_utf8()
        for builder, files in self.files.items():
            label = files[0].name if len(files) == 1 else f"{self.path.name} ({builder} files)"
            kwargs = {"sample_by": "document"} if builder == "text" else {}  # a .txt file is one document
            try:
                ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train",
                                           streaming=True, **kwargs)
                yield from ((label, r) for r in ds)
            except SlideDPError:
                raise
            except Exception as exc:  # datasets and pyarrow raise many types for one malformed file
                raise SlideDPError(f"data {label}: cannot parse as {builder} ({_first_line(exc)})") from None

    def _saved_records(self) -> Iterator[tuple[str, dict]]:
        import datasets

        try:
            ds = datasets.load_from_disk(str(self.path))
        except Exception as exc:
            raise SlideDPError(f"data {str(self.path)!r}: cannot load the saved dataset ({_first_line(exc)})") from None
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise SlideDPError(f"data {str(self.path)!r}: a DatasetDict without a 'train' split "
                                   f"(splits: {', '.join(ds)})")
            ds = ds["train"]
        yield from ((self.path.name, r) for r in ds)


def _first_line(exc: BaseException) -> str:
    """The innermost cause's first line, cut short: what a user can act on."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {text[:160]}"
