"""The append-only audit log: one JSON line per decision (what, why, which alert, the commands, the result).

The file is opened ``O_APPEND`` (every line lands whole at the end, whatever else writes), created
``0600`` (it names hosts and jobs), and each line is flushed and fsynced before the action it records
is reported done. It is also the remediator's memory: at start, :func:`replay` reads it back so that a
restarted remediator keeps its rate limit, drain cap and idempotency (an alert acted on before the
restart is not acted on again).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from babysitter import jsonout

__all__ = ["AuditLog", "replay"]

log = logging.getLogger(__name__)

SCHEMA = 1
#: How much of an existing log is read back at start (its tail): far more than any rail's window.
REPLAY_BYTES = 64 * 1024 * 1024


class AuditLog:
    """Appends records to ``path``; raises OSError at construction when the file cannot be opened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = (
            os.O_WRONLY
            | os.O_APPEND
            | os.O_CREAT
            | getattr(os, "O_CLOEXEC", 0)
            | getattr(os, "O_NOFOLLOW", 0)
        )
        self._fd = os.open(path, flags, 0o600)
        self._lock = threading.Lock()
        self.write_errors = 0

    def write(self, event: str, *, t: float | None = None, **fields: Any) -> dict[str, Any]:
        """Append one record (``t``, ``event`` and ``fields``); a write error is logged, never raised."""
        when = time.time() if t is None else t
        record: dict[str, Any] = {"v": SCHEMA, "t": round(when, 6), "event": event, **fields}
        line = (jsonout.dumps(record, separators=(",", ":"), sort_keys=True, default=str) + "\n").encode()
        with self._lock:
            try:
                os.write(self._fd, line)
                os.fsync(self._fd)
            except OSError as exc:
                self.write_errors += 1
                if self.write_errors == 1:
                    log.error("babysitter remediate: cannot write the audit log %s: %s", self.path, exc)
        return record

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def replay(path: Path) -> Iterator[dict[str, Any]]:
    """The records of an existing log, oldest first (a torn or foreign line is skipped)."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > REPLAY_BYTES:
                fh.seek(size - REPLAY_BYTES)
                fh.readline()  # a partial line
            data = fh.read()
    except FileNotFoundError:
        return
    for raw in data.splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and record.get("v") == SCHEMA
            and isinstance(record.get("t"), (int, float))
        ):
            yield record
