"""MFU arithmetic in one place, so the CLI, the tracker and the tests agree on it."""

from __future__ import annotations

import math

__all__ = ["mfu", "tokens_per_second_for_mfu"]


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the dense peak of the devices that did them.

    ``tokens_per_second`` and ``peak_flops_per_second`` must cover the same devices (one rank's tokens
    and one device's peak, or the job's tokens and the sum of peaks).
    """
    for name, value in (
        ("flops_per_token", flops_per_token),
        ("peak_flops_per_second", peak_flops_per_second),
    ):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, got {value}")
    if not (math.isfinite(tokens_per_second) and tokens_per_second >= 0):
        raise ValueError(f"tokens_per_second must be >= 0 and finite, got {tokens_per_second}")
    return flops_per_token * tokens_per_second / peak_flops_per_second


def tokens_per_second_for_mfu(
    flops_per_token: float, peak_flops_per_second: float, target_mfu: float, *, devices: int = 1
) -> float:
    """Tokens/s the job (``devices`` devices of that peak) must process to reach ``target_mfu``."""
    if not 0 < target_mfu <= 1:
        raise ValueError(f"target_mfu must be in (0, 1], got {target_mfu}")
    if devices <= 0:
        raise ValueError(f"devices must be positive, got {devices}")
    for name, value in (
        ("flops_per_token", flops_per_token),
        ("peak_flops_per_second", peak_flops_per_second),
    ):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, got {value}")
    return target_mfu * peak_flops_per_second * devices / flops_per_token
