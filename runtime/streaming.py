"""Weights and activation checkpoints crossing PCIe: a unit in, chunk by chunk; a checkpoint out and back.

A unit's life on the device (the analogue of an FSDP parameter group's unshard / wait / reshard):
  fetch    - allocate its flat weights and issue one H2D per chunk on the H2D stream, each after the chunk's
             pending CPU update (and, with data parallel ranks, every owner's); on the sharded route each
             rank copies only its shard and the ranks all-gather the chunk. ``DeviceUnit.ready`` is the
             event compute waits on before using it.
  release  - free the weights once the prefetch window moves on; a unit whose graphs were kept
             (activation ``keep``) keeps its tensors and gives back only their memory, so a later fetch can
             re-materialise it in place.
With ``keep_all`` (``EngineConfig.resident_weights``) a unit is fetched once and then stays.

Activation checkpoints of streamed layers (activation ``offload``) go to reusable host buffers on the D2H
stream and come back on the H2D stream for backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from slidedp.routes import Routes
from slidedp.runtime.chunks import ChunkTable
from slidedp.runtime.comm import Comm
from slidedp.runtime.device import Device
from slidedp.runtime.hf_adapter import UnitLayout
from slidedp.runtime.host_state import HostState
from slidedp.runtime.tracing import TraceRecorder


class DeviceUnit:
    """A unit's weights on the device: one flat tensor and per-parameter views of it."""

    def __init__(self, layout: UnitLayout, flat: torch.Tensor, persistent: bool = False):
        self.layout, self.flat = layout, flat
        self.persistent = persistent  # GPU-state or resident weights: never released
        self.ready = None  # event: all chunks arrived
        self.leaves: dict[str, torch.Tensor] | None = None  # kept-graph leaves (activation policy keep)

    def params(self, requires_grad: bool) -> dict[str, torch.Tensor]:
        if requires_grad and self.leaves is not None:
            return self.leaves
        views = {p.name: self.flat[p.offset:p.offset + p.numel].view(p.shape) for p in self.layout.params}
        if requires_grad:
            views = {n: v.detach().requires_grad_() for n, v in views.items()}
        return views


class ParamStreamer:
    """Fetches units from the host slot into device memory and releases them again.

    ``before_chunk(u, c)`` blocks until chunk ``c`` of unit ``u`` may be read from the slot (its update is
    done); ``keep_all`` keeps every unit after its first fetch (the resident-weights reference).
    """

    def __init__(self, table: ChunkTable, routes: Routes, host: HostState, device: Device, recorder: TraceRecorder,
                 comm: Comm, dtype: torch.dtype, before_chunk: Callable[[int, int], None], keep_all: bool = False):
        self.table, self.routes, self.host, self.device = table, routes, host, device
        self.recorder, self.comm, self.dtype, self.before_chunk = recorder, comm, dtype, before_chunk
        self.keep_all = keep_all
        self._kept: dict[int, DeviceUnit] = {}

    def fetch(self, u: int, into: DeviceUnit | None = None) -> DeviceUnit:
        """Unit ``u`` on the device (``into``: a released kept-graph unit to re-materialise in place)."""
        if not self.keep_all:
            return self._copy_in(u, into)
        du = self._kept.get(u)
        if du is None:
            du = self._copy_in(u, None)
            du.persistent = True
            self.device.synchronize()  # in place from now on: no event to wait for
            du.ready = None
            self._kept[u] = du
        return du

    def _copy_in(self, u: int, into: DeviceUnit | None) -> DeviceUnit:
        dev, unit = self.device, self.table.units[u]
        if into is None:
            into = DeviceUnit(unit, torch.empty(unit.numel, dtype=self.dtype, device=dev.torch_device))
        else:  # re-materialise a released kept-graph unit in the same storage
            into.flat.untyped_storage().resize_(unit.numel * into.flat.element_size())
        allocated = dev.event()  # the block may be reused memory: copy only once compute reached this point
        dev.wait(dev.h2d, allocated)
        esize = into.flat.element_size()
        slot = self.host.slot
        for c, (a, b) in enumerate(self.table.chunks(u)):
            self.before_chunk(u, c)
            with dev.on(dev.h2d), torch.autograd._unsafe_preserve_version_counter(into.flat), torch.no_grad():
                if not self.routes.shards_params:
                    src = slot[unit.offset + a:unit.offset + b]
                    with self.recorder.span("h2d", "h2d_param", u, c, nbytes=(b - a) * esize,
                                            host_bytes=(b - a) * esize, stream=dev.h2d):
                        into.flat[a:b].copy_(src, non_blocking=True)
                    continue
                bounds = self.routes.shard_bounds(a, b)
                sa, sb = bounds[self.comm.rank], bounds[self.comm.rank + 1]
                mine = torch.empty(sb - sa, dtype=into.flat.dtype, device=dev.torch_device)
                with self.recorder.span("h2d", "h2d_param", u, c, nbytes=(sb - sa) * esize,
                                        host_bytes=(sb - sa) * esize, stream=dev.h2d):
                    mine.copy_(slot[unit.offset + sa:unit.offset + sb], non_blocking=True)
                with self.recorder.span("link", "allgather", u, c, nbytes=(b - a - (sb - sa)) * esize,
                                        stream=dev.h2d):
                    self.comm.all_gather_into(into.flat[a:b], mine, bounds)
        into.ready = dev.event(dev.h2d)
        return into

    @staticmethod
    def release(du: DeviceUnit) -> None:
        if du.persistent:  # GPU-state or resident weights stay; only this step's kept-graph leaves go
            du.leaves = None
            return
        if du.leaves is not None:  # kept graphs reference these views: free the memory, keep the tensors
            du.flat.untyped_storage().resize_(0)
        else:
            du.flat = None

    def close(self) -> None:
        self._kept = {}


class ActivationOffload:
    """Layer-input checkpoints to host memory after forward and back before backward (activation offload).

    Host buffers are pinned on CUDA and reused across steps per (unit, micro-batch).
    """

    def __init__(self, device: Device, recorder: TraceRecorder):
        self.device, self.recorder = device, recorder
        self._pool: dict[tuple[int, int], torch.Tensor] = {}

    def offload(self, u: int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        dev = self.device
        done = dev.event()
        dev.wait(dev.d2h, done)
        out = []
        nbytes = sum(x.numel() * x.element_size() for x in xs)
        with self.recorder.span("d2h", "d2h_ckpt", u, nbytes=nbytes, host_bytes=nbytes, stream=dev.d2h), \
                dev.on(dev.d2h):
            for mb, x in enumerate(xs):
                key = (u, mb)
                if key not in self._pool or self._pool[key].shape != x.shape:
                    buf = torch.empty(x.shape, dtype=x.dtype, pin_memory=dev.is_cuda)
                    self._pool[key] = buf
                self._pool[key].copy_(x, non_blocking=True)
                dev.keep_alive(x, dev.d2h)
                out.append(self._pool[key])
        return out

    def reload(self, u: int, xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], object]:
        """The checkpoints back on the device, and the H2D event backward waits on before reading them."""
        dev = self.device
        nbytes = sum(x.numel() * x.element_size() for x in xs)
        allocated = dev.event()
        dev.wait(dev.h2d, allocated)
        out = []
        with self.recorder.span("h2d", "h2d_ckpt", u, nbytes=nbytes, host_bytes=nbytes, stream=dev.h2d), \
                dev.on(dev.h2d):
            for x in xs:
                y = torch.empty(x.shape, dtype=x.dtype, device=dev.torch_device)
                y.copy_(x, non_blocking=True)
                out.append(y)
        return out, dev.event(dev.h2d)
