"""What the engine needs from torch.distributed, and nothing when there is one rank.

Collectives run on whatever backend the process group has: NCCL between GPUs, gloo on CPU (the tests). Ranks
that share a GPU (``--ranks-per-gpu``) cannot use NCCL: their collectives go over gloo, each GPU tensor staged
through host memory (``host_staged``).
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
    # Whether the backend has reduce_scatter_tensor: unknown until the first call tries it.
    native_reduce_scatter: bool | None = field(default=None, compare=False)
    host_staged: bool = False  # GPU tensors go through host copies (gloo between ranks sharing a GPU)

    @classmethod
    def from_process_group(cls, host_staged: bool = False) -> Comm:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), host_staged=host_staged)
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
            dist.barrier()

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            (h,) = self._staged(t)
            dist.all_reduce(h)
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
                dist.reduce_scatter_tensor(out, inp)
                self.native_reduce_scatter = True
                return out
            except (RuntimeError, NotImplementedError):
                if self.native_reduce_scatter:  # it worked before: a real failure, not a missing op
                    raise
                self.native_reduce_scatter = False
        dist.all_reduce(inp)
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
        width = max(bounds[r + 1] - bounds[r] for r in range(self.world))
        padded = torch.zeros(width, dtype=mine.dtype, device=mine.device)
        padded[:mine.numel()] = mine
        gathered = torch.empty(width * self.world, dtype=mine.dtype, device=mine.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        gather(gathered, padded)
        for r in range(self.world):
            n = bounds[r + 1] - bounds[r]
            out[bounds[r] - base:bounds[r + 1] - base] = gathered[r * width:r * width + n]
