"""Optimizer state of the leading units held on the GPU (``Policy.gpu_state_units``).

When GPU memory is to spare, the cheapest CPU update and the cheapest PCIe copy are the ones that never
happen: these units keep bf16 weights, fp32 master weights and Adam moments on the device and are updated
there, once the global gradient norm is known. The host state stays the authoritative copy on disk: it is
loaded from at the first step (or after a resume) and written back before every checkpoint or export.
"""

from __future__ import annotations

import torch

from slidedp.runtime.comm import Comm
from slidedp.runtime.device import Device
from slidedp.runtime.optim import OptimConfig, adamw_tensors_
from slidedp.runtime.streaming import DeviceUnit
from slidedp.runtime.tracing import TraceRecorder


class GpuOptimizerState:
    """fp32 master, exp_avg, exp_avg_sq and bf16 weights of units ``0..k-1`` on one device.

    Every data-parallel rank holds the same replica: the units' gradients are all-reduced, so identical
    deterministic updates keep the replicas equal, and rank 0 alone writes them back to the shared host state.
    """

    def __init__(self, units: list, count: int, device: torch.device, compute_dtype: torch.dtype):
        self.units = units[:count]
        self.device, self.cdt = device, compute_dtype
        self.master: list[torch.Tensor] = []
        self.exp_avg: list[torch.Tensor] = []
        self.exp_avg_sq: list[torch.Tensor] = []
        self.weights: list[torch.Tensor] = []  # bf16 flats the forward and backward read
        self.loaded_step: int | None = None  # host.step the replica matches; None: not loaded yet

    @classmethod
    def from_tensors(cls, masters: list[torch.Tensor], compute_dtype: torch.dtype) -> GpuOptimizerState:
        """A state over given fp32 master tensors with zero moments (what slidedp calibrate times)."""
        state = cls([], 0, masters[0].device, compute_dtype)
        state.master = masters
        state.exp_avg = [torch.zeros_like(t) for t in masters]
        state.exp_avg_sq = [torch.zeros_like(t) for t in masters]
        state.weights = [t.to(compute_dtype) for t in masters]
        state.loaded_step = 0
        return state

    def __len__(self) -> int:
        return len(self.units)

    def load(self, host, step: int) -> None:
        """Copy the units' state from the host state (first step, or the host was reloaded from a checkpoint)."""
        dev = self.device
        self.master, self.exp_avg, self.exp_avg_sq, self.weights = [], [], [], []
        for unit in self.units:
            lo, hi = unit.offset, unit.offset + unit.numel
            master, m, v = host.read_fp32(lo, hi)  # compact host state is widened: these units keep fp32 state
            master = master.to(dev)
            self.master.append(master)
            self.exp_avg.append(m.to(dev))
            self.exp_avg_sq.append(v.to(dev))
            self.weights.append(master.to(self.cdt))
        self.loaded_step = step

    def update_all(self, grads: list[torch.Tensor], step: int, lr: float, cfg: OptimConfig, coef: float) -> None:
        """AdamW of every held unit with its fp32 gradient (scaled in place by the clip coefficient), then
        refresh the bf16 weights: a few multi-tensor launches for all units."""
        if coef != 1.0:
            torch._foreach_mul_(grads, coef)
        adamw_tensors_(self.master, grads, self.exp_avg, self.exp_avg_sq, step, lr, cfg)
        with torch.no_grad():
            for weights, master in zip(self.weights, self.master, strict=True):
                with torch.autograd._unsafe_preserve_version_counter(weights):
                    weights.copy_(master)

    def release(self) -> None:
        """Free the device copies (the engine is closing; call write_back first to keep them)."""
        self.master, self.exp_avg, self.exp_avg_sq, self.weights = [], [], [], []
        self.loaded_step = None

    def write_back(self, host) -> None:
        """Make the host state authoritative again (before a checkpoint, an export, the end of training)."""
        for u, unit in enumerate(self.units):
            lo, hi = unit.offset, unit.offset + unit.numel
            if host.precision.is_exact:
                host.master[lo:hi].copy_(self.master[u])
                host.exp_avg[lo:hi].copy_(self.exp_avg[u])
                host.exp_avg_sq[lo:hi].copy_(self.exp_avg_sq[u])
                host.slot[lo:hi].copy_(self.weights[u])
            else:  # rounded into the compact host state (the replica itself stays fp32 until reloaded)
                host.write_fp32(lo, hi, self.master[u].cpu(), self.exp_avg[u].cpu(), self.exp_avg_sq[u].cpu())


class GpuHeldUnits:
    """The engine's view of the GPU-state units over one step.

    Lifecycle: ``sync`` (re)loads the replica when the host state is not what it was built from;
    ``unit(u)`` serves the weights instead of a fetch; ``take_grad`` all-reduces a unit's whole gradient
    over the ranks (every replica must apply the same update) and adds it to the norm; once the global norm
    is known ``update`` applies AdamW on the device (or ``drop_grads`` on a skipped step); ``write_back``
    makes the host state authoritative before a checkpoint.
    """

    def __init__(self, units: list, count: int, device: Device, compute_dtype: torch.dtype,
                 recorder: TraceRecorder, comm: Comm):
        self.state = GpuOptimizerState(units, count, device.torch_device, compute_dtype)
        self.device, self.recorder, self.comm = device, recorder, comm
        self._units: dict[int, DeviceUnit] = {}
        self._grads: dict[int, torch.Tensor] = {}  # this step's fp32 gradients
        self._norm_sq: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.state)

    def holds(self, u: int) -> bool:
        return u < len(self.state)

    def sync(self, host) -> None:
        """(Re)load the GPU-held units from the host state when it is not what the replica was built from."""
        if len(self.state) and self.state.loaded_step != host.step:
            self.state.load(host, host.step)
            self._units = {u: DeviceUnit(self.state.units[u], w, persistent=True)
                           for u, w in enumerate(self.state.weights)}

    def unit(self, u: int) -> DeviceUnit | None:
        return self._units.get(u)

    def begin_step(self) -> None:
        self._norm_sq = torch.zeros((), dtype=torch.float32, device=self.device.torch_device)
        self._grads = {}

    def take_grad(self, u: int, gflat: torch.Tensor) -> None:
        """Reduce over ranks, add to the norm, keep for the update."""
        comm = self.comm
        if comm.active:
            with self.recorder.span("link", "allreduce", u, nbytes=2 * gflat.numel() * gflat.element_size()
                                    * (comm.world - 1) / comm.world):
                comm.all_reduce_(gflat)
        self._norm_sq += torch.linalg.vector_norm(gflat).square()
        self._grads[u] = gflat

    def norm_sq(self) -> float:
        """Squared norm of this step's GPU-held gradients: all-reduced whole, the same on every rank."""
        return float(self._norm_sq.item()) if self._grads else 0.0

    def drop_grads(self) -> None:
        """A skipped step: the units keep their weights, their update simply does not happen."""
        self._grads = {}

    def update(self, step: int, lr: float, cfg: OptimConfig, coef: float) -> None:
        if not self._grads:
            return
        with self.recorder.span("gpu", "gpu_adam", 0):
            self.state.update_all([self._grads[u] for u in range(len(self.state))], step, lr, cfg, coef)
        self.state.loaded_step = step
        self._grads = {}

    def write_back(self, host, rank: int) -> None:
        """Rank 0 copies the replica into the shared host state (all ranks hold the same one)."""
        if self.state.loaded_step is not None and rank == 0:
            self.state.write_back(host)

    def close(self) -> None:
        self.state.release()
        self._units, self._grads = {}, {}
