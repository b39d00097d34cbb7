"""Table cells shared by ``babysitter top`` and the demo's live panel, so both read numbers alike."""

from __future__ import annotations

__all__ = ["pct", "secs"]


def pct(value: float | None) -> str:
    """A ratio as a percentage with one decimal; ``-`` when unknown."""
    return "-" if value is None else f"{value:.1%}"


def secs(value: float | None) -> str:
    """A duration in the unit that keeps it short: ms under 1 s, s under 2 min, min under 2 h, then h."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"
