"""Where on the time axis badput happened, for the report's timeline plot.

The accounting gives exact totals; this gives positions: downtime between incarnations, startup up to
the first step, checkpoint and phase intervals, hangs, and the stretch of each incarnation whose steps
were later computed again (lost progress). Data stalls are spread over steps and have no position.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from babysitter.ledger.accounting import Accountant
from babysitter.ledger.timeline import Incarnation

__all__ = ["Span", "StepPoint", "badput_spans", "step_points"]

US = 1_000_000


@dataclass(frozen=True)
class Span:
    """``[begin, end)`` in Unix seconds attributed to ``cause``."""

    begin: float
    end: float
    cause: str


@dataclass(frozen=True)
class StepPoint:
    """Mean step time and MFU over one progress record."""

    time: float
    step_seconds: float
    mfu: float | None


def _stops(accountant: Accountant, now: float | None, live: bool) -> list[int]:
    incs = accountant.timeline.incarnations
    out = []
    for i, inc in enumerate(incs):
        if i + 1 < len(incs):
            out.append(max(inc.begin, min(inc.last_t, incs[i + 1].begin)))
        elif live and inc.end is None and now is not None:
            out.append(max(inc.last_t, round(now * US)))
        else:
            out.append(inc.last_t)
    return out


def badput_spans(accountant: Accountant, *, now: float | None = None, live: bool = False) -> list[Span]:
    """Positioned badput, in time order per kind (overlaps possible between kinds)."""
    incs = accountant.timeline.incarnations
    stops = _stops(accountant, now, live)
    thresholds = accountant.thresholds()
    spans: list[Span] = []
    for i, inc in enumerate(incs):
        stop = stops[i]
        first = inc.ends[0] if inc.n else stop
        spans.append(Span(inc.begin / US, min(first, stop) / US, "startup"))
        for a, b, cause in inc.pieces(stop):
            spans.append(Span(a / US, b / US, cause))
        for j in sorted(inc.hang_gaps()):
            g0 = inc.begin if j == 0 else inc.ends[j - 1]
            g1 = inc.ends[j] if j < inc.n else stop
            spans.append(Span(g0 / US, g1 / US, "hang"))
        spans += _lost(inc, thresholds[i], stop)
        if i + 1 < len(incs) and incs[i + 1].begin > stop:
            spans.append(Span(stop / US, incs[i + 1].begin / US, "downtime"))
        elif i + 1 == len(incs) and not live and inc.end is None and now is not None and now * US > stop:
            spans.append(Span(stop / US, now, "downtime"))
    return [sp for sp in spans if sp.end > sp.begin]


def _lost(inc: Incarnation, thresholds: list[int], stop: int) -> list[Span]:
    if not inc.n:
        return []
    split_times = [t for t, _ in inc.splits()]
    bounds = [inc.ends[0], *split_times, stop]
    out = []
    for seg, threshold in enumerate(thresholds):
        lo, hi = bounds[seg], bounds[seg + 1]
        a = bisect_right(inc.ends, lo)
        b = bisect_right(inc.ends, hi)
        first_lost = next((j for j in range(max(a, 1), b) if inc.steps[j] > threshold), None)
        if first_lost is not None:
            out.append(Span(inc.ends[first_lost - 1] / US, hi / US, "lost_progress"))
        elif seg == len(thresholds) - 1 and (inc.end is None or not inc.end.clean) and inc.ends[-1] < stop:
            out.append(Span(inc.ends[-1] / US, stop / US, "lost_progress"))
    return out


def step_points(inc: Incarnation, max_points: int = 4000) -> list[StepPoint]:
    """Mean step time and MFU per progress record of ``inc`` (binned down to ``max_points``)."""
    points = []
    for p in inc.points:
        if p.i1 - p.i0 < 1 or (p.i0 == 0 and p.i1 - p.i0 < 2):
            continue
        lo = p.i0 - 1 if p.i0 > 0 else p.i0
        n = p.i1 - 1 - lo
        span = inc.ends[p.i1 - 1] - inc.ends[lo]
        if n <= 0 or span <= 0:
            continue
        mfu = None
        if p.peak_flops and p.model_flops > 0:
            mfu = p.model_flops / (span / US) / p.peak_flops
        points.append(StepPoint(inc.ends[p.i1 - 1] / US, span / n / US, mfu))
    if len(points) <= max_points:
        return points
    size = -(-len(points) // max_points)
    binned = []
    for k in range(0, len(points), size):
        chunk = points[k : k + size]
        mfus = [c.mfu for c in chunk if c.mfu is not None]
        binned.append(
            StepPoint(
                chunk[-1].time,
                sum(c.step_seconds for c in chunk) / len(chunk),
                sum(mfus) / len(mfus) if mfus else None,
            )
        )
    return binned
