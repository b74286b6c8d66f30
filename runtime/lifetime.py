"""A run's lifetime on this host: one live run per run directory, and ranks that never outlive their launcher.

Two runs writing one run directory interleave their metrics and (data-parallel) used to delete each other's
shared state; an exclusive lock in the run directory makes the second one refuse at once. A rank whose
parent (torchrun) dies would otherwise train on as an orphan, holding GPU memory and /dev/shm; Linux's
parent-death signal ends it with its parent.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
from pathlib import Path

from slidedp.errors import SlideDPError

LOCK_FILE = ".slidedp.lock"
_PR_SET_PDEATHSIG = 1


class RunLock:
    """An exclusive lock on a run directory, held until :meth:`release` or the process ends (the kernel
    drops it with the process, so a killed run never leaves the directory locked)."""

    def __init__(self, out: Path, node: int | None = None):
        """``node``: over several hosts, each node locks the run directory for itself (hosts that share a
        filesystem write their own checkpoint shares into one run directory)."""
        out.mkdir(parents=True, exist_ok=True)
        path = out / (LOCK_FILE if node is None else f"{LOCK_FILE}-node{node}")
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            raise _in_use(out, holder) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    @staticmethod
    def refuse_if_held(out: Path) -> None:
        """Refuse at once if a live run holds ``out`` (any node's lock), without taking the lock: a run checks
        this before it judges what the directory holds, since a live run's files are not an earlier run's."""
        for path in out.glob(LOCK_FILE + "*"):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _in_use(out, os.pread(fd, 32, 0).decode(errors="replace").strip() or "?") from None
            finally:
                os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _in_use(out: Path, holder: str) -> SlideDPError:
    return SlideDPError(f"run directory {str(out)!r} is in use by another slidedp run (pid {holder}); use another "
                        f"--out or wait for it")


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


# Looked up once at import: die_with_parent often runs as a preexec_fn, in a forked child before exec, which
# should do as little as possible.
_LIBC = _libc()


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux; a no-op elsewhere)."""
    try:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except AttributeError:  # no libc, or no prctl in it
        return
    if os.getppid() == 1:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)
