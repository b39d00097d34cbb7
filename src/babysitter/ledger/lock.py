"""One live writer per run: a lock file with host, pid and a heartbeat, safe on NFS and Lustre.

``flock`` is unreliable on network file systems, so the lock is a small JSON file next to the ledger:
created with ``link()`` (atomic even on NFS: a temp file is hard-linked to the lock name, which fails
when the name exists), refreshed by the writer every few seconds, and considered stale when its owner
is gone: on the same host when its pid (with the same process start time) no longer runs, on another
host when its heartbeat is older than ``stale_after``. A stale lock is taken over by atomic replace and
read back; a writer that later finds someone else's token in the lock stops writing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["LedgerLockedError", "LockInfo", "WriterLock", "lock_is_live", "read_lock"]

_VERSION = 1


class LedgerLockedError(RuntimeError):
    """Another live process is already writing this run's ledger."""


@dataclass(frozen=True)
class LockInfo:
    """What a lock file says about its writer."""

    host: str
    pid: int
    pst: float
    token: str
    heartbeat: float
    run: str


def read_lock(path: Path) -> LockInfo | None:
    """The lock at ``path``; None when absent or unreadable (a half-written lock is no lock)."""
    try:
        obj = json.loads(path.read_bytes())
        return LockInfo(
            host=str(obj["host"]),
            pid=int(obj["pid"]),
            pst=float(obj["pst"]),
            token=str(obj["token"]),
            heartbeat=float(obj["heartbeat"]),
            run=str(obj.get("run", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _process_alive(pid: int, pst: float) -> bool:
    try:
        return bool(abs(float(psutil.Process(pid).create_time()) - pst) < 1.0)
    except (psutil.Error, OSError):
        return False


def lock_is_live(info: LockInfo, *, stale_after: float, now: float | None = None) -> bool:
    """Whether the lock's writer should be taken as alive."""
    if info.host == socket.gethostname():
        return _process_alive(info.pid, info.pst)
    now = time.time() if now is None else now
    return now - info.heartbeat < stale_after


class WriterLock:
    """This process's claim on a run's ledger."""

    def __init__(self, path: Path, *, run: str, stale_after: float) -> None:
        self.path = path
        self.run = run
        self.stale_after = stale_after
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.pid = os.getpid()
        try:
            self.pst = float(psutil.Process(self.pid).create_time())
        except (psutil.Error, OSError):  # pragma: no cover - our own process is always there
            self.pst = 0.0
        self.held = False

    def _payload(self) -> bytes:
        return json.dumps(
            {
                "v": _VERSION,
                "host": self.host,
                "pid": self.pid,
                "pst": self.pst,
                "token": self.token,
                "heartbeat": time.time(),
                "run": self.run,
            }
        ).encode()

    def _write_temp(self) -> Path:
        tmp = self.path.with_name(f".{self.path.name}.{self.token}.{time.monotonic_ns()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, self._payload())
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def acquire(self) -> None:
        """Claim the ledger; LedgerLockedError when another live writer holds it, OSError when the
        directory cannot be written (the caller keeps going without a lock and retries)."""
        tmp = self._write_temp()
        try:
            try:
                os.link(tmp, self.path)
                self.held = True
                return
            except FileExistsError:
                pass
            except OSError:
                # NFS may report a failed link that in fact happened: the link count tells.
                if os.stat(tmp).st_nlink == 2:
                    self.held = True
                    return
                raise
            other = read_lock(self.path)
            if (
                other is not None
                and other.token != self.token
                and lock_is_live(other, stale_after=self.stale_after)
            ):
                raise LedgerLockedError(
                    f"the ledger {self.path.parent} of run {other.run or self.run!r} is being written by "
                    f"pid {other.pid} on host {other.host!r} (heartbeat "
                    f"{time.time() - other.heartbeat:.0f} s ago, lock {self.path}); refusing a second "
                    f"writer. If that process is gone, delete the "
                    f"lock file or wait {self.stale_after:.0f} s for it to go stale."
                )
            os.replace(tmp, self.path)
            tmp = Path()
            back = read_lock(self.path)
            if back is None or back.token != self.token:
                raise LedgerLockedError(
                    f"another writer took over the stale ledger lock {self.path} at the same time"
                )
            self.held = True
        finally:
            if tmp != Path():
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def refresh(self) -> bool:
        """Renew the heartbeat; False (and no longer held) when another writer's token is in the lock.

        Raises OSError when the storage fails (the lock is still ours as far as we know).
        """
        current = read_lock(self.path)
        if current is not None and current.token != self.token:
            self.held = False
            return False
        tmp = self._write_temp()
        try:
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True

    def release(self) -> None:
        """Drop the lock if it is still ours. Never raises."""
        if not self.held:
            return
        self.held = False
        current = read_lock(self.path)
        if current is not None and current.token == self.token:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
