"""Which chunks exist, who updates which part of each, and the shared flags that say an update is done.

Every unit is cut into ``chunks_per_layer`` contiguous chunks (:meth:`slidedp.routes.Routes.chunk_ranges`); the
chunk is the grain of every copy and of every CPU update job. :class:`Routes` decides which rank's worker
updates which part of a chunk; this table turns that into ranges of the flat host state and, with data
parallel ranks, publishes and polls the per (chunk, owner) flags in shared memory: a rank streams a
chunk only once every owner of it has applied the step's update.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from slidedp.policy import Policy
from slidedp.routes import Routes
from slidedp.runtime.hf_adapter import ModelAdapter, UnitLayout

FLAG_POLL_S = 0.0002  # how long a rank sleeps between looks at another rank's flag


def shared_buffer_sizes(adapter: ModelAdapter, policy: Policy, world: int) -> tuple[int, int]:
    """Entries of the shared update-flag table and elements of each rank's gradient landing buffer that a
    data-parallel engine with this policy needs (see HostState.allocate_shared): one flag per chunk and
    rank; a landing buffer of the largest unit only where the CPU sums per-rank gradient copies."""
    routes = Routes.of(policy, world)
    flags = sum(len(routes.chunk_ranges(u.numel)) for u in adapter.units) * world
    landing = max(u.numel for u in adapter.units) if routes.cpu_reduces else 0
    return flags, landing


class ChunkTable:
    """The chunks of every unit, this rank's share of their updates, and the shared update flags.

    ``host_units_from`` is the first unit whose state lives in host memory: the leading GPU-state units
    are updated on the device, so no rank owns a host range of them. ``rank`` is the local rank, ``host``
    this host's index: under the ``sharded`` host layout the host keeps master and moments only of its part
    of every chunk, packed back to back in chunk order, and :meth:`state_range` maps a flat range there.
    """

    def __init__(self, units: tuple[UnitLayout, ...], routes: Routes, rank: int, host_units_from: int = 0,
                 flags: torch.Tensor | None = None, host: int = 0):
        self.units, self.routes, self.rank, self.host = units, routes, rank, host
        self.host_units_from = host_units_from
        self.flags = flags  # shared int64 table, data parallel only (HostState.flags)
        self._ranges = [routes.chunk_ranges(u.numel) for u in units]
        self._base = [0]  # index of each unit's first chunk in the flag table
        for ranges in self._ranges[:-1]:
            self._base.append(self._base[-1] + len(ranges))
        self.largest_chunk = max(b - a for ranges in self._ranges for a, b in ranges)
        # Per unit and chunk: (flat start of this host's part, its offset in the packed state).
        self._share: list[list[tuple[int, int]]] = []
        packed = 0
        for unit, ranges in zip(units, self._ranges, strict=True):
            row = []
            for a, b in ranges:
                lo, hi = routes.host_range(a, b, host)
                row.append((unit.offset + lo, packed))
                packed += hi - lo
            self._share.append(row)
        self.share_numel = packed  # == routes.host_share_numel(...): the host state's master length

    def share_pieces(self) -> list[tuple[int, int, int]] | None:
        """(flat lo, flat hi, packed lo) of every part this host keeps, or None when it keeps everything."""
        if not self.routes.shards_hosts:
            return None
        return [(*self.host_part(u, c), self._share[u][c][1]) for u in range(len(self.units))
                for c in range(len(self._ranges[u]))]

    def host_part(self, u: int, c: int) -> tuple[int, int]:
        """This host's part of chunk ``c`` of unit ``u`` in the flat model (all of it unless sharded)."""
        a, b = self._ranges[u][c]
        lo, hi = self.routes.host_range(a, b, self.host)
        return self.units[u].offset + lo, self.units[u].offset + hi

    def state_range(self, u: int, c: int, lo: int, hi: int) -> tuple[int, int]:
        """Where flat range [lo, hi) of this host's part of chunk ``c`` of unit ``u`` sits in the packed
        master and moments (the same range when the host keeps the whole state)."""
        start, packed = self._share[u][c]
        return packed + lo - start, packed + hi - start

    def peer_ranges(self, u: int, c: int) -> list[tuple[int, int]]:
        """Flat ranges that this local rank's peer on each host updates in chunk ``c`` of unit ``u``
        (sharded host layout: what the weight all-gather assembles)."""
        a, b = self._ranges[u][c]
        off = self.units[u].offset
        out = []
        for h in range(self.routes.hosts):
            lo, hi = self.routes.owned_range(u, c, a, b, self.rank, h)
            out.append((off + lo, off + hi))
        return out

    def chunks(self, u: int) -> list[tuple[int, int]]:
        """Unit-local element ranges [a, b) of unit ``u``'s chunks."""
        return self._ranges[u]

    def owned_range(self, u: int, c: int) -> tuple[int, int] | None:
        """This rank's part of chunk ``c`` of unit ``u`` in the flat host state, or None (not an owner, or a
        GPU-state unit)."""
        if u < self.host_units_from:
            return None
        a, b = self._ranges[u][c]
        owned = self.routes.owned_range(u, c, a, b, self.rank, self.host)
        if owned is None:
            return None
        offset = self.units[u].offset
        return offset + owned[0], offset + owned[1]

    def owned(self) -> Iterator[tuple[int, int, int, int]]:
        """(unit, chunk, lo, hi) of every host range this rank updates, in streaming order."""
        for u in range(len(self.units)):
            for c in range(len(self._ranges[u])):
                owned = self.owned_range(u, c)
                if owned is not None:
                    yield u, c, owned[0], owned[1]

    # ---- shared update flags --------------------------------------------------------------------------------
    def _flag_index(self, u: int, c: int, rank: int) -> int:
        return (self._base[u] + c) * self.routes.ranks + rank

    def mark_updated(self, u: int, c: int, step: int) -> None:
        """Publish that this rank applied update ``step`` to its part of chunk ``c`` (after the data:
        readers poll this)."""
        if self.flags is not None:
            self.flags[self._flag_index(u, c, self.rank)] = step

    def wait_for_owners(self, u: int, c: int, step: int) -> None:
        """With other ranks updating parts of this chunk, block until every owner's flag reached ``step``."""
        if self.routes.ranks == 1:
            return
        for owner in self.routes.chunk_owners(u, c):
            index = self._flag_index(u, c, owner)
            while int(self.flags[index]) < step:
                time.sleep(FLAG_POLL_S)
