"""One live writer per run: a lock file with host, pid and a heartbeat, safe on NFS and Lustre.

``flock`` is unreliable on network file systems, so the lock is a small JSON file next to the ledger,
written once and never rewritten:

* **create** with ``link()``: a fully written temp file is hard-linked to the lock name, which fails
  when the name exists (atomic on NFS, where ``O_EXCL`` is not to be trusted);
* **heartbeat** by touching it (``futimens`` on a descriptor whose inode is checked to be ours), so a
  heartbeat can never overwrite another writer's lock the way a rewrite could;
* **stale** when its owner is provably gone: on the same host when its pid (with the same process
  start time) no longer runs, on another host when its last heartbeat (the file's mtime) is older than
  ``stale_after``;
* **take over** a stale lock atomically: first take the *breaker* (a second name, also created with
  ``link()``, so one racer at a time breaks locks), check that the lock name still holds the very inode
  judged stale, move it away, then ``link()`` a fresh lock like any writer; the other racers find the
  breaker taken, or the name re-taken, and back off. A breaker left by a writer killed mid-takeover is
  removed once older than ``stale_after``. Any writer later finding another lock under the name has
  lost it and stops writing (and its lines carry its fencing tag, so readers drop what it wrote after
  the takeover);
* a lock is known by its inode *and* its writer's token: file systems reuse a freed inode number at
  once (ext4 hands the next new file the number just freed), so an inode alone would let a racer
  holding an old reading remove a fresh lock.

Temp files are removed on every failure (a full disk fails the write, not the create).
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
from typing import Literal

import psutil

from babysitter import jsonin

__all__ = ["LedgerLockedError", "LockInfo", "RefreshResult", "WriterLock", "lock_is_live", "read_lock"]

_VERSION = 2
_MAX_LOCK_BYTES = 1 << 16

#: What a heartbeat found: the lock is still ours, it vanished and was taken again, or another
#: writer's lock is there now.
RefreshResult = Literal["ok", "recreated", "lost"]


class LedgerLockedError(RuntimeError):
    """Another live process holds the ledger's lock (or took it over first)."""


@dataclass(frozen=True)
class LockInfo:
    """What a lock file says about its writer."""

    host: str
    pid: int
    pst: float
    token: str
    #: The last sign of life: the file's mtime (touched by heartbeats) or the time written in it.
    heartbeat: float
    run: str
    #: ``(st_dev, st_ino)`` of the lock file when it was read.
    ident: tuple[int, int] = (0, 0)


def read_lock(path: Path) -> LockInfo | None:
    """The lock at ``path``; None when there is none. A lock whose content cannot be parsed (not one
    this code wrote) is returned with an empty host and token: it is live until its mtime goes stale."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        raw = os.read(fd, _MAX_LOCK_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    ident = (st.st_dev, st.st_ino)
    try:
        obj = jsonin.loads(raw, max_bytes=_MAX_LOCK_BYTES)
        return LockInfo(
            host=str(obj["host"]),
            pid=int(obj["pid"]),
            pst=float(obj["pst"]),
            token=str(obj["token"]),
            heartbeat=max(float(obj["heartbeat"]), st.st_mtime),
            run=str(obj.get("run", "")),
            ident=ident,
        )
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return LockInfo(host="", pid=0, pst=0.0, token="", heartbeat=st.st_mtime, run="", ident=ident)


def _process_alive(pid: int, pst: float) -> bool:
    try:
        return bool(abs(float(psutil.Process(pid).create_time()) - pst) < 1.0)
    except (psutil.Error, OSError, ValueError, OverflowError):
        return False


def lock_is_live(info: LockInfo, *, stale_after: float, now: float | None = None) -> bool:
    """Whether the lock's writer must be taken as alive (until it is provably gone)."""
    if info.host == socket.gethostname() and info.pid > 0:
        return _process_alive(info.pid, info.pst)
    now = time.time() if now is None else now
    return now - info.heartbeat < stale_after


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def _token(fd: int) -> str | None:
    """The token written in the lock open at ``fd``; None when it does not parse. OSError when it
    cannot be read."""
    raw = os.pread(fd, _MAX_LOCK_BYTES, 0)
    try:
        return str(jsonin.loads(raw, max_bytes=_MAX_LOCK_BYTES)["token"])
    except (ValueError, KeyError, TypeError):
        return None


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
        #: ``(st_dev, st_ino)`` of our lock file while held.
        self.ident: tuple[int, int] | None = None
        self._swept = False

    # ------------------------------------------------------------ files

    def _private(self, what: str) -> Path:
        return self.path.with_name(f".{self.path.name}.{self.token}.{what}")

    def _write_temp(self) -> Path:
        """A fully written, fsynced copy of our lock under a private name; removed again on failure."""
        tmp = self._private(f"{time.monotonic_ns()}")
        payload = json.dumps(
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
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            written = 0
            while written < len(payload):
                written += os.write(fd, payload[written:])
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    @staticmethod
    def _link(src: Path, dst: Path) -> bool:
        """Link ``src`` to ``dst``: True when ``dst`` is ``src`` now, False when the name was taken."""
        try:
            os.link(src, dst)
        except FileExistsError:
            return False
        except OSError:
            # NFS may report a failed link that in fact happened (a retried request): the inode tells.
            with contextlib.suppress(OSError):
                if _ident(os.stat(dst)) == _ident(os.stat(src)):
                    return True
            raise
        return True

    def _remove_if(self, path: Path, ident: tuple[int, int], token: str) -> bool:
        """Remove ``path`` if it still is inode ``ident`` written by ``token``: moved away first and
        checked, put back when it was another file by then. True when it was removed."""
        grave = self._private("grave")
        try:
            os.rename(path, grave)
        except FileNotFoundError:
            return False
        try:
            found = read_lock(grave)
            if found is None or found.ident != ident or found.token != token:
                with contextlib.suppress(FileExistsError):
                    os.link(grave, path)
                return False
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(grave)

    def _sweep(self) -> None:
        """Remove private files of this lock older than ``stale_after`` (a writer killed mid-acquire,
        and the temp files older versions leaked on a full disk). Once per writer, best effort."""
        if self._swept:
            return
        self._swept = True
        prefix = f".{self.path.name}."
        limit = time.time() - max(self.stale_after, 60.0)
        try:
            with os.scandir(self.path.parent) as entries:
                for entry in entries:
                    if entry.name.startswith(prefix) and entry.stat(follow_symlinks=False).st_mtime < limit:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
        except OSError:
            pass

    # ------------------------------------------------------------ the protocol

    def acquire(self) -> None:
        """Claim the ledger. LedgerLockedError when another live writer holds it (or wins a race for
        it); OSError when the directory cannot be written (the caller retries later)."""
        other = read_lock(self.path)
        if (
            other is not None
            and other.token != self.token
            and lock_is_live(other, stale_after=self.stale_after)
        ):
            raise self._locked(other)
        self._sweep()
        tmp = self._write_temp()
        try:
            for _ in range(8):
                if self._link(tmp, self.path):
                    self.held = True
                    self.ident = _ident(os.stat(tmp))
                    return
                other = read_lock(self.path)
                if other is None:
                    continue  # it vanished between the link and the read: link again
                if lock_is_live(other, stale_after=self.stale_after):
                    raise self._locked(other)
                self._break(tmp, other)
            raise LedgerLockedError(f"the ledger lock {self.path} keeps changing hands; not taking it")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _break(self, tmp: Path, stale: LockInfo) -> None:
        """Remove the stale lock ``stale`` if the name still holds it, as the only breaker."""
        breaker = self.path.with_name(f".{self.path.name}.breaker")
        if not self._link(tmp, breaker):
            other = read_lock(breaker)
            if other is not None and time.time() - other.heartbeat > self.stale_after:
                self._remove_if(breaker, other.ident, other.token)  # its writer died mid-takeover
            raise LedgerLockedError(f"another writer is taking over the stale ledger lock {self.path}")
        try:
            current = read_lock(self.path)
            if current is not None and (current.ident, current.token) == (stale.ident, stale.token):
                self._remove_if(self.path, stale.ident, stale.token)
        finally:
            self._remove_if(breaker, _ident(os.stat(tmp)), self.token)

    def _locked(self, other: LockInfo) -> LedgerLockedError:
        who = f"pid {other.pid} on host {other.host!r}" if other.host else "an unknown writer"
        return LedgerLockedError(
            f"the ledger {self.path.parent} of run {other.run or self.run!r} is being written by {who} "
            f"(heartbeat {time.time() - other.heartbeat:.0f} s ago, lock {self.path}); this process "
            f"writes no ledger until that lock is provably stale (its process gone on this host, or "
            f"no heartbeat for {self.stale_after:.0f} s from another host)"
        )

    def refresh(self) -> RefreshResult:
        """Heartbeat: touch our lock. ``"lost"`` (and no longer held) when another writer's lock is
        under the name; ``"recreated"`` when the lock had vanished (its directory deleted) and is ours
        again. Raises OSError when the storage fails (the lock is still ours as far as we know)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return self._recreate()
        try:
            if _ident(os.fstat(fd)) != self.ident or _token(fd) != self.token:
                self.held = False
                return "lost"
            os.utime(fd)
        finally:
            os.close(fd)
        return "ok"

    def _recreate(self) -> RefreshResult:
        tmp = self._write_temp()
        try:
            if self._link(tmp, self.path):
                self.ident = _ident(os.stat(tmp))
                return "recreated"
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self.held = False
        return "lost"

    def release(self) -> None:
        """Drop the lock if it is still ours (moved away first, so another writer's is never deleted).
        Never raises."""
        if not self.held or self.ident is None:
            return
        self.held = False
        with contextlib.suppress(OSError):
            self._remove_if(self.path, self.ident, self.token)
