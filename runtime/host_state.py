"""The one authoritative copy of the training state, in host memory.

Per parameter: fp32 master weight, Adam m and v (12 B) and one slot in the compute dtype (2 B for
bf16) that holds the new weights between the update and the next H2D, and the gradient between its
D2H and the update. The two uses never overlap (a unit's backward re-fetch precedes its gradient), so
the state is 14 B/param. Each tensor is one allocation, registered with CUDA as pinned memory where a
GPU is used, so PyTorch's power-of-two pinned-allocator rounding never applies.

Compact state (slidedp.state_precision, Policy.state): the moments may be bf16, or int8 (m) / uint8 (v)
codes with one fp32 absmax scale per block of INT8_BLOCK elements counted from each unit's start; a bf16
master is itself the slot the GPU streams (``slot is master``), and the gradient then lands in a buffer of
its own. runtime/compact_adam.py says how these are updated and rounded.

Under the ``sharded`` host layout (several hosts) a host keeps master and moments only of its share of the
parameters (``share``: flat ranges and where each sits in the packed tensors, from runtime.chunks.ChunkTable)
and the slot of all of them: then 12/H + 2 B/param (exact fp32 state only).
"""

from __future__ import annotations

import os
import signal
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import torch

from slidedp.errors import SlideDPError
from slidedp.runtime import checkpoint_files
from slidedp.runtime.compact_adam import CompactRange, load_moments, store_moments
from slidedp.runtime.hf_adapter import ModelAdapter
from slidedp.runtime.shared_dir import SharedDir
from slidedp.state_precision import EXACT, INT8_BLOCK, StatePrecision, unit_block_starts

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
    t = torch.from_file(str(shared.check_file(name, nbytes)), shared=True, size=numel, dtype=dtype) if numel else \
        torch.empty(0, dtype=dtype)
    if pin:
        _register(t)
    return t


def _share_numel(share: list[tuple[int, int, int]] | None, numel: int) -> int:
    return numel if share is None else sum(hi - lo for lo, hi, _ in share)


def _needs_grads(precision: StatePrecision, slot_dtype: torch.dtype, grad_dtype: torch.dtype) -> bool:
    """StatePrecision.needs_grad_buffer for these dtypes: the memory model counts the same buffers."""
    return precision.needs_grad_buffer(grad_dtype.itemsize, slot_dtype.itemsize)


def host_buffer(numel: int, dtype: torch.dtype, pin: bool = False) -> torch.Tensor:
    """A zeroed host buffer whose pages are touched now, by torch's intra-op threads in equal contiguous parts
    (buffers under 32,768 elements by one), not during the first copy. On a host with several memory nodes the
    pages are so spread over the threads' nodes; a buffer filled by one thread (torch.randn) lies on one node,
    and a pass over it can be slower. Benchmarks that price the runtime's passes allocate here for that reason
    (on the lent H100's host, 2026-12-06, the exact update timed 4.3 G params/s with its master from torch.randn
    and ran at 5.2 inside training steps over these; how much of that is placement is to be measured:
    benchmarks.compact_state rates --first-touch)."""
    t = torch.empty(numel, dtype=dtype)
    t.zero_()
    if pin:
        _register(t)
    return t


def placed_copy(values: torch.Tensor) -> torch.Tensor:
    """``values`` (flattened) in a :func:`host_buffer`: a benchmark's data on pages placed as the runtime's, not
    where the one thread that made them (torch.randn) put them."""
    t = host_buffer(values.numel(), values.dtype)
    t.copy_(values.reshape(-1))
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
    slot: torch.Tensor  # the weight/gradient slot in the compute dtype (see the class docstring); a bf16 master
    grads: torch.Tensor | None  # separate gradient buffer when the gradient dtype differs from the slot's
    pinned: bool
    step: int = 0  # optimizer steps applied
    # Data parallel only: per (unit, chunk, owner rank), the last optimizer step applied to that range, so a
    # rank streams a chunk only once every owner has updated it; and each rank's gradient landing buffer.
    flags: torch.Tensor | None = None
    landing: list[torch.Tensor] | None = None
    precision: StatePrecision = EXACT
    exp_avg_scale: torch.Tensor | None = None  # 8-bit moments: fp32 absmax per block
    exp_avg_sq_scale: torch.Tensor | None = None
    unit_offsets: list[int] = field(default_factory=lambda: [0])  # flat offset of each unit (the 8-bit blocks)
    block_starts: list[int] = field(default_factory=lambda: [0])  # unit_block_starts of the units
    # Sharded host layout: (flat lo, flat hi, packed lo) of each part whose master and moments this host keeps;
    # None: it keeps all of them, at their flat positions. Exact fp32 state only (see _check).
    share: list[tuple[int, int, int]] | None = None

    @staticmethod
    def _dtypes(precision: StatePrecision) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
        """Storage dtypes of master, exp_avg and exp_avg_sq."""
        master = torch.bfloat16 if precision.master == "bf16" else torch.float32
        if precision.moments == "int8":
            return master, torch.int8, torch.uint8
        moments = torch.bfloat16 if precision.moments == "bf16" else torch.float32
        return master, moments, moments

    @staticmethod
    def check_share_precision(precision: StatePrecision) -> None:
        """A host that keeps only its share of master and moments (host_layout sharded) keeps them exact."""
        if not precision.is_exact:
            raise SlideDPError(f"state {precision.name} with host_layout sharded across hosts is not supported: "
                               f"use --state fp32 or host_layout replicated")

    @staticmethod
    def _check(precision: StatePrecision, slot_dtype: torch.dtype, share) -> None:
        if share is not None:
            HostState.check_share_precision(precision)
        if precision.master_streams and slot_dtype != torch.bfloat16:
            raise SlideDPError(f"state {precision.name}: a bf16 master is the weight the device reads, so the "
                               f"compute dtype must be bf16 (use --dtype bf16 or auto)")

    @classmethod
    def allocate(cls, numel: int, slot_dtype: torch.dtype, grad_dtype: torch.dtype, pin: bool,
                 precision: StatePrecision = EXACT, unit_numels: list[int] | None = None,
                 share: list[tuple[int, int, int]] | None = None) -> HostState:
        """The state of ``numel`` parameters; ``unit_numels`` (summing to numel) place the 8-bit blocks;
        ``share``: the parts whose master and moments this host keeps (sharded host layout)."""
        cls._check(precision, slot_dtype, share)
        if share is not None:
            grads = host_buffer(numel, grad_dtype, pin) if _needs_grads(precision, slot_dtype, grad_dtype) else None
            state_numel = _share_numel(share, numel)
            return cls(host_buffer(state_numel, torch.float32, pin), host_buffer(state_numel, torch.float32, pin),
                       host_buffer(state_numel, torch.float32, pin), host_buffer(numel, slot_dtype, pin), grads,
                       pin, share=share)
        unit_numels = list(unit_numels) if unit_numels is not None else [numel]
        md, qm, qv = cls._dtypes(precision)
        master = host_buffer(numel, md, pin)
        slot = master if precision.master_streams else host_buffer(numel, slot_dtype, pin)
        grads = host_buffer(numel, grad_dtype, pin) if _needs_grads(precision, slot_dtype, grad_dtype) else None
        state = cls(master, host_buffer(numel, qm, pin), host_buffer(numel, qv, pin), slot, grads, pin,
                    precision=precision)
        state._place_blocks(unit_numels)
        if precision.moments == "int8":
            blocks = state.block_starts[-1]
            state.exp_avg_scale, state.exp_avg_sq_scale = host_buffer(blocks, torch.float32, pin), \
                host_buffer(blocks, torch.float32, pin)
        return state

    @classmethod
    def allocate_shared(cls, shared: SharedDir, numel: int, slot_dtype: torch.dtype, grad_dtype: torch.dtype,
                        pin: bool, create: bool, flags: int, world: int, landing_numel: int,
                        precision: StatePrecision = EXACT, unit_numels: list[int] | None = None,
                        share: list[tuple[int, int, int]] | None = None) -> HostState:
        """The one state all ranks of a host share, in files of ``shared`` (local rank 0 creates them first)."""
        def file(name: str, n: int, dtype: torch.dtype, pinned: bool = pin) -> torch.Tensor:
            return _shared(shared, name, n, dtype, create, pinned)

        cls._check(precision, slot_dtype, share)
        if share is not None:
            grads = file("grads.bin", numel, grad_dtype) if _needs_grads(precision, slot_dtype, grad_dtype) else None
            state_numel = _share_numel(share, numel)
            state = cls(file("master.bin", state_numel, torch.float32),
                        file("exp_avg.bin", state_numel, torch.float32),
                        file("exp_avg_sq.bin", state_numel, torch.float32), file("slot.bin", numel, slot_dtype),
                        grads, pin, share=share)
            state.flags = file("flags.bin", flags, torch.int64, False)
            if landing_numel:
                state.landing = [file(f"landing_{r}.bin", landing_numel, grad_dtype) for r in range(world)]
            return state
        unit_numels = list(unit_numels) if unit_numels is not None else [numel]
        md, qm, qv = cls._dtypes(precision)
        master = file("master.bin", numel, md)
        slot = master if precision.master_streams else file("slot.bin", numel, slot_dtype)
        grads = file("grads.bin", numel, grad_dtype) if _needs_grads(precision, slot_dtype, grad_dtype) else None
        state = cls(master, file("exp_avg.bin", numel, qm), file("exp_avg_sq.bin", numel, qv), slot, grads, pin,
                    precision=precision)
        state._place_blocks(unit_numels)
        if precision.moments == "int8":
            blocks = state.block_starts[-1]
            state.exp_avg_scale = file("exp_avg_scale.bin", blocks, torch.float32)
            state.exp_avg_sq_scale = file("exp_avg_sq_scale.bin", blocks, torch.float32)
        state.flags = file("flags.bin", flags, torch.int64, False)
        if landing_numel:
            state.landing = [file(f"landing_{r}.bin", landing_numel, grad_dtype) for r in range(world)]
        return state

    def _place_blocks(self, unit_numels: list[int]) -> None:
        if sum(unit_numels) != self.master.numel():
            raise SlideDPError(f"unit sizes sum to {sum(unit_numels)}, the state holds {self.master.numel()}")
        self.unit_offsets = [0]
        for n in unit_numels[:-1]:
            self.unit_offsets.append(self.unit_offsets[-1] + n)
        self.block_starts = unit_block_starts(unit_numels)

    @property
    def grad_buffer(self) -> torch.Tensor:
        """Where a gradient waits for its update: the slot itself when the gradient has the slot's dtype."""
        return self.slot if self.grads is None else self.grads

    def _tensors(self) -> list[torch.Tensor]:
        """Every distinct host buffer of the state (a bf16 master is also the slot)."""
        found: list[torch.Tensor] = []
        for t in (self.master, self.exp_avg, self.exp_avg_sq, self.slot, self.grads, self.exp_avg_scale,
                  self.exp_avg_sq_scale):
            if t is not None and all(t is not f for f in found):
                found.append(t)
        return found

    def bytes_per_param(self) -> float:
        """Bytes this host holds per parameter of the model (less than 14 when it keeps only a share)."""
        return sum(t.numel() * t.element_size() for t in self._tensors()) / self.slot.numel()

    def total_bytes(self) -> int:
        return int(self.bytes_per_param() * self.slot.numel())

    def refresh_slot(self) -> None:
        """The slot from the master weights this host keeps (under ``share``, only its parts: the other hosts'
        parts arrive by the weight all-gather; a bf16 master is the slot itself)."""
        if self.share is None:
            if self.slot is not self.master:
                self.slot.copy_(self.master)
            return
        for lo, hi, packed in self.share:
            self.slot[lo:hi].copy_(self.master[packed:packed + hi - lo])

    def restore_weights(self, lo: int, hi: int) -> None:
        """Put the unchanged weights of [lo, hi) back in the slot (it held a gradient that is not applied)."""
        if self.slot is not self.master:
            self.slot[lo:hi].copy_(self.master[lo:hi])

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
            for t in [*self._tensors(), *(self.landing or [])]:
                if t.numel():
                    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
            self.pinned = False

    # ---- compact state: ranges, reads and writes in fp32 ----------------------------------------------------
    def block_index(self, lo: int) -> int:
        """Index of the 8-bit block that starts at flat element ``lo`` (a chunk or shard start)."""
        u = bisect_right(self.unit_offsets, lo) - 1
        local = lo - self.unit_offsets[u]
        if local % INT8_BLOCK:
            raise SlideDPError(f"range start {lo} is not on an 8-bit block boundary of its unit")
        return self.block_starts[u] + local // INT8_BLOCK

    def range(self, lo: int, hi: int) -> CompactRange:
        """Views of [lo, hi) for the compact update (the streamed weights go to the slot unless it is the
        master)."""
        scales = (None, None)
        if self.exp_avg_scale is not None:
            b0, b1 = self.block_index(lo), self.block_index(lo) + -(-(hi - lo) // INT8_BLOCK)
            scales = (self.exp_avg_scale[b0:b1], self.exp_avg_sq_scale[b0:b1])
        weights = None if self.slot is self.master else self.slot[lo:hi]
        return CompactRange(self.master[lo:hi], self.exp_avg[lo:hi], self.exp_avg_sq[lo:hi], *scales,
                            self.grad_buffer[lo:hi], weights, lo)

    def read_fp32(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Master, m and v of [lo, hi) in fp32 (new tensors)."""
        r = self.range(lo, hi)
        m, v = load_moments(r)  # fp32 moments come back as views of the state itself: copy them
        if m.data_ptr() == r.exp_avg.data_ptr():
            m, v = m.clone(), v.clone()
        return r.master.to(torch.float32, copy=True), m, v

    def write_fp32(self, lo: int, hi: int, master: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
        """Store fp32 master, m and v into [lo, hi) (nearest-even into bf16, blockwise into 8-bit) and refresh
        the slot: GPU-held units writing back."""
        r = self.range(lo, hi)
        r.master.copy_(master)
        store_moments(r, m.to(torch.float32), v.to(torch.float32), None)
        if r.weights is not None:
            r.weights.copy_(master)

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
            elif dest.dtype != torch.float32:  # a bf16 master: the same numbers, rounded to nearest
                gen = torch.Generator().manual_seed(seed * 100_003 + unit.index)
                tmp = torch.empty(unit.numel, dtype=torch.float32)
                adapter.init_unit_(unit, tmp, gen)
                dest.copy_(tmp)
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
        """Atomically write master, m, v (and 8-bit scales) in their native dtypes and ``meta``
        (runtime.checkpoint_files: temp directory, fsync, rename, digest), so a crash, a kill or a full disk
        mid-write leaves the previous checkpoint untouched."""
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

        names = checkpoint_files.tensor_names(self.precision)
        checkpoint_files.write(Path(directory), {name: getattr(self, name) for name in names},
                               {**meta, "optimizer_step": self.step, "state": self.precision.name},
                               before_meta=fault_point)

    def load(self, directory: Path) -> dict:
        """Fill master, m and v from a checkpoint that :func:`checkpoint_files.verify` accepts; non-finite
        values are refused (a resumed NaN would skip every later step). Under ``share`` the checkpoint is this
        host's share and only its parts of the slot are refreshed (the engine all-gathers the rest)."""
        from safetensors import safe_open

        directory = Path(directory)
        meta = checkpoint_files.verify(directory, self.master.numel(), self.precision)
        with safe_open(str(directory / checkpoint_files.STATE_FILE), framework="pt") as fh:
            for name in checkpoint_files.tensor_names(self.precision):
                dst = getattr(self, name)
                src = fh.get_tensor(name)
                if src.shape != dst.shape or src.dtype != dst.dtype:
                    raise SlideDPError(f"checkpoint {str(directory)!r}: {name} is {src.dtype} {tuple(src.shape)}, "
                                       f"this state needs {dst.dtype} {tuple(dst.shape)}")
                dst.copy_(src)
                if dst.is_floating_point() and not bool(torch.isfinite(dst).all()):
                    raise SlideDPError(f"checkpoint {str(directory)!r}: {name} holds non-finite values; refusing "
                                       f"to resume from it")
        self.step = int(meta["optimizer_step"])
        self.refresh_slot()
        return meta
