"""What the engine needs from torch.distributed, and nothing when there is one rank.

Collectives run on whatever backend the process group has: NCCL between GPUs, gloo on CPU (the tests). Ranks
that share a GPU (``--ranks-per-gpu``) cannot use NCCL: their collectives go over gloo, each GPU tensor staged
through host memory (``host_staged``).
A Comm covers one process group: the default (every rank) unless ``group`` names another; ``rank`` and ``world``
are this process's place in it and its size. Across hosts, :class:`HostGroups` holds the three a rank needs.
The gradient route `reduce_scatter` is a true reduce-scatter ((N-1)/N of the bytes over the links, half of an
all-reduce's); a backend without one (older gloo) gets an all-reduce and each rank keeps its part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Comm:
    rank: int = 0
    world: int = 1
    # Whether the backend has reduce_scatter_single (reduce_scatter_tensor before torch 2.13): unknown until
    # the first call tries it.
    native_reduce_scatter: bool | None = field(default=None, compare=False)
    host_staged: bool = False  # GPU tensors go through host copies (gloo between ranks sharing a GPU)
    group: object | None = field(default=None, compare=False)  # None: the default group (every rank)

    @classmethod
    def from_process_group(cls, host_staged: bool = False, group=None) -> Comm:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(group), dist.get_world_size(group), host_staged=host_staged, group=group)
        return cls()

    def _staged(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """The tensors a collective should run on: host copies of GPU tensors when staging, else themselves."""
        if not self.host_staged:
            return list(tensors)
        return [t.cpu() if t.is_cuda else t for t in tensors]

    @property
    def active(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier(group=self.group)

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            (h,) = self._staged(t)
            dist.all_reduce(h, group=self.group)
            if h is not t:
                t.copy_(h)
        return t

    def reduce_scatter_(self, out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        """``out`` = the sum over ranks of this rank's part ``inp[rank * n:(rank + 1) * n]``, n = out.numel().
        ``inp`` may be overwritten."""
        n = out.numel()
        if not self.active:
            return out.copy_(inp[:n])
        if self.host_staged and (out.is_cuda or inp.is_cuda):
            h_out, h_inp = self._staged(out, inp)
            self.reduce_scatter_(h_out, h_inp)
            return out.copy_(h_out)
        if self.native_reduce_scatter is not False:
            try:
                scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # torch 2.13
                scatter(out, inp, group=self.group)
                self.native_reduce_scatter = True
                return out
            except (RuntimeError, NotImplementedError):
                if self.native_reduce_scatter:  # it worked before: a real failure, not a missing op
                    raise
                self.native_reduce_scatter = False
        dist.all_reduce(inp, group=self.group)
        return out.copy_(inp[self.rank * n:(self.rank + 1) * n])

    def all_gather_into(self, out: torch.Tensor, mine: torch.Tensor, bounds: list[int]) -> None:
        """Assemble ``out`` (length bounds[-1] - bounds[0]) from each rank's part ``mine`` of it."""
        base = bounds[0]
        if not self.active:
            out.copy_(mine)
            return
        if self.host_staged and (out.is_cuda or mine.is_cuda):
            h_out, h_mine = self._staged(out, mine)
            self.all_gather_into(h_out, h_mine, bounds)
            out.copy_(h_out)
            return
        self.all_gather_ranges(out, mine, [(bounds[r] - base, bounds[r + 1] - base) for r in range(self.world)])

    def all_gather_ranges(self, out: torch.Tensor, mine: torch.Tensor, ranges: list[tuple[int, int]]) -> None:
        """Every rank r's ``mine`` into ``out[ranges[r][0]:ranges[r][1]]`` on every rank (ranges may leave gaps:
        the weights a host updated, scattered over a chunk)."""
        if not self.active:
            lo, hi = ranges[0]
            out[lo:hi].copy_(mine)
            return
        width = max(hi - lo for lo, hi in ranges)
        padded = torch.zeros(width, dtype=mine.dtype, device=mine.device)
        padded[:mine.numel()] = mine
        gathered = torch.empty(width * self.world, dtype=mine.dtype, device=mine.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        gather(gathered, padded, group=self.group)
        for r, (lo, hi) in enumerate(ranges):
            out[lo:hi] = gathered[r * width:r * width + hi - lo]


@dataclass
class HostGroups:
    """A rank's process groups across hosts (ranks numbered host-major, ``ranks`` per host):

    ``world``   every rank: the loss, the gradient norm under ``sharded``, the reduce-scatter that spans hosts,
                the GPU-held units, eval sums.
    ``local``   this host's ranks: everything one host does today (the shared state, its chunk routes).
    ``peers``   the same local rank on every host (group rank = host index): cross-host gradient collectives.
    ``weight_peers`` the same members in a second group, used only by the CPU update worker to all-gather new
                weights (``sharded``), so its collectives never interleave with the main thread's.
    With one host, ``local`` is ``world`` and the peer groups have one member.
    """

    world: Comm
    local: Comm
    peers: Comm
    weight_peers: Comm
    host: int = 0
    hosts: int = 1

    @classmethod
    def single(cls, comm: Comm | None = None) -> HostGroups:
        comm = comm or Comm()
        return cls(comm, comm, Comm(), Comm())

    @classmethod
    def create(cls, hosts: int, host_staged: bool = False) -> HostGroups:
        """Build the groups from the initialised default group (every rank must call this, in the same order)."""
        world = Comm.from_process_group(host_staged=host_staged)
        if hosts == 1:
            return cls.single(world)
        if world.world % hosts:
            raise ValueError(f"{world.world} ranks cannot be split evenly over {hosts} hosts")
        per_host = world.world // hosts
        host, local_rank = divmod(world.rank, per_host)
        groups: dict[str, Comm] = {}
        for h in range(hosts):
            g = dist.new_group([h * per_host + r for r in range(per_host)])
            if h == host:
                groups["local"] = Comm.from_process_group(host_staged, g)
        for name in ("peers", "weight_peers"):
            for r in range(per_host):
                g = dist.new_group([h * per_host + r for h in range(hosts)])
                if r == local_rank:
                    groups[name] = Comm.from_process_group(host_staged, g)
        return cls(world, groups["local"], groups["peers"], groups["weight_peers"], host, hosts)
