"""A unit's fp32 gradient from the device to the host state, by the policy's gradient route.

  one rank         - add its squared norm, cast, D2H chunk by chunk into the gradient buffer.
  reduce_scatter   - reduce-scatter each chunk over the ranks; each rank adds the norm of its summed shards
                     and copies them into its part of the shared gradient buffer.
  per_rank         - every rank copies its whole gradient into its own landing buffer; once all have
                     landed, each chunk's owner sums the N copies on the CPU into the gradient buffer and
                     adds the norm of the sum.
Across hosts (slidedp.routes: ``cross_host_grad``) a host's reduced pieces are then all-reduced with the peers
on the other hosts (``replicated``), or the reduce-scatter spans every host's ranks and the per-rank route's
CPU sums are reduce-scattered with the peers (``sharded``). Each rank so holds the squared norm of a disjoint
part of the gradient of its host (replicated) or of all hosts (sharded); :meth:`GradientRoutes.global_norm_sq`
sums them over the host's ranks or over every rank. Under the ``as_ready`` schedule a chunk's update is
submitted as soon as its summed gradient is in host memory (``on_landed``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from slidedp.routes import Routes, shard_bounds
from slidedp.runtime.chunks import ChunkTable
from slidedp.runtime.comm import Comm, HostGroups
from slidedp.runtime.device import Device
from slidedp.runtime.host_state import HostState
from slidedp.runtime.tracing import TraceRecorder

LandedHook = Callable[..., None]  # (unit, chunk[, D2H event]): the chunk's summed gradient is in host memory


def scatter_sum(comm: Comm, x: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """The sum over ``comm``'s ranks of this rank's part [bounds[r], bounds[r + 1]) of ``x`` (``x`` covers
    [bounds[0], bounds[-1])), zero-padded to the widest part; ``x`` may be overwritten."""
    world = len(bounds) - 1
    width = max(bounds[r + 1] - bounds[r] for r in range(world))
    out = torch.empty(width, dtype=x.dtype, device=x.device)
    base = bounds[0]
    if bounds[-1] - base == width * world:  # even parts: the chunk itself is the input
        inp = x
    else:
        inp = torch.zeros(width * world, dtype=x.dtype, device=x.device)
        for r in range(world):
            inp[r * width:r * width + bounds[r + 1] - bounds[r]] = x[bounds[r] - base:bounds[r + 1] - base]
    comm.reduce_scatter_(out, inp)
    return out


class GradientRoutes:
    def __init__(self, table: ChunkTable, routes: Routes, host: HostState, device: Device, recorder: TraceRecorder,
                 comm: Comm, on_landed: LandedHook | None = None, groups: HostGroups | None = None):
        self.table, self.routes, self.host, self.device = table, routes, host, device
        self.recorder, self.comm, self.on_landed = recorder, comm, on_landed
        self.groups = groups or HostGroups.single(comm)
        # The group a chunk's gradient is reduce-scattered over (every rank when the scatter spans hosts), and
        # the one the squared norm is summed over.
        self.scatter_comm = self.groups.world if routes.gpu_scatter_ranks > routes.ranks else comm
        self.norm_comm = self.groups.world if routes.norm_spans_hosts else comm
        self.cpu_norm_sq = 0.0  # per_rank route: squared norm of the chunks this rank summed on the CPU

    def begin_step(self) -> None:
        self.cpu_norm_sq = 0.0

    def send(self, u: int, gflat: torch.Tensor, norm_sq: torch.Tensor, grad_done: dict) -> None:
        """Reduce over ranks by the gradient route, add to the squared norm, and copy the gradient chunk by
        chunk into the host slot (or, per-rank route, into this rank's landing buffer for the owner to sum).
        ``grad_done[u]`` becomes the event of the last copy: the GPU memory of ``gflat`` is free after it."""
        dev, host, unit, comm, routes = self.device, self.host, self.table.units[u], self.comm, self.routes
        if routes.gpu_scatter_ranks > 1:
            n = self.scatter_comm.world
            with self.recorder.span("link", "reduce_scatter", u, nbytes=gflat.numel() * gflat.element_size()
                                    * (n - 1) / n):
                src, pieces = self._reduce_scatter(u, gflat)
        else:
            src, pieces = gflat, [(a, a, b) for a, b in self.table.chunks(u)]
        per_rank = routes.cpu_reduces
        if routes.cross_host_grad == "all_reduce" and not per_rank:  # this host's sums, with the peers'
            peers = self.groups.peers
            with self.recorder.span("link", "host_allreduce", u, nbytes=src.numel() * src.element_size()
                                    * 2 * (peers.world - 1) / peers.world):
                peers.all_reduce_(src)
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
        comm = self.scatter_comm
        parts, pieces, off = [], [], 0
        for a, b in self.table.chunks(u):
            bd = shard_bounds(a, b, comm.world, self.routes.align)
            part = scatter_sum(comm, gflat[a:b], bd)
            parts.append(part)
            pieces.append((off, bd[comm.rank], bd[comm.rank + 1]))
            off += part.numel()
        return torch.cat(parts), pieces

    def _sum_landed(self, u: int, landed) -> None:
        """Per-rank gradient route: each chunk's owner sums every rank's copy into the shared slot."""
        host, comm, unit = self.host, self.comm, self.table.units[u]
        Device.host_wait(landed)
        comm.barrier()  # every rank's copy of this unit has landed
        per_param = self.routes.cpu_reduce_bytes_per_param  # read N copies, write their sum
        cross, peers = self.routes.cross_host_grad, self.groups.peers
        for c, (a, b) in enumerate(self.table.chunks(u)):
            if self.table.owned_range(u, c) is None:
                continue
            with self.recorder.host_span("cpu", "cpu_reduce", u, c, host_bytes=(b - a) * per_param):
                total = host.landing[0][a:b].to(torch.float32)
                for r in range(1, comm.world):
                    total += host.landing[r][a:b]
            lo, hi = a, b
            if cross == "all_reduce":
                with self.recorder.host_span("nic", "host_allreduce", u, c,
                                             nbytes=total.numel() * 8 * (peers.world - 1) / peers.world):
                    peers.all_reduce_(total)
            elif cross == "reduce_scatter":  # this host keeps the sum of its part only
                lo, hi = (x - unit.offset for x in self.table.host_part(u, c))
                with self.recorder.host_span("nic", "host_reduce_scatter", u, c,
                                             nbytes=total.numel() * 4 * (peers.world - 1) / peers.world):
                    bounds = [x - a for x in shard_bounds(a, b, peers.world, self.routes.align)]
                    total = scatter_sum(peers, total, bounds)[:hi - lo]
            self.cpu_norm_sq += float(torch.linalg.vector_norm(total).square())
            host.grad_buffer[unit.offset + lo:unit.offset + hi].copy_(total)
            if self.on_landed is not None:
                self.on_landed(u, c)
        comm.barrier()  # the landing buffers may be reused

    def global_norm_sq(self, norm_sq: torch.Tensor) -> torch.Tensor:
        """The squared norm of every streamed gradient, from this rank's part (``norm_sq`` on the device, or
        the CPU sums' on the per_rank route): the same on every rank."""
        if self.routes.cpu_reduces:  # owners hold the norms of the summed chunks
            return self.norm_comm.all_reduce_(torch.tensor(self.cpu_norm_sq, dtype=torch.float64))
        return self.norm_comm.all_reduce_(norm_sq)  # each rank holds the norm of its reduced shards
