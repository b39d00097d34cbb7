"""The demo's tiny GPT (``babysitter.demo.trainer``) with the helpers tests need for a real CPU loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from babysitter.demo.trainer import TinyConfig, build_model, flops_per_token

__all__ = ["TinyConfig", "TinyGPT", "batches", "palm_flops_per_token", "train_step"]


def TinyGPT(cfg: TinyConfig) -> Any:
    """A tiny GPT-style decoder (the demo's model)."""
    return build_model(cfg)


def palm_flops_per_token(model: Any, seq_len: int) -> float:
    """6N + 12·L·H·Q·T, by hand from the model's parameters (H·Q = n_embd)."""
    return flops_per_token(model, seq_len)


def batches(
    cfg: TinyConfig, batch: int, seq_len: int, seed: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An endless stream of random token batches (inputs, targets)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        data = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=gen)
        yield data[:, :-1], data[:, 1:]


def train_step(model: Any, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One optimizer step; the loss stays a tensor (the tracker reads it off the hot path)."""
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()
