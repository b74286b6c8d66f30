"""Communication routes: how a chunk of parameters reaches every GPU and how its gradient comes back.

A Policy names the routes (``param_route``, ``grad_route``); this module is the one place that says what
they mean for a given number of ranks: the bytes each rank moves per parameter over each path, which
rank's CPU worker updates which part of a chunk, whether the CPU sums per-rank gradient copies, and how
units and chunks are cut into ranges. The workload (and through it the analytical model, the memory model
and the simulator's schedule) and the runtime engine all ask a :class:`Routes`, so no other module
compares route names.

Units are cut into ``chunks_per_layer`` contiguous chunks (:func:`chunk_ranges`), and a chunk into one
contiguous shard per rank (:func:`shard_bounds`) on the sharded routes.

Across hosts (``hosts`` > 1, ranks numbered host-major as torchrun does: global rank = host x ranks + local
rank) the policy's ``host_layout`` adds one rule, also written here only:
  replicated - every host keeps the whole state; a host's ranks reduce a chunk's gradient as on one host, then
               the rank holding a reduced piece all-reduces it with its peers (the same local rank on every
               other host); every host runs the whole CPU update.
  sharded    - host h keeps master and moments of part h of every chunk (:meth:`Routes.host_range`: the chunk
               cut into ``hosts`` contiguous parts) and the weights of all of it. On the reduce-scatter route
               a chunk's gradient is reduce-scattered over all hosts x ranks at once, so rank (h, l) receives
               global shard h x ranks + l, which lies inside part h; on the per-rank route the chunk's owner sums
               its host's copies on the CPU and reduce-scatters the sum with its peers. After its update each
               owner all-gathers the new weights with its peers into every host's weight slot, chunk by chunk.
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
    ranks: int  # data-parallel ranks of one host (they share its host state)
    chunks: int
    weight_bytes: int = 2
    grad_bytes: int = 2
    align: int = 1  # chunk and shard boundaries are multiples of this inside a unit (StatePrecision.block)
    hosts: int = 1
    host_layout: str = "replicated"

    @classmethod
    def of(cls, policy: Policy, ranks: int, weight_bytes: int = 2, grad_bytes: int | None = None,
           hosts: int = 1) -> Routes:
        """``ranks``: ranks per host; ``hosts``: hosts of the run (each with ``ranks`` ranks)."""
        return cls(policy.param_route, policy.grad_route, ranks, policy.chunks_per_layer, weight_bytes,
                   policy.grad_bytes if grad_bytes is None else grad_bytes, align=policy.state_precision.block,
                   hosts=hosts, host_layout=policy.host_layout)

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

    # ---- across hosts ------------------------------------------------------------------------------------------
    @property
    def shards_hosts(self) -> bool:
        """Each host keeps master and moments of 1/H of every chunk (host layout ``sharded``, H > 1)."""
        return self.host_layout == "sharded" and self.hosts > 1

    @property
    def gpu_scatter_ranks(self) -> int:
        """How many ranks a gradient chunk is reduce-scattered over on the GPUs (1: not at all). The reduce-
        scatter route scatters over this host's ranks, or over every rank of every host under ``sharded``; a
        host of one rank scatters over the hosts under ``sharded`` whatever the route (its owner is itself)."""
        if self.grad_route == "reduce_scatter" or self.ranks == 1:
            return self.ranks * (self.hosts if self.shards_hosts else 1)
        return 1

    @property
    def cross_host_grad(self) -> str | None:
        """The gradient collective a rank runs with its peers on the other hosts after its host's reduction:
        ``all_reduce`` (replicated), ``reduce_scatter`` (sharded, where the GPU scatter did not already cross
        hosts: the CPU sum of the per-rank route), or None (one host, or already done)."""
        if self.hosts == 1:
            return None
        if not self.shards_hosts:
            return "all_reduce"
        return None if self.gpu_scatter_ranks > 1 else "reduce_scatter"

    @property
    def norm_spans_hosts(self) -> bool:
        """Whether the squared gradient norm is summed over every host's ranks (each host holds a different
        part of the reduced gradient) or only over this host's (every host holds all of it)."""
        return self.shards_hosts

    def host_range(self, a: int, b: int, host: int) -> tuple[int, int]:
        """Host ``host``'s part [a', b') of a chunk [a, b): all of it unless the host layout is sharded."""
        if not self.shards_hosts:
            return a, b
        bounds = shard_bounds(a, b, self.hosts, self.align)
        return bounds[host], bounds[host + 1]

    def host_share_numel(self, unit_numels: list[int], host: int) -> int:
        """Elements of master weights (and of each moment) that host ``host`` keeps."""
        total = 0
        for numel in unit_numels:
            for a, b in self.chunk_ranges(numel):
                lo, hi = self.host_range(a, b, host)
                total += hi - lo
        return total

    @property
    def host_state_fraction(self) -> float:
        """Share of master weights, moments and CPU update work that one host holds (1/H when sharded)."""
        return 1.0 / self.hosts if self.shards_hosts else 1.0

    @property
    def nic_grad_factor(self) -> float:
        """Gradient bytes per parameter that one host sends over its NICs per step (ring collectives): an
        all-reduce 2 (H-1)/H, a reduce-scatter (H-1)/H of the gradient."""
        if self.hosts == 1:
            return 0.0
        ring = (self.hosts - 1) / self.hosts * self.grad_bytes
        return ring if self.shards_hosts else 2 * ring

    @property
    def nic_weight_factor(self) -> float:
        """Weight bytes per parameter one host sends over its NICs per step: the all-gather of new weights
        (sharded only)."""
        return (self.hosts - 1) / self.hosts * self.weight_bytes if self.shards_hosts else 0.0

    # ---- bytes per parameter per rank ----------------------------------------------------------------------
    @property
    def h2d_param_factor(self) -> float:
        return self.weight_bytes / self.ranks if self.param_route == "sharded" else float(self.weight_bytes)

    @property
    def allgather_factor(self) -> float:
        return (self.ranks - 1) / self.ranks * self.weight_bytes if self.shards_params else 0.0

    @property
    def d2h_grad_factor(self) -> float:
        """Gradient bytes per parameter a rank copies to the host: its shard of the GPU reduce-scatter."""
        return float(self.grad_bytes) / self.gpu_scatter_ranks

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
    @property
    def owners_per_chunk(self) -> int:
        """How many ranks update each chunk (the length of every ``chunk_owners``): each rank its shard on the
        reduce-scatter route, else the chunk's one owner."""
        return self.ranks if self.shards_updates else 1

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

    def owned_range(self, u: int, c: int, a: int, b: int, rank: int, host: int = 0) -> tuple[int, int] | None:
        """The part of chunk ``c`` of unit ``u`` (unit-local elements [a, b)) that local rank ``rank`` of host
        ``host`` updates, or None. Under ``sharded`` it lies inside the host's part (:meth:`host_range`)."""
        if rank not in self.chunk_owners(u, c):
            return None
        scatter = self.gpu_scatter_ranks
        if scatter > 1:  # the reduce-scatter's shard: global index host x ranks + rank when it spans hosts
            index = host * self.ranks + rank if scatter > self.ranks else rank
            bounds = shard_bounds(a, b, scatter, self.align)
            return bounds[index], bounds[index + 1]
        return self.host_range(a, b, host)
