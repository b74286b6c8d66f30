"""Optimizer state of the leading units held on the GPU (``Policy.gpu_state_units``).

When GPU memory is to spare, the cheapest CPU update and the cheapest PCIe copy are the ones that never
happen: these units keep bf16 weights, fp32 master weights and Adam moments on the device and are updated
there, once the global gradient norm is known. The host state stays the authoritative copy on disk: it is
loaded from at the first step (or after a resume) and written back before every checkpoint or export.
"""

from __future__ import annotations

import torch

from slidedp.runtime.optim import OptimConfig, adamw_tensors_


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
            master = host.master[lo:hi].to(dev, dtype=torch.float32, copy=True)
            self.master.append(master)
            self.exp_avg.append(host.exp_avg[lo:hi].to(dev, dtype=torch.float32, copy=True))
            self.exp_avg_sq.append(host.exp_avg_sq[lo:hi].to(dev, dtype=torch.float32, copy=True))
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
            host.master[lo:hi].copy_(self.master[u])
            host.exp_avg[lo:hi].copy_(self.exp_avg[u])
            host.exp_avg_sq[lo:hi].copy_(self.exp_avg_sq[u])
            host.slot[lo:hi].copy_(self.weights[u])
