"""Exact goodput accounting from a :class:`~babysitter.ledger.timeline.Timeline`.

Every microsecond between the run's first start and the horizon (``now`` for a live or down run, the
last record for one that ended) is given to exactly one bucket, gap by gap, so
``productive + sum(badput) == wall`` holds in integers for any ledger:

* explicit intervals (checkpoint load/save, user phases) take their overlap with a gap;
* a gap in which the watchdog declared a hang is ``hang``;
* the rest of a gap loses the data wait recorded in it to ``data_stall`` (waiting on the first batch
  included); the rest of gap 0 is ``startup`` (unless the incarnation continues from a deleted file,
  whose gap 0 is a step); of what remains of a step's gap, the time beyond the run's ideal step time
  (when the step was slow: :mod:`babysitter.ledger.slowdown`) is ``slowdown``, and the rest is
  productive when the step was kept, or ``lost_progress`` when a later incarnation (or a rollback
  load) resumed from an earlier step, i.e. the step is above the lowest resume step of everything that
  came after it;
* an incarnation's tail (last boundary to its last sign of life) is ``lost_progress`` after a crash and
  ``other`` after a clean end; between incarnations (and after a dead one, up to ``now``) it is
  ``downtime``.

The accountant is incremental: gaps older than a settle margin are classified once and kept as
per-segment prefix sums, so a live writer's scrape costs the new steps, not the whole month.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from typing import Literal

from babysitter.catalog.goodput import BADPUT_CAUSES
from babysitter.ledger.slowdown import SlowBook
from babysitter.ledger.timeline import Incarnation, Piece, Timeline

__all__ = ["Accountant", "Accounting", "TailMode"]

#: What an open (live) incarnation's unfinished step counts as: ``other`` (reports), or nothing yet
#: (``exclude``: live counters, which must never go down when the step then finishes).
TailMode = Literal["other", "exclude"]

_INF = 1 << 62
US = 1_000_000


@dataclass(frozen=True)
class Accounting:
    """Where the wall time of a run (or of a window of it) went, in integer microseconds."""

    start_us: int
    horizon_us: int
    productive_us: int
    badput_us: dict[str, int]
    #: Counted nowhere yet: a live run's unfinished step (``tail="exclude"``) and, with ``hold``, step
    #: time no checkpoint covers yet.
    pending_us: int
    restarts: int
    incarnations: int

    @property
    def wall_us(self) -> int:
        """Productive plus all badput: equal to ``horizon - start - pending`` exactly."""
        return self.productive_us + sum(self.badput_us.values())

    @property
    def wall_seconds(self) -> float:
        """Wall time in seconds."""
        return self.wall_us / US

    @property
    def productive_seconds(self) -> float:
        """Productive time in seconds."""
        return self.productive_us / US

    @property
    def badput_seconds(self) -> dict[str, float]:
        """Badput by cause, in seconds."""
        return {cause: us / US for cause, us in self.badput_us.items()}

    @property
    def goodput(self) -> float:
        """Productive over wall time (0 for an empty run)."""
        wall = self.wall_us
        return self.productive_us / wall if wall > 0 else 0.0


@dataclass
class _Pool:
    """Step time that is productive or lost depending on later resumes: per segment, prefix sums of
    the steps' remainders and of their slowdown (which is slowdown whatever the step's fate)."""

    steps: list[array[int]] = field(default_factory=list)
    cum: list[array[int]] = field(default_factory=list)
    scum: list[array[int]] = field(default_factory=list)
    ordered: list[bool] = field(default_factory=list)

    def extend(self, seg: int, steps: list[int], rems: list[int], slows: list[int]) -> None:
        """Append steps (in order), their remainders and their slowdown to segment ``seg``."""
        while len(self.steps) <= seg:
            self.steps.append(array("q"))
            self.cum.append(array("q"))
            self.scum.append(array("q"))
            self.ordered.append(True)
        mine, cum, scum = self.steps[seg], self.cum[seg], self.scum[seg]
        if self.ordered[seg] and steps:
            last = mine[-1] if mine else steps[0]
            if steps[0] < last or any(b < a for a, b in pairwise(steps)):
                self.ordered[seg] = False
        mine.extend(steps)
        running = accumulate(rems, initial=cum[-1] if cum else 0)
        next(running)  # the initial value is already there (or zero)
        cum.extend(running)
        slowing = accumulate(slows, initial=scum[-1] if scum else 0)
        next(slowing)
        scum.extend(slowing)

    def kept(self, seg: int, threshold: int) -> tuple[int, int, int]:
        """``(kept, lost, slowdown)`` of one segment when steps above ``threshold`` are lost: the
        kept and lost step time net of the slowdown, and the slowdown of all its steps."""
        if seg >= len(self.steps) or not self.steps[seg]:
            return 0, 0, 0
        steps, cum, scum = self.steps[seg], self.cum[seg], self.scum[seg]
        total, slowed = cum[-1], scum[-1]
        if self.ordered[seg]:
            idx = bisect_right(steps, threshold)
            kept = cum[idx - 1] if idx else 0
            kept_slow = scum[idx - 1] if idx else 0
        else:
            kept = kept_slow = prev = sprev = 0
            for s, c, sc in zip(steps, cum, scum, strict=True):
                if s <= threshold:
                    kept += c - prev
                    kept_slow += sc - sprev
                prev, sprev = c, sc
        return kept - kept_slow, total - kept - (slowed - kept_slow), slowed


#: A step classified outside the pool: ``(segment, step, remainder, slowdown)``.
_Loose = tuple[int, int, int, int]


@dataclass
class _Cache:
    stop: int
    #: The incarnation's renumberings when the cache was built (a renumbering changes every step).
    renumbered: int = 0
    next_gap: int = 0
    fixed: dict[str, int] = field(default_factory=dict)
    pool: _Pool = field(default_factory=_Pool)
    #: The tail's classification of a finished incarnation: ``(key, fixed, loose, pending)``.
    rest: tuple[tuple[int, int, str | None], dict[str, int], list[_Loose], int] | None = None


class _Sink:
    """Where one classification pass puts its results."""

    def __init__(self, fixed: dict[str, int], pool: _Pool | None) -> None:
        self.fixed = fixed
        self.pool = pool
        self.loose: list[_Loose] = []  # when pool is None
        self.pending = 0

    def put(self, cause: str, us: int) -> None:
        if us:
            self.fixed[cause] = self.fixed.get(cause, 0) + us

    def take(self, seg: list[int], steps: list[int], rems: list[int], slows: list[int]) -> None:
        """Step remainders (and their slowdown) of one pass, in gap order."""
        if self.pool is None:
            self.loose.extend(zip(seg, steps, rems, slows, strict=True))
            return
        start = 0
        for k in range(1, len(seg) + 1):
            if k == len(seg) or seg[k] != seg[start]:
                self.pool.extend(seg[start], steps[start:k], rems[start:k], slows[start:k])
                start = k


def _special_gaps(
    inc: Incarnation,
    *,
    j0: int,
    j1: int,
    lo: int,
    hi: int,
    pieces: list[Piece],
    hangs: set[int],
    splits: list[int],
) -> list[int]:
    """Gaps in ``[j0, j1)`` that need the careful path: the first and the tail, hangs, gaps cut by the
    window, gaps overlapped by explicit intervals, the first gap of each rollback segment."""
    ends, n = inc.ends, inc.n
    marks = {0, n, bisect_right(ends, lo), bisect_right(ends, hi)}
    marks.update(hangs)
    for a, b, _ in pieces:
        ja, jb = bisect_right(ends, a), bisect_left(ends, b)
        marks.update(range(ja, min(jb, n) + 1))
    for t in splits:
        marks.add(bisect_right(ends, t))
    return sorted(j for j in marks if j0 <= j < j1)


def _classify(
    inc: Incarnation,
    j0: int,
    j1: int,
    *,
    lo: int,
    hi: int,
    stop: int,
    tail: str | None,
    sink: _Sink,
    slow: array[int],
) -> None:
    """Classify gaps ``j0..j1-1`` (``inc.n`` is the tail) clipped to ``[lo, hi]`` and the incarnation;
    ``slow``: each gap's slowdown (the part of its remainder beyond the ideal step time).

    Plain step gaps (the vast majority) go through list comprehensions; the few special ones through
    the careful per-gap path.
    """
    n = inc.n
    ends, steps, stall = inc.ends, inc.steps, inc.stall
    begin = inc.begin
    lo = max(lo, begin)
    hi = min(hi, stop)
    pieces = inc.pieces(stop)
    piece_ends = [p[1] for p in pieces]
    hangs = inc.hang_gaps()
    split_times = [t for t, _ in inc.splits()]
    put = sink.put
    out_seg: list[int] = []
    out_step: list[int] = []
    out_rem: list[int] = []
    out_slow: list[int] = []
    wait_total = 0
    decided = len(slow)

    def careful(j: int) -> None:
        nonlocal wait_total
        g0 = begin if j == 0 else ends[j - 1]
        g1 = ends[j] if j < n else stop
        c0 = g0 if g0 > lo else lo
        c1 = g1 if g1 < hi else hi
        if c1 <= c0:
            return
        rem = c1 - c0
        kk = bisect_right(piece_ends, c0)
        while kk < len(pieces) and pieces[kk][0] < c1:
            a = max(pieces[kk][0], c0)
            b = min(pieces[kk][1], c1)
            if b > a:
                put(pieces[kk][2], b - a)
                rem -= b - a
            kk += 1
        if rem <= 0:
            return
        if j in hangs:
            put("hang", rem)
            return
        if n == 0:
            put("startup", rem)
            return
        if j == n:
            if tail is None:
                sink.pending += rem
            else:
                put(tail, rem)
            return
        wait = stall[j]
        if wait:
            if c1 - c0 != g1 - g0:
                wait = wait * (c1 - c0) // (g1 - g0)
            wait = min(wait, rem)
            wait_total += wait
            rem -= wait
        if j == 0 and not inc.continued:
            put("startup", rem)  # waiting on the first batch is a data stall, the rest startup
            return
        out_seg.append(0 if not split_times else inc.segment_of_gap(j, split_times))
        out_step.append(steps[j])
        out_rem.append(rem)
        slowed = slow[j] if j < decided else 0
        if slowed and c1 - c0 != g1 - g0:
            slowed = slowed * (c1 - c0) // (g1 - g0)  # cut by a window: in proportion, as the wait
        out_slow.append(slowed if slowed < rem else rem)

    # Gaps wholly before ``lo`` or after ``hi`` contribute nothing.
    j0 = max(j0, bisect_right(ends, lo))
    j1 = min(j1, bisect_right(ends, hi) + 1)
    j = j0
    for special in [
        *_special_gaps(inc, j0=j0, j1=j1, lo=lo, hi=hi, pieces=pieces, hangs=hangs, splits=split_times),
        j1,
    ]:
        if j < special:  # a plain run: whole step gaps, nothing laid over them
            e = ends[j - 1 : special]
            gaps = [b - a for a, b in pairwise(e)]
            waits = [w if w < g else g for w, g in zip(stall[j:special], gaps, strict=True)]
            wait_total += sum(waits)
            out_seg.extend([0 if not split_times else inc.segment_of_gap(j, split_times)] * len(gaps))
            out_step.extend(steps[j:special])
            out_rem.extend([g - w for g, w in zip(gaps, waits, strict=True)])
            out_slow.extend(slow[j:special])
            if special > decided:  # not decided yet (never after SlowBook.update): nothing slow
                out_slow.extend([0] * (special - max(j, decided)))
        if special < j1:
            careful(special)
        j = special + 1
    put("data_stall", wait_total)
    sink.take(out_seg, out_step, out_rem, out_slow)


def _open_floor(inc: Incarnation) -> int:
    """The earliest begin of an interval still open (gaps after it may still gain explicit badput)."""
    floor = _INF
    for span in inc.checkpoints:
        if span.end is None:
            floor = min(floor, span.begin)
    for began in inc._open_phase.values():
        floor = min(floor, began)
    return floor


class Accountant:
    """Exact, incremental accounting over a timeline that may still be growing (the live writer)."""

    def __init__(self, timeline: Timeline, *, settle_seconds: float = 60.0) -> None:
        self.timeline = timeline
        self._settle = round(settle_seconds * US)
        self._caches: dict[int, _Cache] = {}
        #: Each step's slowdown, decided once in ledger order (the live counters never go down).
        self.slow = SlowBook(timeline)

    # -------------------------------------------------------------- layout

    def _layout(self, now: int | None, live: bool) -> list[tuple[int, str | None, bool]]:
        """Per incarnation: ``(stop, tail cause or None for pending, still growing)``."""
        incs = self.timeline.incarnations
        out: list[tuple[int, str | None, bool]] = []
        for i, inc in enumerate(incs):
            last = i == len(incs) - 1
            clean_tail = "other" if inc.end is not None and inc.end.clean else "lost_progress"
            if not last:
                out.append((max(inc.begin, min(inc.last_t, incs[i + 1].begin)), clean_tail, False))
            elif inc.end is None and live:
                out.append((max(inc.last_t, now if now is not None else inc.last_t), None, True))
            else:
                out.append((inc.last_t, clean_tail, False))
        return out

    def thresholds(self) -> list[list[int]]:
        """Per incarnation, per segment: the step above which that segment's steps were lost."""
        resumes: list[int | None] = []
        shape: list[int] = []
        for inc in self.timeline.incarnations:
            splits = inc.splits()
            resumes.append(inc.resume_step())
            resumes.extend(step for _, step in splits)
            shape.append(1 + len(splits))
        suffix: list[int] = [_INF] * len(resumes)
        best = _INF
        for g in range(len(resumes) - 1, -1, -1):
            suffix[g] = best
            r = resumes[g]
            if r is not None:
                best = min(best, r)
        out: list[list[int]] = []
        g = 0
        for count in shape:
            out.append(suffix[g : g + count])
            g += count
        return out

    # -------------------------------------------------------------- totals

    def totals(
        self, *, now: float | None = None, live: bool = False, tail: TailMode = "other", hold: bool = False
    ) -> Accounting:
        """The whole run up to the horizon.

        ``now`` (Unix seconds): for a run that is down (no end record, not ``live``), downtime runs to
        ``now``; for a ``live`` run, the last incarnation runs to ``now`` and its unfinished step counts as
        ``tail`` (``"other"``) or is left pending (``"exclude"``). Without ``now`` the horizon is the
        last record.

        ``hold``: steps that nothing later resumed from yet and that no completed checkpoint covers are
        left pending instead of productive (unless the run ended cleanly). The live counters use it so
        that a restart turns pending time into lost progress instead of taking productive time back.
        """
        now_us = None if now is None else round(now * US)
        incs = self.timeline.incarnations
        fixed: dict[str, int] = {}
        if not incs:
            return self._result(0, 0, fixed, [], 0)
        self.slow.update()
        layout = self._layout(now_us, live)
        thresholds = self.thresholds()
        loose_all: list[tuple[int, list[_Loose], _Pool]] = []
        pending = 0
        for i, inc in enumerate(incs):
            stop, tail_cause, growing = layout[i]
            if growing and tail_cause is None and tail == "other":
                tail_cause = "other"
            cache = self._caches.get(i)
            if cache is None or (cache.stop != stop and not growing) or cache.renumbered != inc.renumbered:
                cache = _Cache(stop=stop, renumbered=inc.renumbered)
                self._caches[i] = cache
            # Finalize gaps that can no longer change.
            n = inc.n
            if growing:
                watermark = min((now_us or inc.last_t) - self._settle, _open_floor(inc))
                limit = bisect_right(inc.ends, watermark)
            else:
                limit = n
            if limit > cache.next_gap:
                _classify(
                    inc,
                    cache.next_gap,
                    limit,
                    lo=-_INF,
                    hi=_INF,
                    stop=stop,
                    tail=None,
                    sink=_Sink(cache.fixed, cache.pool),
                    slow=self.slow.of(i),
                )
                cache.next_gap = limit
            for cause, us in cache.fixed.items():
                fixed[cause] = fixed.get(cause, 0) + us
            # The rest: fresh every time while the incarnation grows, once when it is finished.
            rest_tail = tail_cause if not (growing and tail == "exclude") else None
            key = (stop, cache.next_gap, rest_tail)
            if growing or cache.rest is None or cache.rest[0] != key:
                sink = _Sink({}, None)
                _classify(
                    inc,
                    cache.next_gap,
                    n + 1,
                    lo=-_INF,
                    hi=_INF,
                    stop=stop,
                    tail=rest_tail,
                    sink=sink,
                    slow=self.slow.of(i),
                )
                cache.rest = (key, sink.fixed, sink.loose, sink.pending)
            _, rest_fixed, rest_loose, rest_pending = cache.rest
            for cause, us in rest_fixed.items():
                fixed[cause] = fixed.get(cause, 0) + us
            pending += rest_pending
            loose_all.append((i, rest_loose, cache.pool))
            if i + 1 < len(incs):
                fixed["downtime"] = fixed.get("downtime", 0) + max(0, incs[i + 1].begin - stop)
            elif not growing and inc.end is None and now_us is not None and now_us > stop:
                fixed["downtime"] = fixed.get("downtime", 0) + now_us - stop
        productive, lost, slowed = 0, 0, 0
        saved = self._saved_max() if hold and not (incs[-1].end is not None and incs[-1].end.clean) else None
        for i, loose, pool in loose_all:
            thr = thresholds[i]
            for seg, limit_step in enumerate(thr):
                if saved is not None and limit_step == _INF:
                    kept, gone, slow = pool.kept(seg, saved)
                    productive += kept
                    pending += gone
                    slowed += slow
                    continue
                kept, gone, slow = pool.kept(seg, limit_step)
                productive += kept
                lost += gone
                slowed += slow
            for seg, step, step_rem, slow in loose:
                limit_step = thr[min(seg, len(thr) - 1)]
                slowed += slow
                rem = step_rem - slow
                if saved is not None and limit_step == _INF:
                    if step > saved:
                        pending += rem
                    else:
                        productive += rem
                elif step > limit_step:
                    lost += rem
                else:
                    productive += rem
        fixed["lost_progress"] = fixed.get("lost_progress", 0) + lost
        fixed["slowdown"] = fixed.get("slowdown", 0) + slowed
        last_stop = layout[-1][0]
        last_inc = incs[-1]
        horizon = last_stop
        if not layout[-1][2] and last_inc.end is None and now_us is not None:
            horizon = max(horizon, now_us)
        return self._result(incs[0].begin, horizon, fixed, [productive], pending)

    def _saved_max(self) -> int:
        """The highest step a completed checkpoint save covers (-1 when there is none)."""
        best = -1
        for inc in self.timeline.incarnations:
            for span in inc.checkpoints:
                if span.op == "save" and span.ok:
                    best = max(best, span.step)
        return best

    def _result(
        self, start: int, horizon: int, fixed: dict[str, int], productive: Iterable[int], pending: int
    ) -> Accounting:
        badput = {cause: fixed.get(cause, 0) for cause in BADPUT_CAUSES}
        for cause, us in fixed.items():
            if cause not in badput:  # pragma: no cover - every cause the classifier emits is listed
                badput[cause] = us
        return Accounting(
            start_us=start,
            horizon_us=horizon,
            productive_us=sum(productive),
            badput_us=badput,
            pending_us=pending,
            restarts=max(0, len(self.timeline.incarnations) - 1),
            incarnations=len(self.timeline.incarnations),
        )

    # -------------------------------------------------------------- windows

    def window(self, lo: float, hi: float, *, now: float | None = None, live: bool = False) -> Accounting:
        """Accounting of the part of the run inside ``[lo, hi]`` (Unix seconds), e.g. the last hour.

        Gaps that straddle ``lo`` are cut; their data wait is cut in proportion (integer arithmetic, so
        the identity still holds exactly inside the window).
        """
        lo_us, hi_us = round(lo * US), round(hi * US)
        now_us = None if now is None else round(now * US)
        incs = self.timeline.incarnations
        fixed: dict[str, int] = {}
        if not incs or hi_us <= lo_us:
            return self._result(lo_us, hi_us, fixed, [], 0)
        self.slow.update()
        layout = self._layout(now_us, live)
        thresholds = self.thresholds()
        productive = 0
        lost = 0
        slowed = 0
        for i, inc in enumerate(incs):
            stop, tail_cause, growing = layout[i]
            if growing and tail_cause is None:
                tail_cause = "other"
            if stop > lo_us and inc.begin < hi_us:
                j0 = bisect_right(inc.ends, lo_us)
                j1 = min(inc.n, bisect_right(inc.ends, hi_us)) + 1
                sink = _Sink(fixed, None)
                slow_i = self.slow.of(i)
                _classify(inc, j0, j1, lo=lo_us, hi=hi_us, stop=stop, tail=tail_cause, sink=sink, slow=slow_i)
                thr = thresholds[i]
                for seg, step, step_rem, slow in sink.loose:
                    slowed += slow
                    rem = step_rem - slow
                    if step > thr[min(seg, len(thr) - 1)]:
                        lost += rem
                    else:
                        productive += rem
            nxt = incs[i + 1].begin if i + 1 < len(incs) else None
            if nxt is None and not growing and inc.end is None and now_us is not None:
                nxt = now_us
            if nxt is not None and nxt > stop:
                a, b = max(stop, lo_us), min(nxt, hi_us)
                if b > a:
                    fixed["downtime"] = fixed.get("downtime", 0) + b - a
        fixed["lost_progress"] = fixed.get("lost_progress", 0) + lost
        fixed["slowdown"] = fixed.get("slowdown", 0) + slowed
        return self._result(max(lo_us, incs[0].begin), hi_us, fixed, [productive], 0)
