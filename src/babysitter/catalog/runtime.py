"""Per-rank run health the tracker computes in-process: hangs and stragglers."""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = ["METRICS"]

METRICS: tuple[MetricSpec, ...] = ()
