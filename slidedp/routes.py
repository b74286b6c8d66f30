"""Communication routes: how a chunk of parameters reaches every GPU and how its gradient comes back.

A Policy names the routes (``param_route``, ``grad_route``); this module is the one place that says what
they mean for a given number of ranks: the bytes each rank moves per parameter over each path, which
rank's CPU worker updates which part of a chunk, whether the CPU sums per-rank gradient copies, and how
units and chunks are cut into ranges. The workload (and through it the analytical model, the memory model
and the simulator's schedule) and the runtime engine all ask a :class:`Routes`, so no other module
compares route names.

Units are cut into ``chunks_per_layer`` contiguous chunks (:func:`chunk_ranges`), and a chunk into one
contiguous shard per rank (:func:`shard_bounds`) on the sharded routes.
"""

from __future__ import annotations

from dataclasses import dataclass

from slidedp.policy import Policy


def chunk_ranges(numel: int, chunks: int, align: int = 1) -> list[tuple[int, int]]:
    """Element ranges [a, b) of a unit cut into at most ``chunks`` equal contiguous pieces (the last may be
    shorter, and a unit smaller than ``chunks`` elements gets fewer pieces). Every start is a multiple of
    ``align`` (the 8-bit moment block: a block never spans two update jobs)."""
    step = -(-numel // chunks)
    step = -(-step // align) * align
    return [(a, min(numel, a + step)) for a in range(0, numel, step)]


def shard_bounds(a: int, b: int, world: int, align: int = 1) -> list[int]:
    """Split [a, b) into ``world`` contiguous, nearly equal parts; part r is [bounds[r], bounds[r + 1]). With
    ``align`` > 1 (``a`` aligned) every inner bound is a multiple of it past ``a`` (parts may then be empty)."""
    inner = [a + ((b - a) * r // world) // align * align for r in range(1, world)]
    return [a, *inner, b] if world > 0 else [a]


@dataclass(frozen=True)
class Routes:
    """What the policy's routes mean for ``ranks`` data-parallel ranks.

    ``weight_bytes`` and ``grad_bytes`` are the element sizes that cross PCIe (bf16 in training; the CPU
    runtime streams fp32), so every ``*_factor`` is bytes per parameter per rank.
    """

    param_route: str
    grad_route: str
    ranks: int
    chunks: int
    weight_bytes: int = 2
    grad_bytes: int = 2
    align: int = 1  # chunk and shard boundaries are multiples of this inside a unit (StatePrecision.block)

    @classmethod
    def of(cls, policy: Policy, ranks: int, weight_bytes: int = 2, grad_bytes: int | None = None) -> Routes:
        return cls(policy.param_route, policy.grad_route, ranks, policy.chunks_per_layer, weight_bytes,
                   policy.grad_bytes if grad_bytes is None else grad_bytes, policy.state_precision.block)

    def chunk_ranges(self, numel: int) -> list[tuple[int, int]]:
        """The chunks of a unit of ``numel`` elements (unit-local ranges)."""
        return chunk_ranges(numel, self.chunks, self.align)

    def shard_bounds(self, a: int, b: int) -> list[int]:
        """The per-rank shards of chunk [a, b) on the sharded routes."""
        return shard_bounds(a, b, self.ranks, self.align)

    # ---- what runs where ---------------------------------------------------------------------------------
    @property
    def shards_params(self) -> bool:
        """Each rank copies 1/N of every chunk from host memory, then the ranks all-gather it."""
        return self.param_route == "sharded" and self.ranks > 1

    @property
    def reduce_scatters(self) -> bool:
        """The GPUs reduce-scatter each gradient chunk; each rank copies its 1/N shard to the host."""
        return self.grad_route == "reduce_scatter" and self.ranks > 1

    @property
    def cpu_reduces(self) -> bool:
        """Every rank copies its whole gradient to its own landing buffer and the chunk's owner sums the N
        copies on the CPU: the only route that needs per-rank host buffers."""
        return self.grad_route == "per_rank" and self.ranks > 1

    @property
    def shards_updates(self) -> bool:
        """Every rank's worker updates its 1/N shard of every chunk (otherwise one owner per chunk)."""
        return self.grad_route == "reduce_scatter"

    # ---- bytes per parameter per rank ----------------------------------------------------------------------
    @property
    def h2d_param_factor(self) -> float:
        return self.weight_bytes / self.ranks if self.param_route == "sharded" else float(self.weight_bytes)

    @property
    def allgather_factor(self) -> float:
        return (self.ranks - 1) / self.ranks * self.weight_bytes if self.shards_params else 0.0

    @property
    def d2h_grad_factor(self) -> float:
        g = float(self.grad_bytes)
        return g / self.ranks if self.grad_route == "reduce_scatter" else g

    @property
    def reduce_scatter_factor(self) -> float:
        return (self.ranks - 1) / self.ranks * self.grad_bytes if self.reduce_scatters else 0.0

    @property
    def cpu_reduce_bytes_per_param(self) -> float:
        """Host DRAM bytes of the CPU gradient sum: read N copies and write their sum (0 on other routes)."""
        return (self.ranks + 1) * self.grad_bytes if self.cpu_reduces else 0.0

    def allreduce_bytes(self, params: float, nbytes: int = 4) -> float:
        """Per-rank ring all-reduce bytes of a gradient of ``params`` elements of ``nbytes`` each."""
        return 2 * (self.ranks - 1) / self.ranks * nbytes * params if self.ranks > 1 else 0.0

    # ---- ownership -------------------------------------------------------------------------------------------
    def chunk_owners(self, u: int, c: int) -> tuple[int, ...]:
        """Ranks whose CPU worker updates (part of) chunk ``c`` of unit ``u``.

        Reduce-scatter gives every rank a 1/N shard of each chunk; per-rank gradients are summed and
        updated by one owner per chunk, chosen round-robin so the CPU work is spread evenly.
        """
        if self.shards_updates or self.ranks == 1:
            return tuple(range(self.ranks))
        return ((u * self.chunks + c) % self.ranks,)

    def owner_chunk_counts(self, u: int) -> list[int]:
        """Per rank, how many of unit ``u``'s chunks it owns on the one-owner route."""
        counts = [0] * self.ranks
        for c in range(self.chunks):
            counts[(u * self.chunks + c) % self.ranks] += 1
        return counts

    def owned_range(self, u: int, c: int, a: int, b: int, rank: int) -> tuple[int, int] | None:
        """The part of chunk ``c`` of unit ``u`` (unit-local elements [a, b)) that ``rank`` updates, or None."""
        if rank not in self.chunk_owners(u, c):
            return None
        if self.shards_updates and self.ranks > 1:
            bounds = self.shard_bounds(a, b)
            return bounds[rank], bounds[rank + 1]
        return a, b
