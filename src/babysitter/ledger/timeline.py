"""A run's ledger records folded into per-incarnation timelines, ready for exact accounting.

Everything is in integer microseconds. An incarnation is one process's tracking of the run, from its
``start`` record to its last sign of life. Its step boundaries split it into *gaps*: gap 0 runs from
the incarnation's beginning to the first boundary (startup), gap ``j`` from boundary ``j-1`` to ``j``
(the time of step ``steps[j]``), and the *tail* from the last boundary to the incarnation's end.
Checkpoint loads/saves and user phases are explicit intervals laid over the gaps; a successful
checkpoint load after the first boundary starts a new *segment* (a rollback within the process).

An incarnation whose start in this file is a *continuation* (its writer found the file deleted and
carried its last boundary over) begins at that boundary: its gap 0 is the time of its first step here,
not startup.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from babysitter.ledger.records import (
    READABLE_VERSIONS,
    Alive,
    CheckpointBegin,
    CheckpointEnd,
    CheckpointManifest,
    End,
    FencedLineError,
    Hang,
    PhaseBegin,
    PhaseEnd,
    Progress,
    ProgressFields,
    Record,
    Renumber,
    Start,
    Straggler,
    decode,
    fence_tag,
    progress_fields,
    progress_work,
)

__all__ = [
    "CAUSE_PRIORITY",
    "CheckpointSpan",
    "Incarnation",
    "Piece",
    "ProgressPoint",
    "Timeline",
    "phase_cause",
]

#: When explicit intervals overlap, the higher-priority cause takes the overlap.
CAUSE_PRIORITY = {"checkpoint_load": 3, "checkpoint_save": 2, "eval": 1, "phase": 0}

#: A piece of explicit badput: ``(begin_us, end_us, cause)``, non-overlapping after flattening.
Piece = tuple[int, int, str]


def phase_cause(name: str) -> str:
    """The badput cause of a user phase: ``eval`` for evaluation, ``phase`` for every other name
    (phase names are free-form; the cause label stays bounded)."""
    return "eval" if name in ("eval", "evaluation", "validation", "val") else "phase"


@dataclass(frozen=True)
class ProgressPoint:
    """One progress record, for plots: ``i0..i1`` index the incarnation's boundaries it carried."""

    t: int
    i0: int
    i1: int
    model_flops: float
    peak_flops: float | None
    #: Boundaries the line stands for beyond ``i1 - i0`` (not kept one by one by the tracker).
    extra: int = 0


@dataclass
class CheckpointSpan:
    """A checkpoint save or load as the ledger saw it (``end`` None while open or when cut off)."""

    op: str
    step: int
    begin: int
    end: int | None = None
    ok: bool | None = None
    nbytes: int | None = None
    path: str | None = None
    #: A save whose tracker promised a manifest (``man``); ``manifest_ok`` once it said how that went.
    manifest: bool = False
    manifest_ok: bool | None = None
    manifest_why: str = ""


@dataclass
class Incarnation:
    """One process's part of the run."""

    index: int
    start: Start
    begin: int
    steps: array[int] = field(default_factory=lambda: array("q"))
    ends: array[int] = field(default_factory=lambda: array("q"))
    stall: array[int] = field(default_factory=lambda: array("q"))
    #: Tokens of each boundary's step (0: unknown), what the slowdown baseline scales with.
    work: array[int] = field(default_factory=lambda: array("q"))
    #: The straggler exchange's verdicts: ``(time, rank or None, score, host, gpu)``, in file order.
    stragglers: list[tuple[int, int | None, float, str | None, str | None]] = field(default_factory=list)
    points: list[ProgressPoint] = field(default_factory=list)
    checkpoints: list[CheckpointSpan] = field(default_factory=list)
    phases: list[tuple[str, int, int | None]] = field(default_factory=list)
    #: ``(time, step)`` of successful loads.
    loads: list[tuple[int, int]] = field(default_factory=list)
    #: Times at which the watchdog declared a hang.
    hangs: list[int] = field(default_factory=list)
    last_t: int = 0
    end: End | None = None
    #: False in the live writer, which never plots (saves one object per progress record).
    keep_points: bool = True
    #: The last dense peak FLOP/s a progress line carried (lines repeat it only when it changes).
    peak_flops: float | None = None
    #: Begins at a boundary carried over from a deleted file: gap 0 is a step, not startup.
    continued: bool = False
    #: Boundaries beyond ``n`` whose time is folded into a kept boundary's step (ring overruns).
    folded: int = 0
    #: Indices of the boundaries whose step stands for more steps than one (their time included).
    folded_at: set[int] = field(default_factory=set)
    #: Its data waits are line totals spread over the steps (version 1): no step's own time is known.
    spread_waits: bool = False
    #: Continuation segments seen (the writer found its file deleted or replaced this many times).
    segments: int = 0
    #: Renumberings applied (the tracker adopted the loop's step numbers); caches of the steps compare it.
    renumbered: int = 0
    #: The fencing tag this incarnation's lines carry.
    tag: str = field(init=False)
    _open_ckpt: dict[str, CheckpointSpan] = field(default_factory=dict)
    _open_phase: dict[str, int] = field(default_factory=dict)
    _pieces_cache: tuple[int, list[Piece]] | None = None

    def __post_init__(self) -> None:
        self.tag = fence_tag(self.start.id)

    # ---------------------------------------------------------------- building

    def add(self, record: Record) -> None:
        """Fold one record of this incarnation in (file order)."""
        self._pieces_cache = None
        t = max(record.t, self.begin)
        if isinstance(record, Progress):
            self._add_progress(record)
        elif isinstance(record, CheckpointBegin):
            stale = self._open_ckpt.get(record.op)
            if stale is not None:  # its end never made it to the ledger: it ended when this one began
                stale.end = max(t, stale.begin)
            span = CheckpointSpan(record.op, record.step, t, path=record.path)
            self.checkpoints.append(span)
            self._open_ckpt[record.op] = span
        elif isinstance(record, CheckpointEnd):
            span_or_none = self._open_ckpt.pop(record.op, None)
            if span_or_none is None:  # an end without its begin: a zero-length span
                span_or_none = CheckpointSpan(record.op, record.step, t, path=record.path)
                self.checkpoints.append(span_or_none)
            span_or_none.end = max(t, span_or_none.begin)
            span_or_none.step = record.step  # a load may learn its step from the checkpoint it read
            span_or_none.ok = record.ok
            span_or_none.nbytes = record.nbytes
            span_or_none.path = record.path or span_or_none.path
            span_or_none.manifest = record.manifest
            if record.op == "load" and record.ok:
                self.loads.append((span_or_none.end, record.step))
        elif isinstance(record, CheckpointManifest):
            for span in reversed(self.checkpoints):
                if span.op == "save" and span.step == record.step and span.path == record.path:
                    span.manifest_ok, span.manifest_why = record.ok, record.why
                    break
        elif isinstance(record, PhaseBegin):
            self._open_phase[record.name] = t
        elif isinstance(record, PhaseEnd):
            began = self._open_phase.pop(record.name, t)
            self.phases.append((record.name, began, t))
        elif isinstance(record, Hang):
            self.hangs.append(t)
        elif isinstance(record, Renumber):
            self._renumber(record.by)
        elif isinstance(record, Straggler):
            self.stragglers.append((t, record.rank, record.score, record.host, record.gpu))
        elif isinstance(record, End):
            self.end = record
        self.last_t = max(self.last_t, t)

    def _renumber(self, by: int) -> None:
        """Every step written so far is ``by`` higher in the training loop's numbering."""
        if by <= 0:
            return
        self.steps = array("q", (s + by for s in self.steps))
        for span in self.checkpoints:
            span.step += by
        self.renumbered += 1

    def _add_progress(self, record: Progress) -> None:
        waits = record.waits if record.waits is not None else record.data_wait
        self.add_boundaries(
            (record.steps, record.ends, record.t, waits, record.model_flops, record.peak_flops, record.extra),
            record.work,
        )

    def add_boundaries(self, fields: ProgressFields, work: Sequence[int] | None = None) -> None:
        """Fold in one progress line: ``(steps, ends, t, waits, model_flops, peak_flops, extra)`` and the
        tokens of each boundary's step (``work``, None: unknown).

        Everything is computed before anything is appended, so the arrays always stay the same length.
        """
        steps, ends, t, waits, model_flops, peak_flops, extra = fields
        n = len(ends)
        if n == 0 or len(steps) != n:
            raise ValueError("a progress line needs one step per boundary")
        i0 = len(self.ends)
        prev = self.ends[-1] if i0 else self.begin
        if ends[0] < prev:  # a clock that went backwards: never let a boundary precede the one before it
            ends = array("q", accumulate(ends, max, initial=prev))
            ends.pop(0)
        stall: Sequence[int]
        if type(waits) is int:
            # Version 1: one total for the line, spread evenly; the first boundary's share of an
            # incarnation went to startup then, and still does (the same totals as before).
            if waits:  # a line with no wait at all has every step's exactly: none
                self.spread_waits = True
            share, rest = divmod(waits, n)
            stall = array("q", [share + 1 if i < rest else share for i in range(n)])
            if i0 == 0 and not self.continued:
                stall[0] = 0
        else:
            stall = waits  # type: ignore[assignment]
            if len(stall) != n:
                raise ValueError("one data wait per boundary")
        if work is not None and len(work) != n:
            raise ValueError("one token count per boundary")
        folded = sum(count for _, count in extra) if extra else 0
        if folded:
            self.folded_at.update(i0 + i for i, count in extra if count > 0)
        self._pieces_cache = None
        self.steps.extend(steps)
        self.ends.extend(ends)
        self.stall.extend(stall)
        if work is None:
            self.work.frombytes(bytes(8 * n))
        else:
            self.work.extend(work)
        self.folded += folded
        if peak_flops is None:
            peak_flops = self.peak_flops
        else:
            self.peak_flops = peak_flops
        if self.keep_points:
            self.points.append(ProgressPoint(t, i0, i0 + n, model_flops, peak_flops, folded))
        last = self.ends[-1]
        self.last_t = max(self.last_t, last, t)

    # ---------------------------------------------------------------- queries

    @property
    def n(self) -> int:
        """Step boundaries recorded."""
        return len(self.ends)

    @property
    def step_count(self) -> int:
        """Steps this incarnation recorded: its boundaries and those folded into them."""
        return self.n + self.folded

    def resume_step(self) -> int | None:
        """The step this incarnation resumed from: its last successful checkpoint load before its first
        boundary; else what its continuation carried over; else the step before its first boundary;
        else None (it never got that far)."""
        first = self.ends[0] if self.ends else None
        before = [step for t, step in self.loads if first is None or t <= first]
        if before:
            return before[-1]
        if self.continued:
            return self.start.resumed
        if first is not None:
            return max(self.steps[0] - 1, 0)
        resumed = self.start.info.get("resumed_step")
        return resumed if isinstance(resumed, int) and not isinstance(resumed, bool) else None

    def splits(self) -> list[tuple[int, int]]:
        """``(time, step)`` of successful loads after the first boundary: each starts a new segment."""
        if not self.ends:
            return []
        return [(t, step) for t, step in self.loads if t > self.ends[0]]

    def segment_of_gap(self, j: int, split_times: list[int]) -> int:
        """Which of this incarnation's segments gap ``j`` belongs to (0 = the first)."""
        return bisect_left(split_times, self.ends[j])

    def pieces(self, stop: int) -> list[Piece]:
        """Explicit badput intervals, open ones closed at ``stop``, flattened so none overlap."""
        if self._pieces_cache is not None and self._pieces_cache[0] == stop:
            return self._pieces_cache[1]
        raw: list[Piece] = []
        for span in self.checkpoints:
            end = span.end if span.end is not None else stop
            raw.append((span.begin, min(end, stop), f"checkpoint_{span.op}"))
        for name, began, ended in self.phases:
            raw.append((began, min(ended if ended is not None else stop, stop), phase_cause(name)))
        for name, began in self._open_phase.items():
            raw.append((began, stop, phase_cause(name)))
        flat = _flatten([p for p in raw if p[1] > p[0]])
        self._pieces_cache = (stop, flat)
        return flat

    def hang_gaps(self) -> set[int]:
        """Gap indices (``n`` = the tail) in which the watchdog declared a hang."""
        return {bisect_right(self.ends, t) for t in self.hangs}


def _flatten(raw: list[Piece]) -> list[Piece]:
    """Non-overlapping pieces; where intervals overlap, the cause with the higher priority wins."""
    if not raw:
        return []
    points = sorted({p[0] for p in raw} | {p[1] for p in raw})
    starts = sorted(raw)
    active: list[tuple[int, int, str]] = []  # heap of (-priority, end, cause)
    out: list[Piece] = []
    k = 0
    for a, b in itertools.pairwise(points):
        while k < len(starts) and starts[k][0] <= a:
            _s0, s1, cause = starts[k]
            heapq.heappush(active, (-CAUSE_PRIORITY.get(cause, 0), s1, cause))
            k += 1
        while active and active[0][1] <= a:
            heapq.heappop(active)
        live = [item for item in active if item[1] > a]
        if not live:
            continue
        cause = min(live)[2]
        if out and out[-1][1] == a and out[-1][2] == cause:
            out[-1] = (out[-1][0], b, cause)
        else:
            out.append((a, b, cause))
    return out


@dataclass
class Timeline:
    """All incarnations of a run, in ledger order."""

    incarnations: list[Incarnation] = field(default_factory=list)
    orphan_records: int = 0
    keep_points: bool = True

    def add(self, record: Record) -> None:
        """Fold one record in; records before the first ``start`` are counted as orphans."""
        if isinstance(record, Start):
            self._start(record)
        elif not self.incarnations:
            self.orphan_records += 1
        elif isinstance(record, Alive):
            inc = self.incarnations[-1]
            inc.last_t = max(inc.last_t, record.t)
        else:
            self.incarnations[-1].add(record)

    def _start(self, record: Start) -> None:
        prev = self.incarnations[-1] if self.incarnations else None
        if record.segment and prev is not None and prev.start.id == record.id:
            self._resume_segment(prev, record)
            return
        carried = record.segment > 0 and record.last_end is not None and record.last_step is not None
        if carried:
            # A continuation whose earlier part is not in this file: it begins at the last boundary
            # the lost part held, so its first step here is measured from there.
            first = record.last_end if record.last_end is not None else record.t
            begin = min(max(first, prev.last_t), record.t) if prev is not None else min(first, record.t)
        elif prev is not None:
            begin = min(max(record.pst, prev.last_t), record.t)
        else:
            begin = min(record.pst, record.t)
        inc = Incarnation(
            index=len(self.incarnations),
            start=record,
            begin=begin,
            keep_points=self.keep_points,
            continued=carried,
            segments=1 if record.segment else 0,
        )
        inc.last_t = max(record.t, begin)
        self.incarnations.append(inc)

    @staticmethod
    def _resume_segment(inc: Incarnation, record: Start) -> None:
        """The file holds an earlier part of this incarnation (it was replaced by an older copy): the
        boundary the continuation carries stands for the steps in between, their time its step."""
        inc.segments += 1
        step, end = record.last_step, record.last_end
        if step is not None and end is not None and (inc.n == 0 or end > inc.ends[-1]):
            folded = max(0, step - inc.steps[-1] - 1) if inc.n else 0
            inc.add_boundaries(([step], [end], record.t, [0], 0.0, None, [(0, folded)] if folded else []))
        inc.last_t = max(inc.last_t, record.t)

    def _admit(self, obj: dict[str, object]) -> None:
        """FencedLineError for a line whose writer is not the newest start's (it lost the lock)."""
        tag = obj.get("f")
        if tag is not None and tag != self.incarnations[-1].tag:
            raise FencedLineError("written after another writer took the ledger over")

    def add_raw(self, obj: object) -> None:
        """Fold in one parsed JSON line; progress lines skip the record object (the bulk of a ledger).

        Raises SchemaError for a line that is not a record this version reads, FencedLineError for the
        line of a writer that another writer took the lock over from.
        """
        if type(obj) is dict and obj.get("k") == "prog" and obj.get("v") in READABLE_VERSIONS:
            if not self.incarnations:
                self.orphan_records += 1
                return
            inc = self.incarnations[-1]
            tag = obj.get("f")
            if tag is not None and tag != inc.tag:
                raise FencedLineError("written after another writer took the ledger over")
            fields = progress_fields(obj)
            inc.add_boundaries(fields, progress_work(obj, len(fields[1])))
            return
        record = decode(obj)
        if self.incarnations and not isinstance(record, Start):
            self._admit(obj)  # type: ignore[arg-type]
        self.add(record)

    def extend(self, records: list[Record]) -> None:
        """Fold many records in."""
        for record in records:
            self.add(record)
