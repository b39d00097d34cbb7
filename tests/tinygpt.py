"""A tiny GPT-style decoder in plain torch, for tests that need a real training loop on CPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TinyConfig:
    """GPT-2-style hyperparameters (attribute names as in Hugging Face's GPT2Config)."""

    vocab_size: int = 256
    n_positions: int = 64
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))

    def non_embedding_params(self) -> int:
        """N in PaLM's 6N: every parameter but the token and position embeddings (LM head counted)."""
        return sum(p.numel() for name, p in self.named_parameters() if not name.startswith(("wte", "wpe")))


def palm_flops_per_token(model: TinyGPT, seq_len: int) -> float:
    """6N + 12·L·H·Q·T, computed by hand from the model (H·Q = n_embd)."""
    cfg = model.config
    return 6 * model.non_embedding_params() + 12 * cfg.n_layer * cfg.n_embd * seq_len


def batches(cfg: TinyConfig, batch: int, seq_len: int, seed: int = 0):  # type: ignore[no-untyped-def]
    """An endless stream of random token batches (inputs, targets)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        data = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=gen)
        yield data[:, :-1], data[:, 1:]


def train_step(model: TinyGPT, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()
