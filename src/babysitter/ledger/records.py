"""The ledger's on-disk schema (version 1): one JSON object per line, times in integer microseconds.

Integer microseconds (not float seconds) make the accounting exact: every duration is a difference of
integers, so productive + badput == wall time holds to the microsecond with no float drift. Keys are
short because a 30-day run writes hundreds of thousands of lines.

Every line carries ``"v"`` (schema version) and ``"k"`` (kind). Kinds:

``start``  an incarnation (process) began tracking the run: ``t``, ``pst`` (process start), ``id``
           (random incarnation id), ``host``, ``pid``, ``run``, ``info`` (free-form: world size, version...)
``prog``   step boundaries since the last line: ``s`` (first step), ``b0`` (end time of step ``s``),
           ``d`` (microseconds from each boundary to the next, for the following steps), ``ss``
           (explicit step numbers, only when they are not consecutive); when non-zero: ``w`` (written
           this many us after the last boundary), ``dw`` (data wait, us), ``mf`` (model FLOPs, 7
           digits); ``pk`` (dense peak FLOP/s) only when it changed since the incarnation's previous
           line. The most frequent line, so the most compact.
``ckb``    checkpoint begin: ``t``, ``op`` (save|load), ``step``, ``path``
``cke``    checkpoint end: ``t``, ``op``, ``step``, ``ok``, ``bytes``, ``path``
``phb``    phase begin: ``t``, ``name``;  ``phe`` phase end: ``t``, ``name``
``hang``   the watchdog saw no step: ``t``, ``step`` (last finished), ``since`` (us since that step)
``alive``  nothing else happened for a while: ``t`` (a sign of life, so downtime starts at the right time)
``end``    the tracker closed: ``t``, ``clean``
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal

__all__ = [
    "SCHEMA_VERSION",
    "Alive",
    "CheckpointBegin",
    "CheckpointEnd",
    "End",
    "Hang",
    "PhaseBegin",
    "PhaseEnd",
    "Progress",
    "ProgressFields",
    "Record",
    "SchemaError",
    "Start",
    "decode",
    "encode",
    "progress_fields",
    "to_us",
]

SCHEMA_VERSION = 1

#: Longest string kept in a record (paths, phase names, info values); longer ones are cut.
MAX_STR = 1024

Op = Literal["save", "load"]


class SchemaError(ValueError):
    """A line is valid JSON but not a record this reader understands."""


def to_us(seconds: float) -> int:
    """Unix seconds (``time.time()`` scale) to integer microseconds."""
    return round(seconds * 1_000_000)


@dataclass(frozen=True)
class Start:
    """An incarnation began: ``t`` when the tracker started, ``pst`` when its process started."""

    t: int
    pst: int
    id: str
    host: str
    pid: int
    run: str
    info: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Progress:
    """Consecutive step boundaries: ``steps[i]`` ended at ``ends[i]`` (us)."""

    t: int
    steps: tuple[int, ...]
    ends: tuple[int, ...]
    data_wait: int
    model_flops: float
    peak_flops: float | None


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
class End:
    """The tracker closed; ``clean`` when training ended normally."""

    t: int
    clean: bool


Record = Start | Progress | CheckpointBegin | CheckpointEnd | PhaseBegin | PhaseEnd | Hang | Alive | End


def _cut(text: str) -> str:
    return text if len(text) <= MAX_STR else text[:MAX_STR]


def _opt_str(value: object) -> str | None:
    return None if value is None else _cut(str(value))


def _info_value(value: object) -> object:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return _cut(str(value))


def _line(obj: dict[str, object]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False) + "\n").encode()


def encode(record: Record) -> bytes:
    """One ledger line (ending in a newline) for ``record``."""
    head: dict[str, object] = {"v": SCHEMA_VERSION}
    if isinstance(record, Progress):
        ends = record.ends
        head.update(k="prog", s=record.steps[0], b0=ends[0])
        deltas = [max(0, ends[i] - ends[i - 1]) for i in range(1, len(ends))]
        head["d"] = deltas
        first = record.steps[0]
        if any(step != first + i for i, step in enumerate(record.steps)):
            head["ss"] = list(record.steps)
        written = record.t - (ends[0] + sum(deltas))
        if written:
            head["w"] = written
        if record.data_wait > 0:
            head["dw"] = record.data_wait
        if math.isfinite(record.model_flops) and record.model_flops > 0:
            head["mf"] = float(f"{record.model_flops:.7g}")
        peak = record.peak_flops
        if peak is not None and math.isfinite(peak) and peak > 0:
            head["pk"] = float(f"{peak:.7g}")
    elif isinstance(record, Start):
        info = {_cut(str(k)): _info_value(v) for k, v in record.info.items()}
        head.update(
            k="start",
            t=record.t,
            pst=record.pst,
            id=record.id,
            host=_cut(record.host),
            pid=record.pid,
            run=_cut(record.run),
            info=info,
        )
    elif isinstance(record, CheckpointBegin):
        head.update(k="ckb", t=record.t, op=record.op, step=record.step, path=_opt_str(record.path))
    elif isinstance(record, CheckpointEnd):
        head.update(
            k="cke",
            t=record.t,
            op=record.op,
            step=record.step,
            ok=record.ok,
            bytes=record.nbytes,
            path=_opt_str(record.path),
        )
    elif isinstance(record, PhaseBegin):
        head.update(k="phb", t=record.t, name=_cut(record.name))
    elif isinstance(record, PhaseEnd):
        head.update(k="phe", t=record.t, name=_cut(record.name))
    elif isinstance(record, Hang):
        head.update(k="hang", t=record.t, step=record.step, since=record.since)
    elif isinstance(record, Alive):
        head.update(k="alive", t=record.t)
    else:
        head.update(k="end", t=record.t, clean=record.clean)
    return _line(head)


def _int(obj: Mapping[str, object], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise SchemaError(f"{key!r} must be an integer")
    return value


def _opt_int(obj: Mapping[str, object], key: str) -> int | None:
    value = obj.get(key)
    return None if value is None else _int(obj, key)


def _num(obj: Mapping[str, object], key: str) -> float:
    value = obj.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise SchemaError(f"{key!r} must be a number")
    return float(value)


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


#: A progress line's content: ``(steps, ends, t, data_wait, model_flops, peak_flops)``.
ProgressFields = tuple[Sequence[int], Sequence[int], int, int, float, float | None]


def progress_fields(obj: Mapping[str, object]) -> ProgressFields:
    """``(steps, ends, t, data_wait, model_flops, peak_flops)`` of a progress line; SchemaError if bad.

    The most frequent line: checked with exact type tests and the deltas in C (array), no generators.
    """
    first, b0, written, deltas = obj.get("s"), obj.get("b0"), obj.get("w", 0), obj.get("d")
    if type(first) is not int or type(b0) is not int or type(written) is not int or type(deltas) is not list:
        raise SchemaError("a progress line needs integers 's', 'b0' and a list 'd'")
    try:
        packed = array("q", deltas)
    except (TypeError, OverflowError):
        raise SchemaError("'d' must be a list of non-negative integers") from None
    if deltas and min(packed) < 0:
        raise SchemaError("'d' must be a list of non-negative integers")
    ends = tuple(accumulate(packed, initial=b0))
    explicit = obj.get("ss")
    steps: Sequence[int]
    if explicit is None:
        steps = range(first, first + len(ends))
    else:
        try:
            steps = array("q", explicit)  # type: ignore[call-overload]
        except (TypeError, OverflowError):
            raise SchemaError("'ss' must list one integer step per boundary") from None
        if len(steps) != len(ends):
            raise SchemaError("'ss' must list one integer step per boundary")
    wait = obj.get("dw", 0)
    flops = obj.get("mf", 0.0)
    peak = obj.get("pk")
    if type(wait) is not int:
        raise SchemaError("'dw' must be an integer")
    if type(flops) not in (int, float) or (peak is not None and type(peak) not in (int, float)):
        raise SchemaError("'mf' and 'pk' must be numbers")
    return (
        steps,
        ends,
        ends[-1] + written,
        wait if wait > 0 else 0,
        float(flops),  # type: ignore[arg-type]
        None if peak is None else float(peak),  # type: ignore[arg-type]
    )


def _progress(obj: Mapping[str, object]) -> Progress:
    steps, ends, t, wait, flops, peak = progress_fields(obj)
    return Progress(
        t=t, steps=tuple(steps), ends=tuple(ends), data_wait=wait, model_flops=flops, peak_flops=peak
    )


def decode(obj: object) -> Record:
    """The record for one parsed JSON line; SchemaError when it is not a version-1 record."""
    if not isinstance(obj, dict):
        raise SchemaError("a record must be a JSON object")
    if obj.get("v") != SCHEMA_VERSION:
        raise SchemaError(f"unsupported schema version {obj.get('v')!r}")
    kind = obj.get("k")
    if kind == "prog":
        return _progress(obj)
    t = _int(obj, "t")
    if kind == "start":
        info = obj.get("info") or {}
        if not isinstance(info, dict):
            raise SchemaError("'info' must be an object")
        return Start(
            t=t,
            pst=_int(obj, "pst"),
            id=_str(obj, "id"),
            host=_str(obj, "host"),
            pid=_int(obj, "pid"),
            run=_str(obj, "run"),
            info=info,
        )
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
        )
    if kind == "phb":
        return PhaseBegin(t=t, name=_str(obj, "name"))
    if kind == "phe":
        return PhaseEnd(t=t, name=_str(obj, "name"))
    if kind == "hang":
        return Hang(t=t, step=_int(obj, "step"), since=_int(obj, "since"))
    if kind == "alive":
        return Alive(t=t)
    if kind == "end":
        clean = obj.get("clean")
        if not isinstance(clean, bool):
            raise SchemaError("'clean' must be a boolean")
        return End(t=t, clean=clean)
    raise SchemaError(f"unknown record kind {kind!r}")
