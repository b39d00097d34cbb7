"""The ledger's on-disk schema (version 2; version 1 is still read): one JSON object per line, times
in integer microseconds.

Integer microseconds (not float seconds) make the accounting exact: every duration is a difference of
integers, so productive + badput == wall time holds to the microsecond with no float drift. Keys are
short because a 30-day run writes hundreds of thousands of lines.

Every line carries ``"v"`` (schema version) and ``"k"`` (kind); every line but a start carries ``"f"``,
its writer's fencing tag (the first characters of the writer's incarnation ``id``): a reader drops a
line whose tag is not the newest start's, i.e. a line a writer wrote after another one took the lock
over from it. Kinds:

``start``  an incarnation (process) began tracking the run: ``t``, ``pst`` (process start), ``id``
           (random incarnation id), ``host``, ``pid``, ``run``, ``info`` (free-form: world size, version...),
           ``dir`` (the absolute directory the ledger was written in: checkpoint paths inside it are
           written relative to it, those outside absolute; :mod:`babysitter.ledger.paths`; absent in
           ledgers written before it was recorded, or when it is longer than ``MAX_STR``).
           A *continuation segment* (the writer found its file deleted or replaced) repeats the
           incarnation's start with ``seg`` (1, 2...), ``t`` when the segment began, and what the
           lost part said: ``ls``/``lb`` (the last step written and its end time), ``rs`` (the step
           the incarnation resumed from).
``prog``   step boundaries since the last line: ``s`` (first step), ``b0`` (end time of step ``s``),
           ``d`` (microseconds from each boundary to the next, for the following steps) or, when a
           step waited for data, ``dd``: the data wait inside each boundary's step interleaved with
           those gaps (``[wait0, d1, wait1, d2, wait2...]``, us); ``ss`` (explicit step numbers, only
           when they are not consecutive); when non-zero: ``w`` (written this many us after the last
           boundary), ``x`` (``[[i, n], ...]``: boundary ``i`` also stands for ``n`` earlier
           boundaries the tracker could not keep, their time included), ``mf`` (model FLOPs, 5
           digits); ``pk`` (dense peak FLOP/s) only when it changed since the incarnation's previous
           line; ``tk`` (tokens of each boundary's step: one integer when they are all the same, else
           one per boundary; absent when unknown), what the slowdown baseline scales with. The most
           frequent line, so the most compact (one list, not two, saves 9 bytes a line).
           Version 1 wrote ``d`` and ``dw``, one data wait total for the whole line.
``ckb``    checkpoint begin: ``t``, ``op`` (save|load), ``step``, ``path``
``cke``    checkpoint end: ``t``, ``op``, ``step``, ``ok``, ``bytes``, ``path``; ``man`` (true) when the
           tracker will write a manifest of the save (``babysitter.checkpoints``): a save whose manifest
           never appears did not complete
``ckv``    the manifest of a save was committed (``ok`` true) or could not be (``ok`` false, ``why``):
           ``t``, ``step``, ``path``, ``ok``, ``files``, ``bytes`` (what the manifest lists), ``alg``
           (the digest, or null for sizes only), ``mid`` (the manifest's own id), ``why``. Written by the
           tracker's manifest thread after the save's blocking part; readers before it skip the line as
           invalid (counted), nothing else
``phb``    phase begin: ``t``, ``name``;  ``phe`` phase end: ``t``, ``name``
``hang``   the watchdog saw no step: ``t``, ``step`` (last finished), ``since`` (us since that step)
``alive``  nothing else happened for a while: ``t`` (a sign of life, so downtime starts at the right time)
``renum``  the training loop's step numbers are not the tracker's: ``t``, ``by``; every step number
           this incarnation wrote before this line is ``by`` higher in the loop's numbering (a restart
           that did not call ``checkpoint_load``: the tracker counted from 0, the loop from its resume
           step; the tracker adopts the loop's numbers at the first one it is told)
``strg``   the straggler exchange named the rank the others wait for: ``t``, ``rank``, ``score`` (its
           work over the median rank's), ``host``, ``gpu``; ``rank`` null when no rank is slow any
           more. Written by rank 0 at a straggler round (every N steps), only while one is slow and
           once when none is; readers before it skip the line as invalid (counted), nothing else
``end``    the tracker closed: ``t``, ``clean``

Every integer (times, durations, steps, bytes, pids) lies in ``[0, MAX_INT]`` and every float (FLOPs)
in ``[0, MAX_FLOAT]``; a line with anything else is invalid and skipped, so one mutated value can
never break the arithmetic of the whole run.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from typing import Literal, TypeGuard

__all__ = [
    "FENCE_CHARS",
    "MAX_FLOAT",
    "MAX_INT",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "Alive",
    "CheckpointBegin",
    "CheckpointEnd",
    "CheckpointManifest",
    "End",
    "FencedLineError",
    "Hang",
    "Op",
    "PhaseBegin",
    "PhaseEnd",
    "Progress",
    "ProgressFields",
    "Record",
    "Renumber",
    "SchemaError",
    "Start",
    "Straggler",
    "decode",
    "encode",
    "fence_of",
    "fence_tag",
    "in_range",
    "progress_fields",
    "progress_work",
    "to_us",
]

SCHEMA_VERSION = 2

#: Versions this reader understands: 1 wrote one data wait per progress line and no fencing tags.
READABLE_VERSIONS = (1, 2)

#: Bound of every integer in a record (steps, times and durations in us, bytes, pids): the largest
#: integer a double holds exactly (JSON readers elsewhere) and far above any real value (year 2255).
MAX_INT = (1 << 53) - 1

#: Bound of every float in a record (FLOPs of a line, peak FLOP/s): finite, and far above any real value.
MAX_FLOAT = 1e30

#: Characters of the incarnation id a line carries as its writer's fencing tag (1 in 65,536 that two
#: writers of one takeover share a tag; then the fenced writer's lines count as the new one's).
FENCE_CHARS = 4

#: Longest string kept in a record (paths, phase names, info values); longer ones are cut.
MAX_STR = 1024

Op = Literal["save", "load"]


class SchemaError(ValueError):
    """A line is valid JSON but not a record this reader understands."""


class FencedLineError(ValueError):
    """A line written by a writer that another one had taken the lock over from."""


def to_us(seconds: float) -> int:
    """Unix seconds (``time.time()`` scale) to integer microseconds."""
    return round(seconds * 1_000_000)


def in_range(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an integer a record may hold (``0 <= value <= MAX_INT``, not a bool)."""
    return type(value) is int and 0 <= value <= MAX_INT


def fence_tag(incarnation_id: str) -> str:
    """The fencing tag the lines of the incarnation with this id carry."""
    return incarnation_id[:FENCE_CHARS]


def fence_of(obj: object) -> str | None:
    """The fencing tag of a parsed line (None when it has none: a start, or a version-1 line)."""
    if type(obj) is dict:
        tag = obj.get("f")
        return tag if isinstance(tag, str) else None
    return None


@dataclass(frozen=True)
class Start:
    """An incarnation began: ``t`` when the tracker started, ``pst`` when its process started.

    ``segment`` > 0: not a new incarnation but the continuation of incarnation ``id`` in a new file (its
    file was deleted or replaced); ``last_step``/``last_end`` is the last boundary the lost part held
    and ``resumed`` the step the incarnation had resumed from.
    """

    t: int
    pst: int
    id: str
    host: str
    pid: int
    run: str
    info: Mapping[str, object] = field(default_factory=dict)
    segment: int = 0
    last_step: int | None = None
    last_end: int | None = None
    resumed: int | None = None
    #: The absolute directory the ledger was written in (None: not recorded).
    directory: str | None = None


@dataclass(frozen=True)
class Progress:
    """Consecutive step boundaries: ``steps[i]`` ended at ``ends[i]`` (us).

    ``waits[i]``: data wait (us) inside step ``i``; when None, ``data_wait`` is the line's total
    (version 1), spread evenly. ``extra``: ``(i, n)`` pairs, boundary ``i`` stands for ``n`` more
    boundaries before it that were not kept one by one (their time is in its step).
    """

    t: int
    steps: tuple[int, ...]
    ends: tuple[int, ...]
    data_wait: int
    model_flops: float
    peak_flops: float | None
    waits: tuple[int, ...] | None = None
    extra: tuple[tuple[int, int], ...] = ()
    #: Tokens of each boundary's step (None: unknown); the slowdown baseline follows them.
    work: tuple[int, ...] | None = None


@dataclass(frozen=True)
class CheckpointBegin:
    """A checkpoint save or load started (its blocking part)."""

    t: int
    op: Op
    step: int
    path: str | None


@dataclass(frozen=True)
class CheckpointEnd:
    """A checkpoint save or load ended; ``ok`` is False when its body raised."""

    t: int
    op: Op
    step: int
    ok: bool
    nbytes: int | None
    path: str | None
    #: The tracker will write a manifest of this save (a save without one did not complete).
    manifest: bool = False


@dataclass(frozen=True)
class CheckpointManifest:
    """The manifest of the save of ``step`` at ``path`` was committed (``ok``) or could not be (``why``)."""

    t: int
    step: int
    path: str | None
    ok: bool
    files: int = 0
    nbytes: int = 0
    alg: str | None = None
    mid: str = ""
    why: str = ""


@dataclass(frozen=True)
class PhaseBegin:
    """A user-marked phase (eval, ...) started."""

    t: int
    name: str


@dataclass(frozen=True)
class PhaseEnd:
    """A user-marked phase ended."""

    t: int
    name: str


@dataclass(frozen=True)
class Hang:
    """No step finished for ``since`` us after ``step``; the gap after ``step`` counts as a hang."""

    t: int
    step: int
    since: int


@dataclass(frozen=True)
class Alive:
    """A sign of life with nothing else to say."""

    t: int


@dataclass(frozen=True)
class Renumber:
    """The step numbers this incarnation wrote so far are ``by`` lower than the training loop's."""

    t: int
    by: int


@dataclass(frozen=True)
class Straggler:
    """The straggler exchange's slowest rank (``rank`` None: no rank is slow any more)."""

    t: int
    rank: int | None
    score: float = 0.0
    host: str | None = None
    gpu: str | None = None


@dataclass(frozen=True)
class End:
    """The tracker closed; ``clean`` when training ended normally."""

    t: int
    clean: bool


Record = (
    Start
    | Progress
    | CheckpointBegin
    | CheckpointEnd
    | CheckpointManifest
    | PhaseBegin
    | PhaseEnd
    | Hang
    | Alive
    | Renumber
    | Straggler
    | End
)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_STR else text[:MAX_STR]


def _opt_str(value: object) -> str | None:
    return None if value is None else _cut(str(value))


def _info_value(value: object) -> object:
    """Info values are scalars: None, bools, in-range integers, finite floats, strings (cut)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else _cut(str(value))
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return _cut(str(value))


def _line(obj: dict[str, object]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False) + "\n").encode()


def _check(value: int, what: str) -> int:
    if not in_range(value):
        raise ValueError(f"{what} {value!r} is outside [0, {MAX_INT}]")
    return value


def _ints(values: Sequence[int], what: str) -> str:
    if values and (min(values) < 0 or max(values) > MAX_INT):
        raise ValueError(f"a {what} is outside [0, {MAX_INT}]")
    return ",".join(map(str, values))


def _flops_text(value: float) -> str | None:
    """FLOPs as a short JSON number (5 significant digits: plots need no more), None when not > 0."""
    if not (math.isfinite(value) and 0 < value <= MAX_FLOAT):
        return None
    return f"{value:.5g}"


def _progress_line(record: Progress, fence: str | None) -> bytes:
    """A progress line, built by hand: the most frequent line, kept short and fast to write."""
    ends, steps = record.ends, record.steps
    first = _check(steps[0], "step")
    deltas = [max(0, ends[i] - ends[i - 1]) for i in range(1, len(ends))]
    last = _check(_check(ends[0], "time") + sum(deltas), "time")
    waits = record.waits
    if waits is not None and len(waits) != len(ends):
        raise ValueError("one data wait per boundary")
    head = f'{{"v":{SCHEMA_VERSION},"k":"prog","s":{first},"b0":{ends[0]},'
    if waits is not None and any(waits):
        _ints(waits, "data wait")
        mixed = [waits[0], *chain.from_iterable(zip(deltas, waits[1:], strict=True))]
        parts = [head, f'"dd":[{_ints(mixed, "delta")}]']
    else:
        parts = [head, f'"d":[{_ints(deltas, "delta")}]']
    if list(steps) != list(range(first, first + len(steps))):
        parts.append(f',"ss":[{_ints(steps, "step")}]')
    else:
        _check(steps[-1], "step")
    if record.t > last:
        parts.append(f',"w":{_check(record.t - last, "write delay")}')
    if waits is None and record.data_wait > 0:
        parts.append(f',"dw":{_check(record.data_wait, "data wait")}')
    extra = [(i, _check(n, "extra boundaries")) for i, n in record.extra if 0 <= i < len(ends) and n > 0]
    if extra:
        parts.append(',"x":[' + ",".join(f"[{i},{n}]" for i, n in extra) + "]")
    flops = _flops_text(record.model_flops)
    if flops is not None:
        parts.append(f',"mf":{flops}')
    peak = None if record.peak_flops is None else _flops_text(record.peak_flops)
    if peak is not None:
        parts.append(f',"pk":{peak}')
    work = record.work
    if work is not None and len(work) == len(ends) and any(work):
        first_work = work[0]
        if all(w == first_work for w in work):
            parts.append(f',"tk":{_check(first_work, "tokens")}')
        else:
            parts.append(f',"tk":[{_ints(work, "tokens")}]')
    if fence is not None:
        parts.append(f',"f":{json.dumps(fence, ensure_ascii=True)}')
    parts.append("}\n")
    return "".join(parts).encode()


def encode(record: Record, *, fence: str | None = None) -> bytes:
    """One ledger line (ending in a newline) for ``record``, tagged with the writer's ``fence`` tag.

    ValueError when a field is out of range (such a line would be skipped by every reader).
    """
    if isinstance(record, Progress):
        return _progress_line(record, fence)
    head: dict[str, object] = {"v": SCHEMA_VERSION}
    if isinstance(record, Start):
        info = {_cut(str(k)): _info_value(v) for k, v in record.info.items()}
        head.update(
            k="start",
            t=_check(record.t, "time"),
            pst=_check(record.pst, "time"),
            id=_cut(record.id),
            host=_cut(record.host),
            pid=_check(record.pid, "pid"),
            run=_cut(record.run),
            info=info,
        )
        if record.directory is not None and len(record.directory) <= MAX_STR:
            head["dir"] = record.directory
        if record.segment:
            head["seg"] = _check(record.segment, "segment")
            if record.last_step is not None and record.last_end is not None:
                head.update(ls=_check(record.last_step, "step"), lb=_check(record.last_end, "time"))
            if record.resumed is not None:
                head["rs"] = _check(record.resumed, "step")
        return _line(head)  # a start carries its id, the source of its lines' tag
    if isinstance(record, CheckpointBegin):
        head.update(
            k="ckb",
            t=_check(record.t, "time"),
            op=record.op,
            step=_check(record.step, "step"),
            path=_opt_str(record.path),
        )
    elif isinstance(record, CheckpointEnd):
        head.update(
            k="cke",
            t=_check(record.t, "time"),
            op=record.op,
            step=_check(record.step, "step"),
            ok=record.ok,
            bytes=None if record.nbytes is None else _check(record.nbytes, "bytes"),
            path=_opt_str(record.path),
        )
        if record.manifest:
            head["man"] = True
    elif isinstance(record, CheckpointManifest):
        head.update(
            k="ckv",
            t=_check(record.t, "time"),
            step=_check(record.step, "step"),
            path=_opt_str(record.path),
            ok=record.ok,
            files=_check(record.files, "file count"),
            bytes=_check(record.nbytes, "bytes"),
            alg=_opt_str(record.alg),
            mid=_cut(record.mid)[:64],
        )
        if record.why:
            head["why"] = _cut(record.why)
    elif isinstance(record, PhaseBegin):
        head.update(k="phb", t=_check(record.t, "time"), name=_cut(record.name))
    elif isinstance(record, PhaseEnd):
        head.update(k="phe", t=_check(record.t, "time"), name=_cut(record.name))
    elif isinstance(record, Hang):
        head.update(
            k="hang",
            t=_check(record.t, "time"),
            step=_check(record.step, "step"),
            since=_check(record.since, "time"),
        )
    elif isinstance(record, Alive):
        head.update(k="alive", t=_check(record.t, "time"))
    elif isinstance(record, Renumber):
        head.update(k="renum", t=_check(record.t, "time"), by=_check(record.by, "step offset"))
    elif isinstance(record, Straggler):
        score = record.score if math.isfinite(record.score) and 0 <= record.score <= MAX_FLOAT else 0.0
        head.update(
            k="strg",
            t=_check(record.t, "time"),
            rank=None if record.rank is None else _check(record.rank, "rank"),
            score=round(score, 4),
            host=_opt_str(record.host),
            gpu=_opt_str(record.gpu),
        )
    else:
        head.update(k="end", t=_check(record.t, "time"), clean=record.clean)
    if fence is not None:
        head["f"] = fence
    return _line(head)


def _int(obj: Mapping[str, object], key: str) -> int:
    value = obj.get(key)
    if not in_range(value):
        raise SchemaError(f"{key!r} must be an integer in [0, {MAX_INT}]")
    return value


def _opt_int(obj: Mapping[str, object], key: str) -> int | None:
    value = obj.get(key)
    return None if value is None else _int(obj, key)


def _str(obj: Mapping[str, object], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise SchemaError(f"{key!r} must be a string")
    return value


def _opt_path(obj: Mapping[str, object]) -> str | None:
    value = obj.get("path")
    if value is not None and not isinstance(value, str):
        raise SchemaError("'path' must be a string or null")
    return value


def _op(obj: Mapping[str, object]) -> Op:
    value = obj.get("op")
    if value == "save":
        return "save"
    if value == "load":
        return "load"
    raise SchemaError("'op' must be 'save' or 'load'")


#: A progress line's content: ``(steps, ends, t, waits, model_flops, peak_flops, extra)``; ``waits`` is
#: one data wait per boundary, or an int, the line's total (version 1) to spread over its boundaries.
ProgressFields = tuple[
    Sequence[int], Sequence[int], int, Sequence[int] | int, float, float | None, Sequence[tuple[int, int]]
]


def _bounded_ints(values: object, what: str) -> array[int]:
    """``values`` as a C array of in-range integers (SchemaError otherwise), checked in C."""
    if type(values) is not list:
        raise SchemaError(f"{what!r} must be a list of integers in [0, {MAX_INT}]")
    try:
        packed = array("q", values)
    except (TypeError, OverflowError):
        raise SchemaError(f"{what!r} must be a list of integers in [0, {MAX_INT}]") from None
    if packed and (min(packed) < 0 or max(packed) > MAX_INT):
        raise SchemaError(f"{what!r} must be a list of integers in [0, {MAX_INT}]")
    return packed


def _flops(value: object, what: str) -> float:
    if type(value) not in (int, float) or not 0 <= value <= MAX_FLOAT:  # type: ignore[operator]
        raise SchemaError(f"{what!r} must be a number in [0, {MAX_FLOAT:g}]")
    return float(value)  # type: ignore[arg-type]


def _extra(value: object, n: int) -> list[tuple[int, int]]:
    if value is None:
        return []
    if type(value) is not list:
        raise SchemaError("'x' must list [boundary, count] pairs")
    out = []
    for pair in value:
        if type(pair) is not list or len(pair) != 2 or not in_range(pair[0]) or not in_range(pair[1]):
            raise SchemaError("'x' must list [boundary, count] pairs")
        if pair[0] >= n:
            raise SchemaError("'x' names a boundary the line does not have")
        out.append((pair[0], pair[1]))
    return out


def _packed(values: object, what: str) -> array[int]:
    """A JSON list of non-negative integers as a C array (upper bounds are the caller's)."""
    if type(values) is not list:
        raise SchemaError(f"{what!r} must be a list of integers in [0, {MAX_INT}]")
    try:
        packed = array("q", values)
    except (TypeError, OverflowError):
        raise SchemaError(f"{what!r} must be a list of integers in [0, {MAX_INT}]") from None
    if packed and min(packed) < 0:
        raise SchemaError(f"{what!r} must be a list of integers in [0, {MAX_INT}]")
    return packed


def progress_fields(obj: Mapping[str, object]) -> ProgressFields:
    """``(steps, ends, t, waits, model_flops, peak_flops, extra)`` of a progress line; SchemaError if bad.

    The most frequent line (a month-long ledger holds ~400k): exact type tests inline, lists checked
    in C (array, min/max), and every bound implied where it can be (gaps are bounded by the last end).
    """
    first, b0, written = obj.get("s"), obj.get("b0"), obj.get("w", 0)
    if (
        type(first) is not int
        or type(b0) is not int
        or type(written) is not int
        or first < 0
        or b0 < 0
        or written < 0
    ):
        raise SchemaError(f"a progress line needs integers 's', 'b0' (and 'w') in [0, {MAX_INT}]")
    waits: Sequence[int] | int
    mixed = obj.get("dd")
    if mixed is None:
        gaps = _packed(obj.get("d"), "d")
        total = obj.get("dw", 0)
        if type(total) is not int or not 0 <= total <= MAX_INT:
            raise SchemaError(f"'dw' must be an integer in [0, {MAX_INT}]")
        waits = total
    else:
        both = _packed(mixed, "dd")
        if len(both) % 2 == 0:
            raise SchemaError("'dd' must interleave one data wait per boundary with the gaps between them")
        waits, gaps = both[0::2], both[1::2]
        if max(waits) > MAX_INT:
            raise SchemaError(f"data waits must be integers in [0, {MAX_INT}]")
    try:
        ends = array("q", accumulate(gaps, initial=b0))
    except OverflowError:
        raise SchemaError(f"a progress line's times must stay within [0, {MAX_INT}]") from None
    n = len(ends)
    t = ends[-1] + written
    if t > MAX_INT:  # the ends never decrease: this bounds them all, and b0 and every gap
        raise SchemaError(f"a progress line's times must stay within [0, {MAX_INT}]")
    explicit = obj.get("ss")
    steps: Sequence[int]
    if explicit is None:
        if first + n - 1 > MAX_INT:
            raise SchemaError(f"steps must stay within [0, {MAX_INT}]")
        steps = range(first, first + n)
    else:
        steps = _bounded_ints(explicit, "ss")
        if len(steps) != n:
            raise SchemaError("'ss' must list one step per boundary")
    flops = obj.get("mf", 0.0)
    if (type(flops) is not float and type(flops) is not int) or not 0 <= flops <= MAX_FLOAT:
        raise SchemaError(f"'mf' must be a number in [0, {MAX_FLOAT:g}]")
    peak = obj.get("pk")
    extra = obj.get("x")
    return (
        steps,
        ends,
        t,
        waits,
        float(flops),
        None if peak is None else _flops(peak, "pk") or None,
        () if extra is None else _extra(extra, n),
    )


def progress_work(obj: Mapping[str, object], n: int) -> Sequence[int] | None:
    """Tokens of each of a progress line's ``n`` boundaries (``tk``), None when it has none;
    SchemaError when it is malformed."""
    value = obj.get("tk")
    if value is None:
        return None
    if type(value) is int:
        if not 0 <= value <= MAX_INT:
            raise SchemaError(f"'tk' must be an integer in [0, {MAX_INT}] or a list of them")
        return [value] * n
    work = _bounded_ints(value, "tk")
    if len(work) != n:
        raise SchemaError("'tk' must list one token count per boundary")
    return work


def _progress(obj: Mapping[str, object]) -> Progress:
    steps, ends, t, waits, flops, peak, extra = progress_fields(obj)
    work = progress_work(obj, len(ends))
    per_boundary = None if isinstance(waits, int) else tuple(waits)
    return Progress(
        t=t,
        steps=tuple(steps),
        ends=tuple(ends),
        data_wait=waits if isinstance(waits, int) else sum(waits),
        model_flops=flops,
        peak_flops=peak,
        waits=per_boundary,
        extra=tuple(extra),
        work=None if work is None else tuple(work),
    )


def _info(obj: Mapping[str, object]) -> dict[str, object]:
    info = obj.get("info") or {}
    if not isinstance(info, dict):
        raise SchemaError("'info' must be an object")
    # Only scalars, in range: the report prints them back as strict JSON.
    return {key: _info_value(value) for key, value in info.items() if not isinstance(value, dict | list)}


def _start(obj: Mapping[str, object], t: int) -> Start:
    segment = obj.get("seg", 0)
    if not in_range(segment):
        raise SchemaError(f"'seg' must be an integer in [0, {MAX_INT}]")
    last_step, last_end = _opt_int(obj, "ls"), _opt_int(obj, "lb")
    if (last_step is None) != (last_end is None):
        last_step = last_end = None
    directory = obj.get("dir")
    if not (isinstance(directory, str) and directory.startswith("/") and "\x00" not in directory):
        directory = None  # advisory: without it, absolute paths are read as in older ledgers
    return Start(
        t=t,
        pst=_int(obj, "pst"),
        id=_str(obj, "id"),
        host=_str(obj, "host"),
        pid=_int(obj, "pid"),
        run=_str(obj, "run"),
        info=_info(obj),
        segment=segment,
        last_step=last_step,
        last_end=last_end,
        resumed=_opt_int(obj, "rs"),
        directory=directory,
    )


def _straggler(obj: Mapping[str, object], t: int) -> Straggler:
    host, gpu = obj.get("host"), obj.get("gpu")
    if not isinstance(host, str | None) or not isinstance(gpu, str | None):
        raise SchemaError("'host' and 'gpu' must be strings or null")
    return Straggler(
        t=t,
        rank=_opt_int(obj, "rank"),
        score=_flops(obj.get("score", 0.0), "score"),
        host=None if host is None else _cut(host),
        gpu=None if gpu is None else _cut(gpu),
    )


def decode(obj: object) -> Record:
    """The record for one parsed JSON line; SchemaError when it is not a record this version reads."""
    if type(obj) is not dict:
        raise SchemaError("a record must be a JSON object")
    if obj.get("v") not in READABLE_VERSIONS:
        raise SchemaError(f"unsupported schema version {obj.get('v')!r}")
    kind = obj.get("k")
    if kind == "prog":
        return _progress(obj)
    t = _int(obj, "t")
    if kind == "start":
        return _start(obj, t)
    if kind == "ckb":
        return CheckpointBegin(t=t, op=_op(obj), step=_int(obj, "step"), path=_opt_path(obj))
    if kind == "cke":
        ok = obj.get("ok")
        if not isinstance(ok, bool):
            raise SchemaError("'ok' must be a boolean")
        return CheckpointEnd(
            t=t,
            op=_op(obj),
            step=_int(obj, "step"),
            ok=ok,
            nbytes=_opt_int(obj, "bytes"),
            path=_opt_path(obj),
            manifest=obj.get("man") is True,
        )
    if kind == "ckv":
        ok = obj.get("ok")
        if not isinstance(ok, bool):
            raise SchemaError("'ok' must be a boolean")
        alg, mid, why = obj.get("alg"), obj.get("mid", ""), obj.get("why", "")
        if alg is not None and not isinstance(alg, str):
            raise SchemaError("'alg' must be a string or null")
        if not isinstance(mid, str) or not isinstance(why, str):
            raise SchemaError("'mid' and 'why' must be strings")
        return CheckpointManifest(
            t=t,
            step=_int(obj, "step"),
            path=_opt_path(obj),
            ok=ok,
            files=_opt_int(obj, "files") or 0,
            nbytes=_opt_int(obj, "bytes") or 0,
            alg=alg,
            mid=mid,
            why=why,
        )
    if kind == "phb":
        return PhaseBegin(t=t, name=_str(obj, "name"))
    if kind == "phe":
        return PhaseEnd(t=t, name=_str(obj, "name"))
    if kind == "hang":
        return Hang(t=t, step=_int(obj, "step"), since=_int(obj, "since"))
    if kind == "alive":
        return Alive(t=t)
    if kind == "renum":
        return Renumber(t=t, by=_int(obj, "by"))
    if kind == "strg":
        return _straggler(obj, t)
    if kind == "end":
        clean = obj.get("clean")
        if not isinstance(clean, bool):
            raise SchemaError("'clean' must be a boolean")
        return End(t=t, clean=clean)
    raise SchemaError(f"unknown record kind {kind!r}")
