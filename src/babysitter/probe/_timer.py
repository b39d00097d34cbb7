"""Timing a batch of device work: CUDA events around the whole batch, the host clock on CPU.

One synchronization per batch (the end event's), never one per iteration: per-iteration syncs add
launch gaps and make a fast GPU look slow. Repeats keep the best batch, the usual way to measure
what hardware can do on a shared host (other processes only ever make a batch slower).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["best_batch_seconds"]


def best_batch_seconds(
    device: Any, work: Callable[[], object], *, iterations: int, repeats: int, warmup: int | None = None
) -> float:
    """Seconds of the fastest of ``repeats`` batches of ``iterations`` calls of ``work`` on ``device``.

    ``warmup`` calls run first, untimed (default: one call on a CPU, a whole batch on a GPU, whose
    clocks and cuBLAS heuristics need a moment to settle)."""
    import torch

    if iterations < 1 or repeats < 1:
        raise ValueError("iterations and repeats must be at least 1")
    cuda = getattr(device, "type", "") == "cuda"
    if warmup is None:
        warmup = iterations if cuda else 1
    for _ in range(max(0, warmup)):
        work()
    if cuda:
        torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            for _ in range(iterations):
                work()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000.0
        else:
            t0 = time.perf_counter()
            for _ in range(iterations):
                work()
            seconds = time.perf_counter() - t0
        best = min(best, seconds)
    return best
