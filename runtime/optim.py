"""AdamW on the host, one chunk at a time, with warmup + cosine learning rate and global-norm clipping.

The update of a chunk needs the clip coefficient, which needs the norm of *all* gradients of the step.
Gradient norms are summed on the GPU as each unit's gradient is produced, so the coefficient is known
the moment backward ends; with the default ``next_forward`` schedule the chunk updates then run during
the next step's forward, just before each chunk is streamed in. Clipping is therefore exact, not stale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from slidedp.errors import SlideDPError


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    warmup_steps: int = 0
    total_steps: int = 1000
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        # Every value finite and in a sane range: a NaN weight decay or an lr of 1e300 would write non-finite
        # values into every master weight on the first step.
        values = (self.lr, self.weight_decay, self.beta1, self.beta2, self.eps, self.min_lr_ratio,
                  self.max_grad_norm if self.max_grad_norm is not None else 1.0)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            raise SlideDPError("optimizer: lr, weight decay, betas, eps, min-lr ratio and max grad norm must be finite")
        for name, ok, allowed in (("lr", 0 < self.lr <= 1, "in (0, 1]"),
                                  ("weight_decay", 0 <= self.weight_decay <= 10, "in [0, 10]"),
                                  ("beta1", 0 <= self.beta1 < 1, "in [0, 1)"),
                                  ("beta2", 0 <= self.beta2 < 1, "in [0, 1)"),
                                  ("eps", 0 < self.eps <= 1, "in (0, 1]"),
                                  ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "in [0, 1]"),
                                  ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
                                  ("total_steps", self.total_steps >= 1, ">= 1")):
            if not ok:
                raise SlideDPError(f"optimizer: {name} must be {allowed}, got {getattr(self, name)!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise SlideDPError("optimizer: max_grad_norm must be positive (or omitted)")
        if self.warmup_steps > self.total_steps:
            raise SlideDPError(f"optimizer: warmup_steps {self.warmup_steps} exceeds the schedule's total_steps "
                               f"{self.total_steps} (the learning rate would never reach its peak)")


def lr_at(cfg: OptimConfig, step: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine to min_lr_ratio * lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def clip_coefficient(cfg: OptimConfig, total_norm: float) -> float:
    if cfg.max_grad_norm is None:
        return 1.0
    return min(1.0, cfg.max_grad_norm / (total_norm + 1e-6))


def adamw_chunk_(master: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 step: int, lr: float, cfg: OptimConfig, grad_scale: float,
                 scratch: torch.Tensor | None = None) -> None:
    """Fused CPU AdamW on flat fp32 views. ``grad`` may be bf16: it is upcast into ``scratch`` (reused
    across chunks, so no fresh pages are faulted in per chunk)."""
    if scratch is not None and scratch.numel() >= grad.numel():
        g = scratch[:grad.numel()]
        g.copy_(grad)
    else:
        g = grad.to(torch.float32, copy=True)
    if grad_scale != 1.0:
        g.mul_(grad_scale)
    adamw_tensors_([master], [g], [exp_avg], [exp_avg_sq], step, lr, cfg)


def adamw_tensors_(masters: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                   exp_avg_sqs: list[torch.Tensor], step: int, lr: float, cfg: OptimConfig) -> None:
    """torch's fused AdamW over lists of fp32 tensors on one device (already-scaled gradients): one
    multi-tensor launch for all GPU-held units, one fused loop for a CPU chunk."""
    steps = [torch.tensor(float(step), device=masters[0].device) for _ in masters]
    torch._fused_adamw_(masters, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr, beta1=cfg.beta1,
                        beta2=cfg.beta2, weight_decay=cfg.weight_decay, eps=cfg.eps, amsgrad=False, maximize=False)
