"""Where a command will write: checked before any work, so a typo in ``--out`` costs one line and exit 2, not a
traceback after minutes of benchmarking or training.

The check creates and removes a probe file in the nearest directory that exists. Permission bits alone do not
say whether a path is writable: root passes ``os.access`` on /proc, a read-only mount or a full quota.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from slidedp.errors import SlideDPError


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _probe_writable(directory: Path, flag: str, target: Path) -> None:
    if not directory.is_dir():
        raise SlideDPError(f"{flag} {str(target)!r}: {str(directory)!r} is not a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=".slidedp-probe-", dir=directory)
    except OSError as exc:
        raise SlideDPError(f"{flag} {str(target)!r}: cannot write in {str(directory)!r} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(name)


def check_output_dir(path: str | Path, flag: str) -> Path:
    """A directory a command will create or write into: not an existing file, and writable where it will be
    created (its nearest existing ancestor). Creates nothing."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise SlideDPError(f"{flag} {str(path)!r} exists and is not a directory")
        _probe_writable(_nearest_existing(path), flag, path)
    except OSError as exc:  # a parent that cannot be searched makes even exists() fail
        raise SlideDPError(f"{flag} {str(path)!r}: {exc.strerror}") from None
    return path


def check_output_file(path: str | Path, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file a command will write (replacing any earlier one): not a directory, with one of ``suffixes`` when
    given, in a directory that exists or can be created and is writable, and writable itself if it exists.
    Creates nothing."""
    path = Path(path)
    if suffixes and path.suffix not in suffixes:
        raise SlideDPError(f"{flag} {str(path)!r}: use a {' or '.join(suffixes)} suffix")
    try:
        if path.is_dir():
            raise SlideDPError(f"{flag} {str(path)!r} is a directory, not a file")
        _probe_writable(_nearest_existing(path.parent), flag, path)
        if path.exists():
            with open(path, "ab"):  # opening to append changes nothing; a read-only file fails here
                pass
    except OSError as exc:
        raise SlideDPError(f"{flag} {str(path)!r}: {exc.strerror}") from None
    return path
