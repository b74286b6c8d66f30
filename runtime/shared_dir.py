"""The directory in /dev/shm that holds a data-parallel run's one host state: private, owned and findable.

The state is the model being trained (master weights, Adam moments): another local user must not read it,
plant a file in it, redirect a write through a symlink, or block the run by creating the directory first.
So the directory is created fresh (mkdir fails if anything is already there) with mode 0700, every file in
it with O_CREAT | O_EXCL | O_NOFOLLOW and mode 0600, and a rank that attaches checks owner, type and mode
before mapping anything. Its name carries the user's uid and a random run id that the launcher hands to
the ranks, so no one can predict it, and an ``owner.json`` records the launcher's pid so that
``slidedp clean`` can tell a live run's state from one a killed run left behind.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from slidedp.errors import SlideDPError

SHM_ROOT = Path("/dev/shm")
RUN_ID_ENV = "SLIDEDP_RUN_ID"  # the launcher's random run id, inherited by every rank
LAUNCHER_PID_ENV = "SLIDEDP_LAUNCHER_PID"
NODE_RANK_ENV = "SLIDEDP_NODE_RANK"  # the launcher's --node-rank (several hosts), inherited by its ranks
OWNER_FILE = "owner.json"
PREFIX = "slidedp-"


def new_run_id() -> str:
    return secrets.token_hex(8)


def state_dir(run_id: str, root: Path = SHM_ROOT, node: int | None = None) -> Path:
    """Where a run's shared state lives: per user (uid), per run (the random id) and, over several hosts, per
    node (so emulated hosts on one machine, or hosts that share a /dev/shm namespace, never collide)."""
    return root / f"{PREFIX}{os.getuid()}-{run_id}{'' if node is None else f'-node{node}'}"


def _check_private(path: Path, kind: str, mode: int) -> os.stat_result:
    """``path`` must be this user's own ``kind`` (dir or file, never a symlink) with exactly ``mode``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SlideDPError(f"shared state {str(path)!r} does not exist (the run's rank 0 has not created it)") from None
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "directory" else stat.S_ISREG(st.st_mode)
    if not is_kind or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != mode:
        raise SlideDPError(f"refusing shared state {str(path)!r}: it must be your own {kind} with mode "
                           f"{mode:o} (found uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}, "
                           f"{'symlink' if stat.S_ISLNK(st.st_mode) else 'not a ' + kind if not is_kind else kind})")
    return st


@dataclass(frozen=True)
class SharedDir:
    """A run's private state directory (see the module docstring for what is checked and why)."""

    path: Path

    @classmethod
    def create(cls, path: Path, launcher_pid: int, out: Path) -> SharedDir:
        """Make the directory (it must not exist) and record who owns it."""
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            raise SlideDPError(f"shared state {str(path)!r} already exists: another run, or an attacker's "
                               f"directory; refusing to use it") from None
        os.chmod(path, 0o700)  # the umask may have taken bits away; never added any
        _check_private(path, "directory", 0o700)
        shared = cls(path)
        with shared.create_file(OWNER_FILE, 0) as fh:
            fh.write(json.dumps({"launcher_pid": launcher_pid, "out": str(out)}).encode())
        return shared

    @classmethod
    def attach(cls, path: Path) -> SharedDir:
        _check_private(path, "directory", 0o700)
        return cls(path)

    def create_file(self, name: str, nbytes: int):
        """A new file of ``nbytes`` (sparse until written), exclusive, not through a symlink, mode 0600."""
        fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        if nbytes:
            os.ftruncate(fd, nbytes)
        return os.fdopen(fd, "r+b")

    def check_file(self, name: str, nbytes: int) -> Path:
        """An existing state file a rank is about to map: this user's, 0600, a regular file of ``nbytes``."""
        st = _check_private(self.path / name, "file", 0o600)
        if st.st_size != nbytes:
            raise SlideDPError(f"shared state file {str(self.path / name)!r} holds {st.st_size} bytes, "
                               f"expected {nbytes}")
        return self.path / name

    def remove(self) -> None:
        """Delete the directory, if it is still the private one this run made."""
        try:
            _check_private(self.path, "directory", 0o700)
        except SlideDPError:
            return
        shutil.rmtree(self.path, ignore_errors=True)


@dataclass(frozen=True)
class StaleState:
    path: Path
    launcher_pid: int | None
    out: str
    bytes: int


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_states(root: Path = SHM_ROOT) -> list[StaleState]:
    """This user's SlideDP state directories whose launcher is gone (a killed run left them behind)."""
    found = []
    for path in sorted(root.glob(f"{PREFIX}{os.getuid()}-*")):
        try:
            _check_private(path, "directory", 0o700)
        except SlideDPError:
            continue
        try:
            owner = json.loads((path / OWNER_FILE).read_text())
            pid, out = int(owner["launcher_pid"]), str(owner.get("out", "?"))
        except (OSError, ValueError, KeyError, TypeError):
            pid, out = None, "?"
        if _alive(pid):
            continue
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file() and not f.is_symlink())
        found.append(StaleState(path, pid, out, size))
    return found
