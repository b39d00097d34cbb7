"""What the model-parallel torchrun scripts share: a tiny GPT that tensor parallelism can shard, its
FLOPs per token by hand, and the paced, logged training loop.

The model keeps q, k, v, o and the MLP as separate ``nn.Linear`` layers (what
``torch.distributed.tensor.parallel`` shards column- and row-wise) and reshapes heads with ``-1``, so the
same code runs whole, sharded over TP ranks (each holding a slice of the heads), or cut into pipeline
stages.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PEAK_FLOPS = 1e10  # a made-up dense peak: CPUs have no table row, and MFU only has to be consistent
RUN_TP = "parallel-tp"
RUN_PP = "parallel-pp"


@dataclass(frozen=True)
class Shape:
    vocab: int = 256
    d: int = 64
    heads: int = 4
    layers: int = 2
    seq: int = 32
    batch: int = 4


def palm_flops_per_token(s: Shape) -> float:
    """6N + 12·L·H·Q·T by hand from the dimensions: N = per layer q, k, v, o (4d²) and a 4x MLP (8d²),
    plus the untied LM head (d·V); embeddings are lookups; H·Q = d."""
    n = s.layers * 12 * s.d * s.d + s.d * s.vocab
    return 6.0 * n + 12.0 * s.layers * s.d * s.seq


class Block(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.head_dim = s.d // s.heads
        self.ln1 = nn.LayerNorm(s.d)
        self.q = nn.Linear(s.d, s.d, bias=False)
        self.k = nn.Linear(s.d, s.d, bias=False)
        self.v = nn.Linear(s.d, s.d, bias=False)
        self.o = nn.Linear(s.d, s.d, bias=False)
        self.ln2 = nn.LayerNorm(s.d)
        self.up = nn.Linear(s.d, 4 * s.d, bias=False)
        self.down = nn.Linear(4 * s.d, s.d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln1(x)
        q, k, v = (proj(h).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.d)
        self.pos = nn.Embedding(s.seq, s.d)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = nn.LayerNorm(s.d)
        self.head = nn.Linear(s.d, s.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(self.norm(x))
        return out


def batch(s: Shape, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(0, s.vocab, (s.batch, s.seq + 1), generator=gen)
    return data[:, :-1], data[:, 1:]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def layout_of(tracker: Any) -> str | None:
    """The tracker's parallel layout as text (None on a babysitter without one)."""
    parallel = getattr(tracker.config, "parallel", None)
    return None if parallel is None else str(parallel)


def train_logged(
    tracker: Any,
    step_fn: Any,
    out_dir: Path,
    *,
    rank: int,
    max_seconds: float,
    pace: float,
    extra: dict[str, Any],
) -> None:
    """Step until ``out_dir/stop`` appears (or ``max_seconds``), ``pace`` s at least per step, logging
    the host time of every ``tracker.step()``; then write ``rank{N}.json``."""
    stop = out_dir / "stop"
    times: list[float] = []
    deadline = time.monotonic() + max_seconds
    (out_dir / f"rank{rank}.url").write_text(str(tracker.metrics_url))
    while True:
        # every rank must take the same number of steps (the steps are collectives): rank 0 decides
        go = torch.tensor([0 if stop.exists() or time.monotonic() > deadline else 1])
        torch.distributed.broadcast(go, src=0)
        if not go.item():
            break
        t0 = time.perf_counter()
        loss = step_fn()
        left = pace - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
        tracker.step(loss=loss)
        times.append(time.time())
    record = {"rank": rank, "steps": times, "layout": layout_of(tracker), "shape": asdict(Shape()), **extra}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))
