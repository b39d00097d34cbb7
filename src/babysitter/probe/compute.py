"""Per-device dense matmul throughput against the peak table: bf16 on GPUs, fp32 on CPUs.

A square ``n x n`` matmul does ``2 n^3`` FLOPs. ``n`` defaults to 8192 on GPUs (large enough to
reach the tensor cores' steady state, ~1 ms per matmul on an H100) and 1024 on CPUs. The ratio to
the dense peak (babysitter.hardware) is reported when the table knows the device; a CPU has no row,
so it gets a throughput and no ratio, never a guessed peak.

``delay_seconds`` sleeps after every matmul launch: a test knob that makes one rank a lemon on
purpose (``babysitter probe --test-slow-rank``). On a GPU the sleep stalls the launch queue, so it
slows the device as long as the sleep exceeds one matmul's time.
"""

from __future__ import annotations

import time
from typing import Any

from babysitter.probe._timer import best_batch_seconds
from babysitter.probe.results import MatmulResult

__all__ = ["measure_matmul", "probe_dtype"]


def probe_dtype(device: Any) -> str:
    """The dtype key the probe uses on ``device``: bf16 on accelerators, fp32 on CPUs."""
    return "fp32" if getattr(device, "type", "cpu") == "cpu" else "bf16"


def measure_matmul(
    device: Any,
    *,
    name: str,
    n: int,
    iterations: int,
    repeats: int,
    delay_seconds: float = 0.0,
) -> MatmulResult:
    """Best ``n x n`` matmul throughput on ``device`` over ``repeats`` batches of ``iterations``."""
    import torch

    if n < 1:
        raise ValueError(f"matmul size must be positive, got {n}")
    key = probe_dtype(device)
    dtype = torch.float32 if key == "fp32" else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def work() -> None:
        torch.mm(a, b, out=out)
        if delay_seconds > 0:
            time.sleep(delay_seconds)

    seconds = best_batch_seconds(device, work, iterations=iterations, repeats=repeats)
    result = MatmulResult(dtype=key, n=n, iterations=iterations)
    result.flops_per_second = 2.0 * n**3 * iterations / seconds if seconds > 0 else None
    if getattr(device, "type", "cpu") != "cpu":
        from babysitter.hardware import lookup_peak

        entry = lookup_peak(name, key)
        if entry is not None:
            result.peak_flops_per_second = entry.flops_per_second
            result.peak_device = entry.device
            result.peak_source = entry.source
    return result
