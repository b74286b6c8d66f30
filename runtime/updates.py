"""The CPU optimizer worker: applies AdamW chunk by chunk, on a background thread when a GPU is busy.

Jobs run strictly in submission order (the order the schedule needs them). A job may carry a CUDA
event: the worker blocks on it before touching the host buffer the device copy wrote, which is the
guard against reading a gradient before its D2H finished.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

from slidedp.runtime.device import Device


class UpdateWorker:
    def __init__(self, run_job: Callable[[tuple, tuple], None], threaded: bool, threads: int | None):
        self._run_job = run_job
        self._threaded = threaded
        self._done: dict[tuple, threading.Event] = {}
        self._error: BaseException | None = None
        self._threads = threads
        if threaded:
            self._queue: queue.Queue = queue.Queue()
            self._thread = threading.Thread(target=self._loop, name="slidedp-adam", daemon=True)
            self._thread.start()

    def submit(self, key: tuple, args: tuple, event=None) -> None:
        """Queue job ``key`` (e.g. (unit, chunk)) with ``args``; inline workers run it now."""
        done = threading.Event()
        self._done[key] = done
        if self._threaded:
            self._queue.put((key, args, event, done))
        else:
            Device.host_wait(event)
            self._run_job(key, args)
            done.set()

    def wait(self, key: tuple) -> None:
        done = self._done.get(key)
        if done is None:
            return
        while not done.wait(timeout=0.5):
            self._raise_if_failed()
        self._raise_if_failed()
        del self._done[key]

    def wait_all(self) -> None:
        for key in list(self._done):
            self.wait(key)

    def close(self) -> None:
        if self._threaded:
            self._queue.put(None)
            self._thread.join(timeout=60)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"CPU optimizer worker failed: {self._error}") from self._error

    def _loop(self) -> None:
        if self._threads:
            torch.set_num_threads(self._threads)
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, args, event, done = item
            try:
                Device.host_wait(event)
                self._run_job(key, args)
            except BaseException as exc:  # surfaced to the trainer thread by wait()
                self._error = exc
            finally:
                done.set()
