"""A checkpoint directory on disk: written so that a crash, a kill or a full disk never costs the last good one,
and checked on resume before anything is allocated.

Layout: ``state.safetensors`` (master, exp_avg, exp_avg_sq in the run's state precision, plus the per-block
scales of 8-bit moments) and ``meta.json`` (``state``, the precision's name, absent meaning fp32; data and
optimizer step, the model spec, policy, world size, seq, batch, and a BLAKE2b digest of the state file). A save writes
``<name>.tmp-<pid>``, fsyncs it, moves the old checkpoint aside to ``<name>.old-<pid>``, renames the new one
into place, fsyncs the parent and deletes the old one; :func:`recover` finishes or undoes whatever a killed
save left. :func:`verify` checks a checkpoint without loading it into memory: meta.json readable, the digest,
the safetensors header naming the three tensors at the model's size.

A run over several hosts writes one checkpoint per host share, ``<checkpoint>/host<h>-of-<H>/`` (each the
layout above, written by that host; under the ``sharded`` host layout its tensors hold that host's share
only), and resumes with the same number of hosts (:func:`share_dir` refuses another in one line).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

from slidedp.errors import SlideDPError
from slidedp.state_precision import EXACT, StatePrecision

STATE_FILE = "state.safetensors"
META_FILE = "meta.json"
TENSORS = ("master", "exp_avg", "exp_avg_sq")
SCALES = ("exp_avg_scale", "exp_avg_sq_scale")  # 8-bit moments only


def tensor_names(precision: StatePrecision) -> tuple[str, ...]:
    """The tensors a checkpoint of this state precision holds."""
    return TENSORS + SCALES if precision.moments == "int8" else TENSORS
_PIECE = 64 * 2**20
MAX_STEP = 10**15  # the steps become int64 tensors and schedule arithmetic: a 30-digit step is corruption


def digest(path: Path) -> str:
    """BLAKE2b of a file read in 64 MiB pieces (streamed: a 100 GB state never sits in memory twice)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while piece := fh.read(_PIECE):
            h.update(piece)
    return h.hexdigest()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_leftovers(directory: Path) -> list[Path]:
    """What an interrupted save of ``directory`` left beside it: its temporary copies, then its moved-aside old
    checkpoints, oldest first (see the module docstring)."""
    return [*directory.parent.glob(directory.name + ".tmp-*"),
            *sorted(directory.parent.glob(directory.name + ".old-*"))]


def recover(directory: Path) -> list[str]:
    """Finish or undo an interrupted save of ``directory``: a moved-aside old checkpoint with no new one beside
    it is put back; temporary and moved-aside leftovers are deleted. Returns what was done, one line each."""
    done = []
    leftovers = save_leftovers(directory)
    olds = [p for p in leftovers if p.name.startswith(directory.name + ".old-")]
    if not directory.exists() and olds:
        olds[-1].rename(directory)
        done.append(f"restored {directory.name} from {olds[-1].name} (a save was killed between its renames)")
        leftovers.remove(olds[-1])
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)
        done.append(f"removed {leftover.name}, left by an interrupted save")
    return done


def write(directory: Path, tensors: dict, meta: dict, before_meta=None) -> None:
    """Write a checkpoint atomically (see the module docstring); ``before_meta(tmp)`` runs between the state
    file and meta.json, with the temporary directory (fault injection). A full disk is one line and leaves
    the previous checkpoint in place."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    directory = Path(directory)
    recover(directory)
    tmp = directory.with_name(directory.name + f".tmp-{os.getpid()}")
    try:
        tmp.mkdir(parents=True)
        os.chmod(tmp, 0o700)  # the host state, and the meta beside it, readable by the owner only
        save_file(tensors, str(tmp / STATE_FILE))
        os.chmod(tmp / STATE_FILE, 0o600)  # not left to the writer's umask
        fsync_path(tmp / STATE_FILE)
        if before_meta is not None:
            before_meta(tmp)
        (tmp / META_FILE).write_text(json.dumps({**meta, "state_blake2b": digest(tmp / STATE_FILE)}, indent=2))
        fsync_path(tmp / META_FILE)
        fsync_path(tmp)
    except (OSError, SafetensorError) as exc:  # safetensors reports its own write errors as SafetensorError
        shutil.rmtree(tmp, ignore_errors=True)
        full = getattr(exc, "errno", None) == errno.ENOSPC or f"(os error {errno.ENOSPC})" in str(exc)
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        reason = "the disk is full" if full else (getattr(exc, "strerror", None) or first)
        raise SlideDPError(f"cannot write checkpoint {str(directory)!r}: {reason}; the previous checkpoint is "
                           f"kept") from None
    old = directory.with_name(directory.name + f".old-{os.getpid()}")
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    fsync_path(directory.parent)
    if old.exists():
        shutil.rmtree(old)


def share_dir(directory: Path, host: int, hosts: int) -> Path:
    """The checkpoint directory of host ``host``'s share (the directory itself on one host)."""
    directory = Path(directory)
    return directory if hosts == 1 else directory / f"host{host}-of-{hosts}"


def written_by_hosts(directory: Path) -> int | None:
    """How many hosts wrote the checkpoint in ``directory`` (1: a one-host checkpoint), or None when it is
    neither kind."""
    directory = Path(directory)
    if (directory / META_FILE).is_file():
        return 1
    counts = {p.name.rsplit("-of-", 1)[-1] for p in directory.glob("host*-of-*") if p.is_dir()}
    counts = {int(c) for c in counts if c.isdigit()}
    return counts.pop() if len(counts) == 1 else None


def check_hosts(directory: Path, hosts: int) -> None:
    """Refuse, in one line, to resume a checkpoint written by another number of hosts."""
    found = written_by_hosts(directory)
    if found is not None and found != hosts:
        raise SlideDPError(f"checkpoint {str(directory)!r} was written by {found} host(s), this run has {hosts}: "
                           f"resume with --nnodes {found} (resharding to another host count is not supported)")


def any_meta(directory: Path) -> Path:
    """meta.json of a checkpoint: its own, or (several hosts) the first share's."""
    directory = Path(directory)
    shares = sorted(directory.glob(f"host*-of-*/{META_FILE}"))
    return shares[0] if not (directory / META_FILE).is_file() and shares else directory / META_FILE


def read_meta(path: Path, where: str) -> dict:
    """A checkpoint's meta.json (``path``) as a dict, or one SlideDPError line naming ``where`` when it cannot
    be read, is not JSON or is not an object: what every reader of a checkpoint's meta.json goes through."""
    try:
        meta = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SlideDPError(f"{where}: unreadable {META_FILE} ({type(exc).__name__})") from None
    if not isinstance(meta, dict):
        raise SlideDPError(f"{where}: unreadable {META_FILE} (not a JSON object)")
    return meta


def verify(directory: Path, numel: int, precision: StatePrecision = EXACT) -> dict:
    """meta.json of a checkpoint whose state file is intact and holds ``numel`` parameters per tensor in the
    state precision ``precision`` (another precision is refused in one line: the state is not converted)."""
    from safetensors import SafetensorError, safe_open

    directory = Path(directory)
    where = f"checkpoint {str(directory)!r}"
    if not (directory / STATE_FILE).is_file() or not (directory / META_FILE).is_file():
        raise SlideDPError(f"{where} is not a SlideDP checkpoint (missing {STATE_FILE} or {META_FILE})")
    meta = read_meta(directory / META_FILE, where)
    try:
        step, data_step = int(meta["optimizer_step"]), int(meta["data_step"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SlideDPError(f"{where}: unreadable {META_FILE} ({type(exc).__name__})") from None
    if not (0 <= step <= MAX_STEP and 0 <= data_step <= MAX_STEP):
        raise SlideDPError(f"{where}: a step in {META_FILE} is negative or beyond {MAX_STEP:.0e}")
    saved = meta.get("state", EXACT.name)
    if saved != precision.name:
        raise SlideDPError(f"{where} holds {saved} host state and this run asks for {precision.name}: resume with "
                           f"--state {saved} (a checkpoint is not converted between state precisions)")
    expected = meta.get("state_blake2b")
    if expected is not None and digest(directory / STATE_FILE) != expected:
        raise SlideDPError(f"{where}: {STATE_FILE} does not match the digest written with it (corrupted or "
                           f"truncated); refusing to resume from it")
    try:
        with safe_open(str(directory / STATE_FILE), framework="pt") as fh:
            shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise SlideDPError(f"{where}: {STATE_FILE} is not a readable safetensors file "
                           f"({str(exc).splitlines()[0][:80]})") from None
    if set(shapes) != set(tensor_names(precision)):
        raise SlideDPError(f"{where} holds the tensors {', '.join(sorted(shapes))}; a {precision.name} state has "
                           f"{', '.join(sorted(tensor_names(precision)))}")
    held = {shapes[t] for t in TENSORS}
    if held != {(numel,)}:
        sizes = ", ".join(f"{s[0]:,}" if len(s) == 1 else str(s) for s in sorted(held))
        raise SlideDPError(f"{where} holds {sizes} parameters per tensor, this model has {numel:,}: it is another "
                           f"model's checkpoint")
    return meta
