"""What ``babysitter remediate`` did to a run, read back from the notes it leaves next to the ledger.

The remediator never writes the ledger (a live tracker holds its single-writer lock); it appends one
JSON line per requeue to ``remediations.jsonl`` in the run directory. This module reads those notes
and ties each to the restart it caused, so the report can say why a restart happened and how long
detecting and recovering took.

The notes file is written by another program, possibly on another host, into a directory other users
may write: it is untrusted. At most the last :data:`MAX_BYTES` are read (older notes are left out and
counted), a line longer than :data:`MAX_LINE` or one that is not a note this version reads is skipped
and counted, and nothing in it can make the report fail: an unreadable file is an error string.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from babysitter import jsonin

__all__ = [
    "CLOCK_SKEW",
    "KILL_LAG",
    "MAX_BYTES",
    "MAX_LINE",
    "MAX_TEXT",
    "NOTES_FILE",
    "NOTE_VERSION",
    "Notes",
    "RemediationNote",
    "match_restarts",
    "note_text",
    "read_notes",
]

#: The notes' file name in the run directory.
NOTES_FILE = "remediations.jsonl"
#: The schema version of a note line (``"v"``).
NOTE_VERSION = 1
#: How much of the file's end is read: about 2,000 notes, far more than any run's restarts.
MAX_BYTES = 1024 * 1024
#: Longest line read; a note is about 500 bytes (its checkpoint path may take up to 1024 more).
MAX_LINE = 8192
#: Notes kept after reading (the newest).
MAX_NOTES = 10_000
#: Seconds a note may be stamped after the restart it caused (the remediator's and the training
#: host's clocks differ by this much at most; NTP keeps them within milliseconds).
CLOCK_SKEW = 2.0
#: Seconds a dying incarnation may go on writing after the requeue that ends it (Slurm's KillWait and
#: Kubernetes' grace period are 30 s by default, plus a flush interval): a note older than this
#: before the incarnation's last sign of life did not end it.
KILL_LAG = 600.0

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: Longest text field a note may carry.
MAX_TEXT = 256
_MAX_TIME = 2.0**33  # year 2242: a Unix time past it is a corrupt one


@dataclass(frozen=True)
class RemediationNote:
    """One remediation of the run (times in Unix seconds, by the remediator's and Prometheus' clocks)."""

    #: When the remediator acted (just before it ran the scheduler's command).
    t: float
    action: str
    #: The restart's cause in words: ``remediated: drained host n1 after Xid 79, requeued job 12``.
    cause: str
    alert: str
    #: When the alert started (Alertmanager's ``startsAt``: Prometheus first saw the condition).
    alert_start: float | None = None
    job: str | None = None
    host: str | None = None
    drained: str | None = None
    #: The last complete checkpoint the ledger listed when the job was requeued.
    resume_step: int | None = None

    @property
    def time_to_detect(self) -> float | None:
        """Seconds from the alert's start to the action (None without an alert start)."""
        return None if self.alert_start is None else self.t - self.alert_start

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return dict(self.__dict__)


@dataclass
class Notes:
    """The notes read from a run directory, oldest first, and what was left out."""

    notes: list[RemediationNote] = field(default_factory=list)
    #: Lines skipped, by reason: ``torn`` (not JSON), ``invalid`` (not a note this version reads),
    #: ``too_long``, ``other_run`` (a note for another run), ``not_read`` (before the last MAX_BYTES).
    skipped: dict[str, int] = field(default_factory=dict)
    #: Why the file could not be read (None: read, or absent).
    error: str | None = None

    def skip(self, reason: str, n: int = 1) -> None:
        """Count ``n`` skipped lines."""
        self.skipped[reason] = self.skipped.get(reason, 0) + n


def note_text(value: str) -> str:
    """``value`` as a note may carry it: control characters dropped, at most MAX_TEXT characters (the
    writer's side of what :func:`read_notes` accepts)."""
    return _CONTROL.sub("", value)[:MAX_TEXT]


def _text(value: object) -> str:
    """A bounded printable string; ValueError otherwise (a note's text reaches a terminal)."""
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT or _CONTROL.search(value):
        raise ValueError(f"not a printable string of 1-{MAX_TEXT} characters")
    return value


def _maybe_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _time(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("not a number")
    if not (math.isfinite(value) and 0 < value < _MAX_TIME):
        raise ValueError("not a Unix time")
    return float(value)


def _note(obj: object) -> tuple[str, RemediationNote]:
    """``(run, note)`` of one parsed line; ValueError when it is not a version-1 note."""
    if not isinstance(obj, dict) or obj.get("v") != NOTE_VERSION:
        raise ValueError("not a version-1 note")
    step = obj.get("resume_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**53):
        raise ValueError("resume_step out of range")
    start = obj.get("alert_start")
    note = RemediationNote(
        t=_time(obj.get("t")),
        action=_text(obj.get("action")),
        cause=_text(obj.get("cause")),
        alert=_text(obj.get("alert")),
        alert_start=None if start is None else _time(start),
        job=_maybe_text(obj.get("job")),
        host=_maybe_text(obj.get("host")),
        drained=_maybe_text(obj.get("drained")),
        resume_step=step,
    )
    return _text(obj.get("run")), note


def _read_tail(path: Path, notes: Notes) -> bytes | None:
    """The last MAX_BYTES of a regular file (whole lines); None when absent or unreadable."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.error = f"cannot open {path}: {exc.strerror or exc}"
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            notes.error = f"{path} is not a regular file"
            return None
        offset = max(0, info.st_size - MAX_BYTES)
        data = os.pread(fd, MAX_BYTES, offset)
    except OSError as exc:
        notes.error = f"cannot read {path}: {exc.strerror or errno.errorcode.get(exc.errno or 0, exc)}"
        return None
    finally:
        os.close(fd)
    if offset:
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
        notes.skip("not_read")  # at least one line (the cut one), likely many
    return data


def read_notes(run_dir: Path, *, run: str | None = None, file_name: str = NOTES_FILE) -> Notes:
    """The remediation notes in ``run_dir`` for ``run`` (any run when None), oldest first.

    Never raises: an absent file gives no notes, an unreadable one no notes and :attr:`Notes.error`.
    """
    notes = Notes()
    data = _read_tail(Path(run_dir) / file_name, notes)
    if not data:
        return notes
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    found: list[RemediationNote] = []
    for raw in lines:
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE:
            notes.skip("too_long")
            continue
        try:
            obj = jsonin.loads(raw, max_bytes=MAX_LINE)
        except ValueError:
            notes.skip("torn")
            continue
        try:
            note_run, note = _note(obj)
        except (ValueError, TypeError, OverflowError):
            notes.skip("invalid")
            continue
        if run is not None and note_run != run:
            notes.skip("other_run")
            continue
        found.append(note)
    if len(found) > MAX_NOTES:
        notes.skip("not_read", len(found) - MAX_NOTES)
        found = found[-MAX_NOTES:]
    found.sort(key=lambda n: n.t)
    notes.notes = found
    return notes


def match_restarts(
    notes: Sequence[RemediationNote], incarnations: Sequence[tuple[float, float]]
) -> Mapping[int, RemediationNote]:
    """Which note caused which restart: incarnation index -> note.

    ``incarnations`` are ``(begin, last sign of life)`` in Unix seconds, in order. Incarnation ``k``
    (a restart, ``k >= 1``) was caused by the newest note stamped after incarnation ``k-1`` began, at
    most :data:`CLOCK_SKEW` after incarnation ``k`` began, and at most :data:`KILL_LAG` before
    incarnation ``k-1``'s last sign of life (a requeue ends the process it remediates). Each note
    causes at most one restart.
    """
    times = [n.t for n in notes]
    used: set[int] = set()
    out: dict[int, RemediationNote] = {}
    for k in range(1, len(incarnations)):
        prev_begin, prev_last = incarnations[k - 1]
        lo = max(prev_begin, prev_last - KILL_LAG)
        hi = incarnations[k][0] + CLOCK_SKEW
        i = bisect_right(times, hi) - 1
        while i >= 0 and times[i] > lo and i in used:
            i -= 1
        if i >= 0 and times[i] > lo:
            used.add(i)
            out[k] = notes[i]
    return out
