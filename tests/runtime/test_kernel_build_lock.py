"""The CPU AdamW kernel's build can never hang a run: torch's stale lock file is cleared, a live build is
waited for a bounded time, then the run falls back."""

from __future__ import annotations

import fcntl
import os

import pytest

from slidedp.runtime import cpu_adam


def test_a_stale_torch_build_lock_is_cleared(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale = cpu_adam.build_directory() / "lock"
    stale.write_text("")  # what a builder killed mid-compile leaves: torch would wait on it forever
    built = cpu_adam.locked_build(lambda directory: ("built", directory), wait_s=1.0)
    assert built == ("built", str(cpu_adam.build_directory())) and not stale.exists()


def test_a_build_held_by_another_process_is_waited_for_a_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    holder = os.open(cpu_adam.build_directory() / "slidedp-build.lock", os.O_RDWR | os.O_CREAT, 0o600)
    pid = os.fork()
    if pid == 0:  # a child holds the lock like a concurrent build would
        fcntl.flock(holder, fcntl.LOCK_EX)
        os.write(holder, b"x")
        import time

        time.sleep(5)
        os._exit(0)
    try:
        import time

        time.sleep(0.3)
        with pytest.raises(TimeoutError, match="another process has been building"):
            cpu_adam.locked_build(lambda directory: "never", wait_s=0.5)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(holder)
    assert cpu_adam.locked_build(lambda directory: "built", wait_s=1.0) == "built"  # the holder died: lock freed
