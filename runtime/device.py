"""The few device operations the engine needs, for CUDA (streams + events) and for CPU (synchronous).

Keeping both behind one small interface is what lets CI run the exact engine code path on CPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, MutableMapping

import torch

from slidedp.hardware import GIB

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def prefer_expandable_segments(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Ask PyTorch's CUDA caching allocator for expandable segments unless the user configured the allocator.

    Why: a streaming step allocates and frees a layer's working set over and over in sizes that change with the
    unit (attention, sequence tiles, the loss chunks). With fixed segments the freed blocks fragment: on the H200
    (2026-12-04) the 256K-token run planned for an 80 GiB cap stopped with 72.3 GiB allocated and 7.3 GiB
    reserved but unusable, a 4.25 GiB request short. The memory model plans allocated bytes plus a fixed reserve,
    which only holds when freed memory can be reused. Must run before the first CUDA allocation (the allocator
    reads the variable once); launched ranks inherit it. Returns whether it set the variable."""
    if environ.get(ALLOC_CONF_ENV) or environ.get("PYTORCH_ALLOC_CONF"):
        return False
    environ[ALLOC_CONF_ENV] = EXPANDABLE_SEGMENTS
    return True


def cuda_memory_gib(name: str) -> float | None:
    """Total memory of the CUDA device ``name`` (auto, cuda or cuda:N) in GiB; None where the run has no GPU
    (cpu, or auto without CUDA)."""
    if name == "cpu" or not torch.cuda.is_available() or not (name == "auto" or name.startswith("cuda")):
        return None
    from slidedp.errors import SlideDPError

    try:
        index = int(name.split(":", 1)[1]) if ":" in name else torch.cuda.current_device()
    except ValueError:
        raise SlideDPError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N") from None
    if not 0 <= index < torch.cuda.device_count():
        raise SlideDPError(f"--device {name}: this machine has {torch.cuda.device_count()} visible GPU(s)")
    return torch.cuda.get_device_properties(index).total_memory / GIB


def rank_gpu_gib(name: str, ranks_per_gpu: int = 1) -> float | None:
    """GPU memory one rank has: its card's (``name``), split evenly between the ranks that share it; None
    without a GPU. The runtime caps each rank's allocator at it; the tuner plans a usable fraction of it
    (slidedp.problem.resolve_budget)."""
    total = cuda_memory_gib(name)
    return None if total is None else total / max(1, ranks_per_gpu)


class Device:
    def __init__(self, name: str):
        if name == "cuda":  # memory-fraction and stats calls want an explicit index
            name = f"cuda:{torch.cuda.current_device()}"
        self.name = name
        self.is_cuda = name.startswith("cuda")
        self.torch_device = torch.device(name)
        if self.is_cuda:
            self.compute = torch.cuda.current_stream(self.torch_device)
            self.h2d = torch.cuda.Stream(self.torch_device)
            self.d2h = torch.cuda.Stream(self.torch_device)
        else:
            self.compute = self.h2d = self.d2h = None

    @contextlib.contextmanager
    def on(self, stream) -> Iterator[None]:
        if stream is None:
            yield
        else:
            with torch.cuda.stream(stream):
                yield

    def event(self, stream=None):
        """An event marking everything issued so far on ``stream`` (None on CPU: work is already done)."""
        if not self.is_cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(stream or self.compute)
        return ev

    def wait(self, stream, event) -> None:
        """Make ``stream`` wait for ``event`` without blocking the host."""
        if event is not None and stream is not None:
            stream.wait_event(event)

    @staticmethod
    def host_wait(event) -> None:
        """Block the calling host thread until ``event`` completed: required before the CPU reads data a
        device copy wrote."""
        if event is not None:
            event.synchronize()

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    def keep_alive(self, tensor: torch.Tensor, stream) -> None:
        """Tell the caching allocator that ``stream`` still uses ``tensor``."""
        if stream is not None:
            tensor.record_stream(stream)
