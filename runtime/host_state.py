"""The one authoritative copy of the training state, in host memory.

Per parameter: fp32 master weight, Adam m and v (12 B) and one slot in the compute dtype (2 B for
bf16) that holds the new weights between the update and the next H2D, and the gradient between its
D2H and the update. The two uses never overlap (a unit's backward re-fetch precedes its gradient), so
the state is 14 B/param. Each tensor is one allocation, registered with CUDA as pinned memory where a
GPU is used, so PyTorch's power-of-two pinned-allocator rounding never applies.

Under the ``sharded`` host layout (several hosts) a host keeps master and moments only of its share of the
parameters (``share``: flat ranges and where each sits in the packed tensors, from runtime.chunks.ChunkTable)
and the slot of all of them: then 12/H + 2 B/param.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from slidedp.errors import SlideDPError
from slidedp.runtime import checkpoint_files
from slidedp.runtime.hf_adapter import ModelAdapter
from slidedp.runtime.shared_dir import SharedDir

# Fault injection for the tests, both keyed by the data step whose checkpoint write they interrupt, after the
# state file and before meta.json: KILL makes the saving process SIGKILL itself there; PAUSE makes it write
# PAUSE_MARKER into its own temporary checkpoint directory and wait there (at most PAUSE_LIMIT_S, then the
# marker is removed and the save goes on), so that a test can send any signal to any process at a moment
# known to be "during the save" instead of sleeping and hoping. Neither does anything else.
FAULT_KILL_IN_SAVE = "SLIDEDP_FAULT_KILL_IN_SAVE"
FAULT_PAUSE_IN_SAVE = "SLIDEDP_FAULT_PAUSE_IN_SAVE"
PAUSE_MARKER = "FAULT_PAUSED"
PAUSE_LIMIT_S = 120.0


def _register(t: torch.Tensor) -> None:
    rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    if int(rc) != 0:
        raise SlideDPError(f"cudaHostRegister of {t.numel() * t.element_size() / 2**30:.1f} GiB failed "
                           f"(error {int(rc)}): raise the locked-memory limit (ulimit -l)")


def _shared(shared: SharedDir, name: str, numel: int, dtype: torch.dtype, create: bool, pin: bool) -> torch.Tensor:
    """A tensor backed by a file of the run's private shared directory: every rank maps the same pages."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if create:
        with shared.create_file(name, nbytes):
            pass
    t = torch.from_file(str(shared.check_file(name, nbytes)), shared=True, size=numel, dtype=dtype)
    if pin:
        _register(t)
    return t


def _share_numel(share: list[tuple[int, int, int]] | None, numel: int) -> int:
    return numel if share is None else sum(hi - lo for lo, hi, _ in share)


def _alloc(numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    t = torch.empty(numel, dtype=dtype)
    t.zero_()  # touch every page now (in parallel), not during the first copy
    if pin:
        _register(t)
    return t


@dataclass
class HostState:
    """Master weights, Adam moments and the stream slot of every parameter, flat over the whole model.

    ``slot`` is the one compute-dtype copy that crosses PCIe, used twice per step by each chunk: it holds
    the new weights from the chunk's CPU update until its next H2D, then (when the gradient has the slot's
    dtype) the gradient from its D2H until the update reads it. The two uses never overlap, which is why
    streaming costs 2 B/param on top of the 12 B of fp32 optimizer state instead of 4.
    """

    master: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    slot: torch.Tensor  # the weight/gradient slot in the compute dtype (see the class docstring)
    grads: torch.Tensor | None  # separate gradient buffer when the gradient dtype differs from the slot's
    pinned: bool
    step: int = 0  # optimizer steps applied
    # Data parallel only: per (unit, chunk, owner rank), the last optimizer step applied to that range, so a
    # rank streams a chunk only once every owner has updated it; and each rank's gradient landing buffer.
    flags: torch.Tensor | None = None
    landing: list[torch.Tensor] | None = None
    # Sharded host layout: (flat lo, flat hi, packed lo) of each part whose master and moments this host keeps;
    # None: it keeps all of them, at their flat positions.
    share: list[tuple[int, int, int]] | None = None

    @classmethod
    def allocate(cls, numel: int, slot_dtype: torch.dtype, grad_dtype: torch.dtype, pin: bool,
                 share: list[tuple[int, int, int]] | None = None) -> HostState:
        grads = None if grad_dtype == slot_dtype else _alloc(numel, grad_dtype, pin)
        state_numel = _share_numel(share, numel)
        return cls(_alloc(state_numel, torch.float32, pin), _alloc(state_numel, torch.float32, pin),
                   _alloc(state_numel, torch.float32, pin), _alloc(numel, slot_dtype, pin), grads, pin, share=share)

    @classmethod
    def allocate_shared(cls, shared: SharedDir, numel: int, slot_dtype: torch.dtype, grad_dtype: torch.dtype,
                        pin: bool, create: bool, flags: int, world: int, landing_numel: int,
                        share: list[tuple[int, int, int]] | None = None) -> HostState:
        """The one state all ranks of a host share, in files of ``shared`` (local rank 0 creates them first)."""
        def file(name: str, n: int, dtype: torch.dtype, pinned: bool = pin) -> torch.Tensor:
            return _shared(shared, name, n, dtype, create, pinned)

        grads = None if grad_dtype == slot_dtype else file("grads.bin", numel, grad_dtype)
        state_numel = _share_numel(share, numel)
        state = cls(file("master.bin", state_numel, torch.float32), file("exp_avg.bin", state_numel, torch.float32),
                    file("exp_avg_sq.bin", state_numel, torch.float32), file("slot.bin", numel, slot_dtype), grads,
                    pin, share=share)
        state.flags = file("flags.bin", flags, torch.int64, False)
        if landing_numel:
            state.landing = [file(f"landing_{r}.bin", landing_numel, grad_dtype) for r in range(world)]
        return state

    @property
    def grad_buffer(self) -> torch.Tensor:
        """Where a gradient waits for its update: the slot itself when the gradient has the slot's dtype."""
        return self.slot if self.grads is None else self.grads

    def bytes_per_param(self) -> float:
        """Bytes this host holds per parameter of the model (less than 14 when it keeps only a share)."""
        total = sum(t.numel() * t.element_size() for t in (self.master, self.exp_avg, self.exp_avg_sq, self.slot))
        if self.grads is not None:
            total += self.grads.numel() * self.grads.element_size()
        return total / self.slot.numel()

    def total_bytes(self) -> int:
        return int(self.bytes_per_param() * self.slot.numel())

    def refresh_slot(self) -> None:
        """The slot from the master weights this host keeps (under ``share``, only its parts: the other hosts'
        parts arrive by the weight all-gather)."""
        if self.share is None:
            self.slot.copy_(self.master)
            return
        for lo, hi, packed in self.share:
            self.slot[lo:hi].copy_(self.master[packed:packed + hi - lo])

    def full_weights(self) -> torch.Tensor:
        """Every parameter's current weights, flat: the master when this host keeps all of it, else the slot
        (the compute dtype; complete once the weight all-gather ran)."""
        return self.master if self.share is None else self.slot

    def _put_unit(self, start: int, values: torch.Tensor) -> None:
        """Initial weights of flat range [start, start + len(values)): into the slot, and into the master
        where this host keeps it."""
        end = start + values.numel()
        self.slot[start:end].copy_(values)
        for lo, hi, packed in self.share or []:
            a, b = max(lo, start), min(hi, end)
            if a < b:
                self.master[packed + a - lo:packed + b - lo].copy_(values[a - start:b - start])

    def close(self) -> None:
        if self.pinned:
            for t in (self.master, self.exp_avg, self.exp_avg_sq, self.slot, self.grads, *(self.landing or [])):
                if t is not None:
                    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
            self.pinned = False

    # ---- initialisation -----------------------------------------------------------------------------------
    def init_random(self, adapter: ModelAdapter, seed: int, device: torch.device | None = None) -> None:
        """Random init, unit by unit; with a CUDA ``device`` the numbers are drawn there (seconds instead of
        minutes for billions of parameters) and copied back."""
        for unit in adapter.units:
            if self.share is not None:  # the whole unit drawn, then kept where this host keeps it
                gen = torch.Generator().manual_seed(seed * 100_003 + unit.index)
                tmp = torch.empty(unit.numel, dtype=torch.float32)
                adapter.init_unit_(unit, tmp, gen)
                self._put_unit(unit.offset, tmp)
                continue
            dest = self.master[unit.offset:unit.offset + unit.numel]
            if device is not None and device.type == "cuda":
                gen = torch.Generator(device=device).manual_seed(seed * 100_003 + unit.index)
                tmp = torch.empty(unit.numel, dtype=torch.float32, device=device)
                adapter.init_unit_(unit, tmp, gen)
                dest.copy_(tmp)
                del tmp
            else:
                gen = torch.Generator().manual_seed(seed * 100_003 + unit.index)
                adapter.init_unit_(unit, dest, gen)
        if self.share is None:
            self.refresh_slot()

    def load_hf_weights(self, adapter: ModelAdapter, directory: Path) -> None:
        """Fill the master weights from a local HF checkpoint (*.safetensors)."""
        from safetensors import safe_open

        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise SlideDPError(f"checkpoint {str(directory)!r} has no *.safetensors files")
        where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    where[key] = f
        for unit in adapter.units:
            for p in unit.params:
                if p.hf_name not in where:
                    raise SlideDPError(f"checkpoint {str(directory)!r} lacks tensor {p.hf_name!r}")
                with safe_open(str(where[p.hf_name]), framework="pt") as handle:
                    t = handle.get_tensor(p.hf_name)
                if tuple(t.shape) != p.shape:
                    raise SlideDPError(f"checkpoint tensor {p.hf_name!r} has shape {tuple(t.shape)}, "
                                       f"the config says {p.shape}")
                start = unit.offset + p.offset
                if self.share is None:
                    self.master[start:start + p.numel].copy_(t.reshape(-1))
                else:
                    self._put_unit(start, t.reshape(-1).float())
        if self.share is None:
            self.refresh_slot()

    # ---- checkpoints ----------------------------------------------------------------------------------------
    def save(self, directory: Path, meta: dict) -> None:
        """Atomically write master, m, v and ``meta`` (runtime.checkpoint_files: temp directory, fsync, rename,
        digest), so a crash, a kill or a full disk mid-write leaves the previous checkpoint untouched."""
        def fault_point(tmp: Path) -> None:  # see FAULT_KILL_IN_SAVE / FAULT_PAUSE_IN_SAVE
            step = str(meta.get("data_step"))
            if os.environ.get(FAULT_KILL_IN_SAVE) == step:
                os.kill(os.getpid(), signal.SIGKILL)
            if os.environ.get(FAULT_PAUSE_IN_SAVE) == step:
                marker = tmp / PAUSE_MARKER
                marker.write_text(str(os.getpid()))
                deadline = time.monotonic() + PAUSE_LIMIT_S
                while time.monotonic() < deadline:
                    time.sleep(0.05)
                marker.unlink()

        checkpoint_files.write(Path(directory), {name: getattr(self, name) for name in checkpoint_files.TENSORS},
                               {**meta, "optimizer_step": self.step}, before_meta=fault_point)

    def load(self, directory: Path) -> dict:
        """Fill master, m and v from a checkpoint that :func:`checkpoint_files.verify` accepts; non-finite
        values are refused (a resumed NaN would skip every later step). Under ``share`` the checkpoint is this
        host's share and only its parts of the slot are refreshed (the engine all-gathers the rest)."""
        from safetensors import safe_open

        directory = Path(directory)
        meta = checkpoint_files.verify(directory, self.master.numel())
        with safe_open(str(directory / checkpoint_files.STATE_FILE), framework="pt") as fh:
            for name in checkpoint_files.TENSORS:
                dst = getattr(self, name)
                dst.copy_(fh.get_tensor(name))
                if not bool(torch.isfinite(dst).all()):
                    raise SlideDPError(f"checkpoint {str(directory)!r}: {name} holds non-finite values; refusing "
                                       f"to resume from it")
        self.step = int(meta["optimizer_step"])
        self.refresh_slot()
        return meta
