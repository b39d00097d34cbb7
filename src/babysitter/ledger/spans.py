"""Where on the time axis badput happened, for the report's timeline plot.

The accounting gives exact totals; this gives positions: downtime between incarnations, startup up to
the first step, checkpoint and phase intervals, hangs, and the stretch of each incarnation whose steps
were later computed again (lost progress). Data stalls are booked on their step but have no position
inside it, so they are not drawn.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
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
        if not inc.continued:
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


class _Pauses:
    """Checkpoint and phase time inside any ``[a, b]``, in O(log n) (pieces are sorted, disjoint)."""

    def __init__(self, pieces: list[tuple[int, int, str]]) -> None:
        self.begins = [p[0] for p in pieces]
        self.ends = [p[1] for p in pieces]
        self.cum = [0]
        for a, b, _ in pieces:
            self.cum.append(self.cum[-1] + (b - a))

    def within(self, a: int, b: int) -> int:
        i = bisect_right(self.ends, a)  # first piece ending after a
        j = bisect_left(self.begins, b)  # first piece beginning at or after b
        if i >= j:
            return 0
        total = self.cum[j] - self.cum[i] - max(0, a - self.begins[i]) - max(0, self.ends[j - 1] - b)
        return max(0, total)


def step_points(inc: Incarnation, max_points: int = 4000, *, stop: int | None = None) -> list[StepPoint]:
    """Mean step time and MFU of ``inc`` over consecutive progress lines, at most ``max_points`` points.

    Lines are grouped into equal chunks first (a month of lines costs one pass over the chunks);
    checkpoint and phase time inside a chunk is left out, as the tracker's step time and MFU do.
    """
    pts = inc.points
    if not pts:
        return []
    pauses = _Pauses(inc.pieces(stop if stop is not None else inc.last_t))
    size = max(1, -(-len(pts) // max(1, max_points)))
    out: list[StepPoint] = []
    ends = inc.ends
    for k in range(0, len(pts), size):
        chunk = pts[k : k + size]
        first = chunk[0]
        from_begin = first.i0 == 0 and inc.continued  # gap 0 of a continuation is a step
        lo = first.i0 - 1 if first.i0 > 0 else first.i0
        hi = chunk[-1].i1 - 1
        n = hi - lo + sum(p.extra for p in chunk) + from_begin
        a = inc.begin if from_begin else ends[lo]
        if n <= 0:
            continue
        span = ends[hi] - a - pauses.within(a, ends[hi])
        if span <= 0:
            continue
        flops = sum(p.model_flops for p in chunk)
        if first.i0 == 0 and first.i1 > 0 and not from_begin:  # an incarnation's first step is startup
            flops -= first.model_flops / (first.i1 - first.i0 + first.extra)
        peak = chunk[-1].peak_flops
        mfu = flops / (span / US) / peak if peak and flops > 0 else None
        out.append(StepPoint(ends[hi] / US, span / n / US, mfu))
    return out
