"""A unit's fp32 gradient from the device to the host state, by the policy's gradient route.

  one rank         - add its squared norm, cast, D2H chunk by chunk into the gradient buffer.
  reduce_scatter   - reduce-scatter each chunk over the ranks; each rank adds the norm of its summed shards
                     and copies them into its part of the shared gradient buffer.
  per_rank         - every rank copies its whole gradient into its own landing buffer; once all have
                     landed, each chunk's owner sums the N copies on the CPU into the gradient buffer and
                     adds the norm of the sum.
Each rank so holds the squared norm of a disjoint part of the gradient; :meth:`GradientRoutes.global_norm_sq`
sums them over the ranks. Under the ``as_ready`` schedule a chunk's update is submitted as soon as its
summed gradient is in host memory (``on_landed``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from slidedp.routes import Routes
from slidedp.runtime.chunks import ChunkTable
from slidedp.runtime.comm import Comm
from slidedp.runtime.device import Device
from slidedp.runtime.host_state import HostState
from slidedp.runtime.tracing import TraceRecorder

LandedHook = Callable[..., None]  # (unit, chunk[, D2H event]): the chunk's summed gradient is in host memory


class GradientRoutes:
    def __init__(self, table: ChunkTable, routes: Routes, host: HostState, device: Device, recorder: TraceRecorder,
                 comm: Comm, on_landed: LandedHook | None = None):
        self.table, self.routes, self.host, self.device = table, routes, host, device
        self.recorder, self.comm, self.on_landed = recorder, comm, on_landed
        self.cpu_norm_sq = 0.0  # per_rank route: squared norm of the chunks this rank summed on the CPU

    def begin_step(self) -> None:
        self.cpu_norm_sq = 0.0

    def send(self, u: int, gflat: torch.Tensor, norm_sq: torch.Tensor, grad_done: dict) -> None:
        """Reduce over ranks by the gradient route, add to the squared norm, and copy the gradient chunk by
        chunk into the host slot (or, per-rank route, into this rank's landing buffer for the owner to sum).
        ``grad_done[u]`` becomes the event of the last copy: the GPU memory of ``gflat`` is free after it."""
        dev, host, unit, comm, routes = self.device, self.host, self.table.units[u], self.comm, self.routes
        if routes.reduce_scatters:
            with self.recorder.span("link", "reduce_scatter", u, nbytes=gflat.numel() * gflat.element_size()
                                    * (comm.world - 1) / comm.world):
                src, pieces = self._reduce_scatter(u, gflat)
        else:
            src, pieces = gflat, [(a, a, b) for a, b in self.table.chunks(u)]
        per_rank = routes.cpu_reduces
        if not per_rank:  # this rank's part of the norm (all of it with one rank); summed over ranks at the end
            norm_sq += torch.linalg.vector_norm(src).square()
        dest = host.landing[comm.rank] if per_rank else host.grad_buffer
        base = 0 if per_rank else unit.offset
        send = src.to(dest.dtype) if dest.dtype != src.dtype else src
        ready = dev.event()
        dev.wait(dev.d2h, ready)
        esize = send.element_size()
        last = None
        for c, (off, a, b) in enumerate(pieces):
            with self.recorder.span("d2h", "d2h_grad", u, c, nbytes=(b - a) * esize, host_bytes=(b - a) * esize,
                                    stream=dev.d2h), dev.on(dev.d2h):
                dest[base + a:base + b].copy_(send[off:off + b - a], non_blocking=True)
            last = dev.event(dev.d2h)
            if self.on_landed is not None and not per_rank:
                self.on_landed(u, c, last)
        dev.keep_alive(send, dev.d2h)
        grad_done[u] = last
        if per_rank:
            self._sum_landed(u, last)

    def _reduce_scatter(self, u: int, gflat: torch.Tensor) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
        """Reduce-scatter each chunk of a unit's gradient: this rank receives the sum of its shard of every
        chunk. Returns those sums back to back (zero padding where shards are uneven) and, per chunk, where
        the shard starts in them and which unit-local range it covers."""
        comm = self.comm
        bounds = [self.routes.shard_bounds(a, b) for a, b in self.table.chunks(u)]
        widths = [max(bd[r + 1] - bd[r] for r in range(comm.world)) for bd in bounds]
        out = torch.empty(sum(widths), dtype=gflat.dtype, device=gflat.device)
        pieces, off = [], 0
        for bd, width in zip(bounds, widths, strict=True):
            if (bd[-1] - bd[0]) == width * comm.world:  # even shards: the chunk itself is the input
                inp = gflat[bd[0]:bd[-1]]
            else:
                inp = torch.zeros(width * comm.world, dtype=gflat.dtype, device=gflat.device)
                for r in range(comm.world):
                    inp[r * width:r * width + bd[r + 1] - bd[r]] = gflat[bd[r]:bd[r + 1]]
            comm.reduce_scatter_(out[off:off + width], inp)
            pieces.append((off, bd[comm.rank], bd[comm.rank + 1]))
            off += width
        return out, pieces

    def _sum_landed(self, u: int, landed) -> None:
        """Per-rank gradient route: each chunk's owner sums every rank's copy into the shared slot."""
        host, comm, unit = self.host, self.comm, self.table.units[u]
        Device.host_wait(landed)
        comm.barrier()  # every rank's copy of this unit has landed
        per_param = self.routes.cpu_reduce_bytes_per_param  # read N copies, write their sum
        for c, (a, b) in enumerate(self.table.chunks(u)):
            if self.table.owned_range(u, c) is None:
                continue
            with self.recorder.host_span("cpu", "cpu_reduce", u, c, host_bytes=(b - a) * per_param):
                total = host.landing[0][a:b].to(torch.float32)
                for r in range(1, comm.world):
                    total += host.landing[r][a:b]
                self.cpu_norm_sq += float(torch.linalg.vector_norm(total).square())
                host.grad_buffer[unit.offset + a:unit.offset + b].copy_(total)
            if self.on_landed is not None:
                self.on_landed(u, c)
        comm.barrier()  # the landing buffers may be reused

    def global_norm_sq(self, norm_sq: torch.Tensor) -> torch.Tensor:
        """The squared norm of every streamed gradient, from this rank's part (``norm_sq`` on the device, or
        the CPU sums' on the per_rank route): the same on every rank."""
        if self.routes.cpu_reduces:  # owners hold the norms of the summed chunks
            return self.comm.all_reduce_(torch.tensor(self.cpu_norm_sq, dtype=torch.float64))
        return self.comm.all_reduce_(norm_sq)  # each rank holds the norm of its reduced shards
