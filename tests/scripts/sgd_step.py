"""The hand-written data-parallel step the lockstep test jobs share: one all_reduce of every gradient
a step (the collective whose arrival, hang or crash those tests watch), then plain SGD."""

from __future__ import annotations

import torch
import torch.distributed as dist


def allreduce_sgd_step(model: torch.nn.Module, world: int, lr: float = 0.01) -> None:
    """Average the gradients over the ``world`` ranks in one flat all_reduce, step, clear them."""
    flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    dist.all_reduce(flat)
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            n = p.numel()
            p.sub_(lr * flat[offset : offset + n].view_as(p) / world)
            offset += n
            p.grad = None
