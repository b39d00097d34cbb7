"""What the node agent's sentinel found, written next to the run's ledger for the report and requeues.

The tracker holds the ledger's single-writer lock, so the sentinel never writes the ledger: when its
verdict on a checkpoint changes (verified, or corrupt and why) it appends one JSON line to
``babysitter-verdicts.jsonl`` in the run directory (``O_APPEND``, one ``write`` per line, 0644).
A digest mismatch found by a sentinel pass is thus known to ``babysitter report`` and to
``babysitter remediate``'s requeue without re-reading a terabyte. A verdict is tied to the manifest
it judged (its id): a checkpoint saved again under the same path starts clean.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from babysitter import jsonin
from babysitter.userfiles import open_regular

__all__ = ["VERDICTS_FILE", "Verdict", "append_verdict", "read_verdicts"]

VERDICTS_FILE = "babysitter-verdicts.jsonl"
_READ_TAIL = 4 << 20  # the newest verdicts are at the end; older ones are superseded anyway
_MAX_TEXT = 512
_MAX_LINE = 16 << 10  # a verdict line is at most ~6 KB (a 4,096-character path, 512-character texts)


@dataclass(frozen=True)
class Verdict:
    """The sentinel's verdict on one checkpoint (``ok`` False: ``reason``, ``file``, ``detail``)."""

    t: float
    step: int
    path: str
    mid: str
    ok: bool
    reason: str = ""
    file: str = ""
    detail: str = ""
    host: str = ""

    def to_json(self) -> dict[str, object]:
        """The line as written."""
        return {
            "v": 1,
            "t": round(self.t, 6),
            "host": self.host[:_MAX_TEXT],
            "step": self.step,
            "path": self.path[:4096],
            "mid": self.mid[:64],
            "ok": self.ok,
            "reason": self.reason[:64],
            "file": self.file[:_MAX_TEXT],
            "detail": self.detail[:_MAX_TEXT],
        }


def append_verdict(run_dir: Path, verdict: Verdict) -> None:
    """Append one verdict line (OSError when the run directory is not writable from here)."""
    if not verdict.host:
        verdict = Verdict(**{**verdict.__dict__, "host": socket.gethostname()})
    line = (json.dumps(verdict.to_json(), separators=(",", ":"), sort_keys=True) + "\n").encode()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(run_dir / VERDICTS_FILE, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device put there: never block on it
            raise OSError(errno.EINVAL, f"{VERDICTS_FILE} is not a regular file")
        os.write(fd, line)
    finally:
        os.close(fd)


def read_verdicts(run_dir: Path) -> dict[tuple[int, str], Verdict]:
    """The newest verdict per ``(step, path)``; a missing or unreadable file gives none (a FIFO or
    device in its place is not opened), a bad line (not JSON, nested deeper or longer than any
    verdict) is skipped."""
    try:
        with os.fdopen(open_regular(run_dir / VERDICTS_FILE), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - _READ_TAIL))
            data = fh.read(_READ_TAIL)
    except OSError:
        return {}
    out: dict[tuple[int, str], Verdict] = {}
    for line in data.split(b"\n"):
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError, OverflowError):
            obj = jsonin.loads(line, max_bytes=_MAX_LINE)
            step, path, ok = obj["step"], obj["path"], obj["ok"]
            if type(step) is not int or not isinstance(path, str) or not isinstance(ok, bool):
                continue
            t = obj.get("t", 0.0)
            out[(step, path)] = Verdict(
                t=float(t) if isinstance(t, (int, float)) else 0.0,
                step=step,
                path=path,
                mid=str(obj.get("mid", ""))[:64],
                ok=ok,
                reason=str(obj.get("reason", ""))[:64],
                file=str(obj.get("file", ""))[:_MAX_TEXT],
                detail=str(obj.get("detail", ""))[:_MAX_TEXT],
                host=str(obj.get("host", ""))[:_MAX_TEXT],
            )
    return out
