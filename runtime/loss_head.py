"""The loss head: final norm, output projection and cross-entropy, one token chunk at a time.

Full logits ([tokens, vocab]) would be the largest activation of a step; computing them per chunk of
``Policy.loss_chunk_tokens`` tokens, with the chunk's backward right away, bounds them to one chunk. The
head so produces, in forward, the loss, the gradient w.r.t. its input (the last layer's output) and its
own parameter gradients: it is the first unit of backward and never has to be fetched twice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call


class LossHead:
    def __init__(self, norm_module: nn.Module, chunk_tokens: int):
        self.norm_module, self.chunk_tokens = norm_module, chunk_tokens

    def run(self, hidden: list[torch.Tensor], labels: list[torch.Tensor], wn: torch.Tensor, w_out: torch.Tensor,
            inv_tokens: float, grads: dict[str, torch.Tensor], loss_total: torch.Tensor) -> list[torch.Tensor]:
        """Every micro-batch: add its loss to ``loss_total`` and the gradients of the norm weight ``wn`` and
        the output matrix ``w_out`` to ``grads["norm"]`` and ``grads["out"]`` (fp32 flats); returns the
        gradients w.r.t. ``hidden`` per micro-batch."""
        grad_out = []
        for h, lab in zip(hidden, labels, strict=True):
            loss, g = self.loss_and_grads(h, lab, wn, w_out, inv_tokens, grads)
            loss_total += loss
            grad_out.append(g)
        return grad_out

    def loss_and_grads(self, h: torch.Tensor, labels: torch.Tensor, wn: torch.Tensor, w_out: torch.Tensor,
                       inv_tokens: float, grads: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunked fused linear cross-entropy: loss and gradients of a micro-batch, one token chunk at a time."""
        hidden = h.reshape(-1, h.shape[-1])
        flat_labels = labels.reshape(-1)
        grad_h = torch.empty_like(hidden)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        step = self.chunk_tokens
        for s in range(0, hidden.shape[0], step):
            hc = hidden[s:s + step].detach().requires_grad_()
            with torch.enable_grad():
                normed = functional_call(self.norm_module, {"weight": wn}, (hc,))
                logits = F.linear(normed, w_out)
                loss = F.cross_entropy(logits.float(), flat_labels[s:s + step], reduction="sum") * inv_tokens
                g_h, g_wn, g_out = torch.autograd.grad(loss, [hc, wn, w_out])
            grad_h[s:s + step] = g_h
            grads["norm"].add_(g_wn.reshape(-1).float())
            grads["out"].add_(g_out.reshape(-1).float())
            total += loss.detach()
        return total, grad_h.view_as(h)

    def loss_sum(self, h: torch.Tensor, labels: torch.Tensor, wn: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
        """Summed token loss of a micro-batch without gradients (eval), in the same token chunks."""
        hidden = h.reshape(-1, h.shape[-1])
        flat_labels = labels.reshape(-1)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.no_grad():
            for s in range(0, hidden.shape[0], self.chunk_tokens):
                normed = functional_call(self.norm_module, {"weight": wn}, (hidden[s:s + self.chunk_tokens],))
                logits = F.linear(normed, w_out)
                total += F.cross_entropy(logits.float(), flat_labels[s:s + self.chunk_tokens], reduction="sum")
        return total
