"""Per-operation timings of real steps in the simulator's trace schema.

GPU operations are bracketed by CUDA events on the stream they run on and resolved once per step;
CPU operations (AdamW, cast) use the host clock. Both are expressed relative to a step-start point taken
right after a device synchronisation, so the two clocks line up.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pandas as pd
import torch

from slidedp.runtime.device import Device
from slidedp.trace import make_trace


class TraceRecorder:
    def __init__(self, device: Device, rank: int = 0, enabled: bool = True):
        self.device, self.rank, self.enabled = device, rank, enabled
        self._gpu: list[tuple] = []
        self._host: list[tuple] = []
        self._lock = threading.Lock()
        self._t0 = 0.0
        self._ev0 = None

    def begin_step(self) -> None:
        self._gpu, self._host = [], []
        self.device.synchronize()
        self._t0 = time.perf_counter()
        if self.device.is_cuda:
            self._ev0 = torch.cuda.Event(enable_timing=True)
            self._ev0.record(self.device.compute)

    @contextlib.contextmanager
    def span(self, resource: str, op: str, unit: int, chunk: int = -1, micro_batch: int = -1, nbytes: float = 0.0,
             flops: float = 0.0, host_bytes: float = 0.0, stream=None) -> Iterator[None]:
        """Time the device work issued inside the block on ``stream`` (host time on CPU)."""
        if not self.enabled:
            yield
            return
        name = f"{resource}[{self.rank}]"
        if self.device.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream or self.device.compute)
            yield
            end.record(stream or self.device.compute)
            self._gpu.append((name, op, unit, chunk, micro_batch, start, end, nbytes, flops, host_bytes))
        else:
            t = time.perf_counter()
            yield
            self._host.append((name, op, unit, chunk, micro_batch, t, time.perf_counter(), nbytes, flops, host_bytes))

    @contextlib.contextmanager
    def host_span(self, resource: str, op: str, unit: int, chunk: int = -1, nbytes: float = 0.0,
                  host_bytes: float = 0.0) -> Iterator[None]:
        """Time CPU work (thread-safe: the optimizer worker calls this)."""
        t = time.perf_counter()
        yield
        if self.enabled:
            row = (f"{resource}[{self.rank}]", op, unit, chunk, -1, t, time.perf_counter(), nbytes, 0.0, host_bytes)
            with self._lock:
                self._host.append(row)

    def end_step(self) -> pd.DataFrame:
        self.device.synchronize()
        rows = []
        for name, op, unit, chunk, mb, start, end, nbytes, flops, host_bytes in self._gpu:
            s = self._ev_seconds(start)
            rows.append((self.rank, name, op, unit, chunk, mb, s, s + start.elapsed_time(end) / 1e3, nbytes, flops,
                         host_bytes))
        with self._lock:
            for name, op, unit, chunk, mb, s, e, nbytes, flops, host_bytes in self._host:
                rows.append((self.rank, name, op, unit, chunk, mb, s - self._t0, e - self._t0, nbytes, flops,
                             host_bytes))
        rows.sort(key=lambda r: r[6])
        return make_trace(rows)

    def _ev_seconds(self, ev) -> float:
        if self._ev0 is None:
            return 0.0
        return self._ev0.elapsed_time(ev) / 1e3
