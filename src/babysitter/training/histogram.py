"""A plain histogram folded off the hot path (no locks of its own: its owner serializes access)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

__all__ = ["Histogram", "HistogramSnapshot"]


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative bucket counts as Prometheus exposes them (``le`` upper bounds, +Inf last)."""

    buckets: tuple[tuple[float, int], ...]
    sum: float
    count: int


class Histogram:
    """Fixed upper bounds; ``observe`` is a bisect and two adds."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be strictly increasing")
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        """Count one value (``le`` semantics: a value equal to a bound falls in that bucket)."""
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self._counts)

    def snapshot(self) -> HistogramSnapshot:
        """The cumulative view."""
        running = 0
        buckets: list[tuple[float, int]] = []
        for bound, count in zip((*self._bounds, float("inf")), self._counts, strict=True):
            running += count
            buckets.append((bound, running))
        return HistogramSnapshot(tuple(buckets), self._sum, running)
