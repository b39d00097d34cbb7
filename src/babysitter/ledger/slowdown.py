"""Fail-slow time: each step's time beyond the run's ideal step time, decided once, in ledger order.

The **ideal** is learned per *level*: the incarnation's context (world size, parallel layout, device,
model FLOPs per token: what its start record says) and the step's work (its tokens, in bins 5% wide).
Within a level step times are compared per token, so a batch of 4,000 tokens is not slower than one
of 4,096; across levels nothing is scaled, because a step's time is not proportional to its work
(the optimizer step, the gradient all-reduce and the launch overheads are per step, and attention
grows with the sequence length). A level is learned from its own steps:

* its first :data:`MIN_SAMPLES` steps establish it (they are never booked);
* then a step is **slow** when its time (the gap between two boundaries less its data wait) exceeds
  ``ideal x (1 + tolerance)``; a slow step books all of its time beyond the ideal as ``slowdown``,
  the others book nothing and join the level's window of the last :data:`WINDOW` healthy steps;
* every :data:`REFRESH` healthy steps the ideal is recomputed from the window: the mean of the steps
  within median +- 3 MAD (MLGM's rule, two-sided so that an unusually fast step, an empty batch,
  cannot pull it down), and the tolerance is ``max(10%, 3 sigma)`` with sigma = 1.4826 MAD, at most
  50%: a run whose steps jitter widely is judged with a wider band.

Slow steps never enter the window, so a slowdown lasting hours is still measured against the healthy
ideal (the median of all steps would become the slow time after half an hour of it); faster steps do
enter it, so the ideal follows a run that got faster. Decisions are causal (step ``k`` is judged on
the steps before it, in ledger order across restarts, with the levels carried over from incarnation
to incarnation): the live counters and the report book the same microseconds, and a step's verdict
never changes once made, so ``train_badput_seconds_total{cause="slowdown"}`` never goes down.

Not judged (booked nothing, and not learned from): an incarnation's first gap (startup), gaps that a
checkpoint, a marked phase or a hang overlaps, boundaries that stand for several steps (a ring
overrun), and incarnations written by schema version 1 (one data wait per line, so no step's own time).
docs/goodput.md says where this is wrong.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field

from babysitter.ledger.timeline import Incarnation, Timeline

__all__ = [
    "MAX_TOLERANCE",
    "MIN_SAMPLES",
    "REFRESH",
    "TOLERANCE",
    "WINDOW",
    "SlowBook",
    "Stretch",
    "context_of",
]

#: The least tolerance above the ideal before a step counts as slow (Greyhound flags >= 10% changes).
TOLERANCE = 0.10
#: The most the tolerance widens to for a run whose healthy steps jitter widely.
MAX_TOLERANCE = 0.50
#: Steps of a level before its ideal exists (never booked).
MIN_SAMPLES = 20
#: Healthy steps a level's ideal is computed from (the most recent).
WINDOW = 256
#: Healthy steps between two recomputations of a level's ideal (half the window: a recomputation costs
#: ~60 us, about 0.5 us a step).
REFRESH = 128
#: Healthy assessed steps after a slow one that end a stretch.
QUIET = 10
#: Width of a work bin: steps whose tokens differ by less share a level.
_BIN = math.log(1.05)
#: Steps the deviation gauge averages over (MLGM's last 100).
_DEVIATION_STEPS = 100
_MAD_K = 3.0
_SIGMA = 1.4826

Context = tuple[str, ...]


def context_of(inc: Incarnation) -> Context:
    """What must stay the same for two incarnations to share an ideal: the job's shape and hardware."""
    info = inc.start.info
    return tuple(str(info.get(key, "")) for key in ("world_size", "parallelism", "device", "flops_per_token"))


class _Level:
    """One level's window of healthy steps (per token, or per step when the tokens are unknown)."""

    __slots__ = ("fresh", "ideal", "limit", "samples", "tol")

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=WINDOW)
        self.ideal = 0.0  # us per unit; 0 until MIN_SAMPLES steps were seen
        self.tol = TOLERANCE
        self.limit = 0.0  # ideal x (1 + tol): a step above it is slow
        self.fresh = 0

    def refresh(self) -> None:
        values = sorted(self.samples)
        median = _median(values)
        mad = _median(sorted([abs(x - median) for x in values]))
        band = _MAD_K * max(mad, 1e-3 * median)
        low, high = median - band, median + band
        inliers = values[bisect_left(values, low) : bisect_right(values, high)]
        self.ideal = sum(inliers) / len(inliers) if inliers else median
        if self.ideal > 0:
            self.tol = min(MAX_TOLERANCE, max(TOLERANCE, _MAD_K * _SIGMA * mad / self.ideal))
        self.limit = self.ideal * (1.0 + self.tol)
        self.fresh = 0


def _median(ordered: list[float]) -> float:
    """The median of a sorted, non-empty list."""
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


@dataclass
class Stretch:
    """Slow steps close together (fewer than :data:`QUIET` healthy steps apart) in one incarnation."""

    incarnation: int
    begin_us: int
    end_us: int
    #: Time beyond the ideal, booked as slowdown.
    excess_us: int = 0
    #: The ideal time of the slow steps (excess / ideal is the slowdown factor minus one).
    ideal_us: int = 0
    slow_steps: int = 0
    first_step: int = 0
    last_step: int = 0

    @property
    def factor(self) -> float:
        """How much longer its slow steps took than ideal (1.4: 40% longer)."""
        return (self.ideal_us + self.excess_us) / self.ideal_us if self.ideal_us else math.inf


@dataclass
class _Inc:
    """Per incarnation: the excess of each gap decided so far, and its totals."""

    slow: array[int] = field(default_factory=lambda: array("q"))
    excess_us: int = 0
    assessed: int = 0
    ideal_us: int = 0  # the last assessed step's ideal
    open: Stretch | None = None
    quiet: int = 0


class SlowBook:
    """Decides each step's slowdown once, as the timeline grows (live writer) or all at once (report)."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self._levels: dict[tuple[Context, int], _Level] = {}
        self._incs: list[_Inc] = []
        self._closed: list[Stretch] = []
        self._deviation: deque[float] = deque(maxlen=_DEVIATION_STEPS)
        self.total_us = 0

    # ------------------------------------------------------------------ queries

    def of(self, i: int) -> array[int]:
        """The excess (us) of each gap of incarnation ``i`` decided so far (index = gap)."""
        return self._incs[i].slow if i < len(self._incs) else array("q")

    def incarnation_seconds(self, i: int) -> float:
        """Slowdown booked in incarnation ``i``."""
        return self._incs[i].excess_us / 1e6 if i < len(self._incs) else 0.0

    def incarnation_ideal_seconds(self, i: int) -> float | None:
        """The ideal step time of incarnation ``i``'s last judged step (None: none judged)."""
        if i >= len(self._incs) or not self._incs[i].assessed:
            return None
        return self._incs[i].ideal_us / 1e6

    def ideal_seconds(self) -> float | None:
        """The ideal time of the newest judged step (MLGM's ideal step time, at the current work)."""
        for state in reversed(self._incs):
            if state.assessed:
                return state.ideal_us / 1e6
        return None

    def deviation_seconds(self) -> float | None:
        """Mean |step time - ideal| over the last 100 judged steps (MLGM's step-time deviation)."""
        return sum(self._deviation) / len(self._deviation) / 1e6 if self._deviation else None

    def stretches(self) -> list[Stretch]:
        """Every stretch of slow steps, oldest first (the newest may still grow)."""
        out = list(self._closed)
        out.extend(s.open for s in self._incs if s.open is not None)
        out.sort(key=lambda s: s.begin_us)
        return out

    # ------------------------------------------------------------------ deciding

    def update(self) -> None:
        """Decide every step gap not decided yet (new boundaries of the timeline)."""
        incs = self.timeline.incarnations
        for i, inc in enumerate(incs):
            if i == len(self._incs):
                self._incs.append(_Inc())
            state = self._incs[i]
            if len(state.slow) < inc.n:
                self._decide(i, inc, state)
            if i + 1 < len(incs):
                self._close(i)  # a later incarnation began: this one's last stretch is over

    def _close(self, i: int) -> None:
        state = self._incs[i]
        if state.open is not None:
            self._closed.append(state.open)
            state.open, state.quiet = None, 0

    def _decide(self, i: int, inc: Incarnation, state: _Inc) -> None:
        """Decide gaps ``len(state.slow)..n-1`` in order (the per-step loop: locals only, ~1 us a step)."""
        n = inc.n
        j0 = len(state.slow)
        if inc.spread_waits:  # version 1: a step's own data wait is unknown, so is its own time
            state.slow.frombytes(bytes(8 * (n - j0)))
            return
        ends, stall, work, steps = inc.ends, inc.stall, inc.work, inc.steps
        pieces = inc.pieces(max(inc.last_t, ends[n - 1]))
        piece_begins = [p[0] for p in pieces]
        piece_ends = [p[1] for p in pieces]
        npieces = len(pieces)
        skip = inc.hang_gaps() | inc.folded_at | {0}
        ctx = context_of(inc)
        levels = self._levels
        slow = state.slow
        append = slow.append
        deviation = self._deviation
        tail = n - _DEVIATION_STEPS
        stretch, quiet = state.open, state.quiet
        booked = assessed = 0
        last_w, last_unit, last_work = -1, 0.0, 0
        level = _Level()  # replaced at the first step (last_w is never a token count)
        ideal_unit = limit = 0.0
        k = bisect_right(piece_ends, ends[j0 - 1]) if j0 > 0 else 0
        for j in range(j0, n):
            if j in skip:
                append(0)
                continue
            a, b = ends[j - 1], ends[j]
            if npieces:
                while k < npieces and piece_ends[k] <= a:
                    k += 1
                if k < npieces and piece_begins[k] < b:
                    append(0)  # a checkpoint or phase overlaps it: not a plain step
                    continue
            d = b - a
            wait = stall[j]
            if wait:
                d = d - wait if wait < d else 0
            w = work[j]
            if w != last_w:
                key = (ctx, round(math.log(w) / _BIN) if w > 0 else -1)
                found = levels.get(key)
                if found is None:
                    found = levels[key] = _Level()
                level, last_w = found, w
                ideal_unit, limit = level.ideal, level.limit
            unit = d / w if w > 0 else float(d)
            if not ideal_unit:
                level.samples.append(unit)
                if len(level.samples) >= MIN_SAMPLES:
                    level.refresh()
                    ideal_unit, limit = level.ideal, level.limit
                append(0)
                continue
            assessed += 1
            last_unit, last_work = ideal_unit, w
            if unit <= limit:
                level.samples.append(unit)
                level.fresh += 1
                if level.fresh >= REFRESH:
                    level.refresh()
                    ideal_unit, limit = level.ideal, level.limit
                append(0)
                if j >= tail:
                    deviation.append(abs(d - (ideal_unit * w if w > 0 else ideal_unit)))
                if stretch is not None:
                    quiet += 1
                    if quiet >= QUIET:
                        self._closed.append(stretch)
                        stretch, quiet = None, 0
                continue
            ideal = round(ideal_unit * w) if w > 0 else round(ideal_unit)
            excess = d - ideal if d > ideal else 0
            append(excess)
            booked += excess
            if j >= tail:
                deviation.append(d - ideal)
            if stretch is None:
                stretch = Stretch(i, a, b, first_step=steps[j], last_step=steps[j])
            stretch.end_us = b
            stretch.last_step = steps[j]
            stretch.excess_us += excess
            stretch.ideal_us += ideal
            stretch.slow_steps += 1
            quiet = 0
        state.open, state.quiet = stretch, quiet
        state.excess_us += booked
        self.total_us += booked
        if assessed:
            state.assessed += assessed
            state.ideal_us = round(last_unit * last_work) if last_work > 0 else round(last_unit)
