"""Shared bits of the integration tests: tiny Hugging Face models from configs, reading a registry."""

from __future__ import annotations

from typing import Any

import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["TOKEN_BATCH", "random_token_batches", "sample_value", "samples", "tiny_gpt2", "token_loader"]

TOKEN_BATCH = (4, 16)  # (batch, sequence length) of every training micro-batch


def tiny_gpt2() -> Any:
    """A 2-layer GPT-2 built from its config (no download), small enough for CPU tests."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def random_token_batches(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``count`` dict batches of random token ids, labels = inputs (causal LM)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(0, 128, TOKEN_BATCH, generator=gen)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def token_loader(count: int, seed: int = 0) -> torch.utils.data.DataLoader[Any]:
    """A DataLoader of ``count`` collated dict batches of shape :data:`TOKEN_BATCH`."""
    rows = [
        {k: v[i] for k, v in batch.items()}
        for batch in random_token_batches(count, seed)
        for i in range(TOKEN_BATCH[0])
    ]
    return torch.utils.data.DataLoader(rows, batch_size=TOKEN_BATCH[0])  # type: ignore[arg-type]


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a registry as exposed on /metrics (text format round trip)."""
    from prometheus_client import generate_latest

    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample_value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    """The value of the one sample ``name`` whose labels include ``labels``; None when absent."""
    found = [
        v
        for (n, lbl), v in samples(registry).items()
        if n == name and all(dict(lbl).get(k) == want for k, want in labels.items())
    ]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None
