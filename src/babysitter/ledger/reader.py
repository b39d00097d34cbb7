"""Reading a ledger that a killed process may have left torn: bad lines are skipped and counted.

A line counts as *torn* when it is the unterminated last line of the file (SIGKILL or a full disk
mid-write) or when it does not parse as JSON (a torn line that a later writer terminated with its
own newline), when it is longer than :data:`MAX_LINE` (skipped unparsed), or nested too deep to parse
(no writer writes either; a line read on its own is parsed only within :mod:`babysitter.jsonin`'s
bounds); *invalid* when it is JSON but not a record this version understands (an unknown kind, a
missing field, a value out of range); *fenced* when a writer wrote it after another writer had taken
the lock over (its tag is not the newest start's).

A ledger is read whole only up to :data:`MAX_LEDGER_BYTES` and only when it is a regular file (a FIFO
or a device in its place is an OSError, never a reader blocked forever).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from babysitter import jsonin
from babysitter.ledger.records import (
    CheckpointEnd,
    FencedLineError,
    Record,
    Start,
    decode,
    fence_of,
    fence_tag,
)
from babysitter.ledger.saves import SaveLog
from babysitter.ledger.timeline import Timeline
from babysitter.userfiles import read_regular

__all__ = [
    "DEFAULT_FILE_NAME",
    "MAX_LEDGER_BYTES",
    "MAX_LINE",
    "MAX_SAVE_LINE",
    "CheckpointRecord",
    "LedgerFile",
    "completed_checkpoints",
    "parse_ledger",
    "read_ledger",
    "read_saves",
    "read_timeline",
]

log = logging.getLogger(__name__)

#: The ledger's file name in the run directory unless configured otherwise.
DEFAULT_FILE_NAME = "babysitter-ledger.jsonl"

#: Longest ledger line parsed. The writer's longest line is a progress line of every step of one
#: flush interval (~30 bytes a step: 5 s at 20,000 steps/s is 3 MB); longer ones are skipped as torn.
MAX_LINE = 16 << 20

#: Longest line of a save's story parsed (start, checkpoint and end lines: a path of at most 1,024
#: characters and a few numbers; a start's ``info`` a few dozen scalars).
MAX_SAVE_LINE = 64 << 10

#: Largest ledger read whole: 20 times a month-long run's (47 MB, ``benchmarks/results/ledger.md``).
MAX_LEDGER_BYTES = 1 << 30


@dataclass
class LedgerFile:
    """The records of a ledger file in file order, and what was skipped on the way."""

    records: list[Record] = field(default_factory=list)
    torn_lines: int = 0
    invalid_lines: int = 0
    fenced_lines: int = 0
    size: int = 0
    ends_with_newline: bool = True


#: What a line may raise on its way into a record or a timeline besides SchemaError: nothing should
#: (fields are checked before anything is folded in), but one line must never cost the whole ledger.
_BAD_LINE = (ValueError, TypeError, ArithmeticError, LookupError)


def _parse(
    data: bytes,
    consume: Callable[[object], None],
    only: tuple[bytes, ...] | None = None,
    max_line: int = MAX_LINE,
) -> LedgerFile:
    """Split ``data`` into lines and hand each parsed line to ``consume`` (SchemaError = invalid,
    FencedLineError = fenced); lines longer than ``max_line`` or nested too deep count as torn."""
    out = LedgerFile(size=len(data), ends_with_newline=not data or data.endswith(b"\n"))
    lines = data.split(b"\n")
    if out.ends_with_newline:
        lines.pop()  # the empty piece after the final newline
    else:
        tail = lines.pop()
        if tail.strip(b"\x00 \t\r"):
            out.torn_lines += 1
    if only is not None:
        lines = [raw for raw in lines if any(key in raw for key in only)]
    if lines and max(map(len, lines)) > max_line:  # checked in C; a rare ledger pays for the filter
        kept = [raw for raw in lines if len(raw) <= max_line]
        out.torn_lines += len(lines) - len(kept)
        lines = kept
    block = 4096
    for k in range(0, len(lines), block):
        chunk = [raw for raw in lines[k : k + block] if raw]
        try:
            # One parse per block (C speed); any odd line sends the block down the careful path, where
            # each line's size and depth are checked before it is parsed. (Checking the block's depth
            # first would cost 7.5 % of a read; a block nested past the interpreter's limit fails
            # with RecursionError at once, and is read line by line like any other odd block.)
            objs = json.loads(b"[" + b",".join(chunk) + b"]")
            if len(objs) != len(chunk):
                raise ValueError("line count mismatch")
        except (ValueError, RecursionError):
            objs = []
            for raw in chunk:
                if not raw.strip(b"\x00 \t\r"):
                    continue
                try:
                    objs.append(jsonin.loads(raw, max_bytes=max_line))
                except ValueError:
                    out.torn_lines += 1
        for obj in objs:
            try:
                consume(obj)
            except FencedLineError:
                out.fenced_lines += 1
            except _BAD_LINE:
                out.invalid_lines += 1
    return out


class _Records:
    """Decoded records in file order, without the lines of writers another writer fenced off."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self._fence: str | None = None

    def __call__(self, obj: object) -> None:
        record = decode(obj)
        if isinstance(record, Start):
            self._fence = fence_tag(record.id)
        else:
            tag = fence_of(obj)
            if tag is not None and tag != self._fence:
                raise FencedLineError("written after another writer took the ledger over")
        self.records.append(record)


def _read_regular(path: Path) -> bytes:
    """The file's bytes; OSError when it is not a regular file (a device or FIFO never ends, and is
    never opened) or is larger than :data:`MAX_LEDGER_BYTES`."""
    return read_regular(path, limit=MAX_LEDGER_BYTES)


def read_ledger(path: Path) -> LedgerFile:
    """All readable records of the ledger at ``path`` (an empty ledger when the file does not exist).

    Raises OSError only when the file exists but cannot be read.
    """
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        return LedgerFile()
    return parse_ledger(data)


def parse_ledger(data: bytes) -> LedgerFile:
    """The records in ledger bytes (what :func:`read_ledger` does after reading the file)."""
    records = _Records()
    out = _parse(data, records)
    out.records = records.records
    return out


def read_timeline(path: Path, *, keep_points: bool = True) -> tuple[Timeline, LedgerFile]:
    """The ledger at ``path`` folded straight into a timeline (the fast path for big ledgers), and the
    read statistics (``records`` left empty). Raises OSError only when the file cannot be read."""
    timeline = Timeline(keep_points=keep_points)
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        return timeline, LedgerFile()
    return timeline, _parse(data, timeline.add_raw)


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint save that the ledger says completed."""

    step: int
    path: str | None
    nbytes: int | None
    time: float
    #: The directory the ledger was written in (see :func:`babysitter.ledger.paths.resolve`).
    origin: str | None = None


def completed_checkpoints(run_dir: Path, *, file_name: str = DEFAULT_FILE_NAME) -> list[CheckpointRecord]:
    """Checkpoint saves the run's ledger records as completed (``ok``), newest last.

    For the node agent's checkpoint sentinel, which checks that these still exist with their size.
    ``time`` is the Unix time (seconds) the save ended; ``path``/``nbytes`` are what the training script
    passed (None when it passed nothing), the path as the ledger stores it (relative to the run
    directory when inside it: :func:`babysitter.ledger.paths.resolve` says where it is now). Only
    lines of checkpoint ends are parsed, so this stays fast on a month-long ledger. An absent ledger
    gives an empty list; torn lines are skipped. Raises OSError only when the ledger exists but cannot
    be read.
    """
    try:
        data = _read_regular(run_dir / file_name)
    except FileNotFoundError:
        return []
    records = _Records()
    _parse(data, records, only=(b'"k":"cke"', b'"k":"start"'), max_line=MAX_SAVE_LINE)
    found = []
    origin: str | None = None
    for r in records.records:
        if isinstance(r, Start):
            origin = r.directory
        elif isinstance(r, CheckpointEnd) and r.op == "save" and r.ok:
            found.append(CheckpointRecord(r.step, r.path, r.nbytes, r.t / 1_000_000, origin))
    found.sort(key=lambda c: c.time)
    return found


#: The lines a save's story is told in (what :func:`read_saves` parses; the rest is skipped unparsed).
SAVE_KINDS = (b'"k":"ckb"', b'"k":"cke"', b'"k":"ckv"', b'"k":"start"', b'"k":"end"')


def read_saves(run_dir: Path, *, file_name: str = DEFAULT_FILE_NAME) -> SaveLog:
    """The run's checkpoint saves (completed and aborted, with their manifests' fate) from its ledger.

    Only the lines of :data:`SAVE_KINDS` are parsed, so this stays fast on a month-long ledger. An
    absent ledger gives an empty log; raises OSError only when the ledger exists but cannot be read.
    """
    log_ = SaveLog()
    try:
        data = _read_regular(run_dir / file_name)
    except FileNotFoundError:
        return log_
    records = _Records()
    _parse(data, records, only=SAVE_KINDS, max_line=MAX_SAVE_LINE)
    for record in records.records:
        log_.add(record)
    return log_
