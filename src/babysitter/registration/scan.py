"""The agent's side: list the live registrations, trusting nothing a local user can write.

The registration directory is shared by every user of the host, and the agent may run as root (or
as a dynamic user that cannot delete other users' files). So one bad entry costs only itself: it
is skipped, counted once by reason (:data:`SKIP_REASONS`) and logged once, and the scan goes on.
What an entry must be to count as a trainer:

- a regular file (no link, FIFO or directory; opened with ``O_NOFOLLOW|O_NONBLOCK`` relative to
  its directory's descriptor) of at most 16 KiB, in ``<dir>/<uid>/``, where both that directory
  and the file belong to ``uid``;
- valid JSON with every field in range (:func:`~babysitter.registration.parse_endpoint`), whose URL
  is a literal loopback address (or one in the configured networks);
- for a process that is alive (pid and start time match) and runs as ``uid`` (read from /proc);
- the first claim on its run and rank: a run belongs to the user whose process registered it
  first, and a later claim on the same run and rank, or any claim by another user, is a conflict.

At most ``max_per_user`` registrations per user and ``max_endpoints`` in all are served.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import ipaddress
import json
import logging
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from babysitter.registration._endpoint import Endpoint, parse_endpoint, parse_target
from babysitter.registration._proc import CLOCK_TICKS, Procfs

__all__ = [
    "MAX_FILE_BYTES",
    "SKIP_REASONS",
    "Network",
    "Registered",
    "Scanner",
    "is_alive",
    "read_registration",
]

log = logging.getLogger("babysitter.registration")

MAX_FILE_BYTES = 16 * 1024
#: Why a registration was not served; the values of the ``reason`` label.
SKIP_REASONS = (
    "misplaced",
    "not_regular",
    "wrong_owner",
    "unreadable",
    "too_large",
    "malformed",
    "forbidden_target",
    "dead",
    "too_many",
    "conflict",
)
_MAX_LOG_LINES_PER_SCAN = 100
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Registered:
    """A registration that passed every check, with the uid that owns it (from the file system)."""

    endpoint: Endpoint
    owner_uid: int
    path: Path


class _Skip(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def is_alive(endpoint: Endpoint) -> bool:
    """True while the registering process still runs (same pid and same start time)."""
    try:
        started = float(psutil.Process(endpoint.pid).create_time())
    except Exception:  # NoSuchProcess, AccessDenied, a pid out of range: not a live trainer
        return False
    return abs(started - endpoint.start_time) < 1.0


def read_registration(path: Path, dir_fd: int | None = None) -> Endpoint:
    """Read and check one registration file; ValueError or OSError saying why it is refused."""
    return parse_endpoint(_decode(_read_regular(str(path), dir_fd)))


def _read_regular(name: str, dir_fd: int | None) -> tuple[bytes, os.stat_result]:
    """A small regular file's bytes, without following a link or blocking on a FIFO."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Skip("not_regular", "a symbolic link") from None
        raise _Skip("unreadable", exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Skip("not_regular", "not a regular file")
        raw = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _Skip("unreadable", exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise _Skip("too_large", f"larger than {MAX_FILE_BYTES} bytes")
    return raw, st


def _decode(read: tuple[bytes, os.stat_result]) -> object:
    try:
        return json.loads(read[0])
    except (ValueError, RecursionError) as exc:
        raise _Skip("malformed", f"not JSON: {exc}"[:200]) from None


class Scanner:
    """Lists ``directory`` at each :meth:`scan`; remembers what it counted so each file counts once."""

    def __init__(
        self,
        directory: Path,
        *,
        networks: Sequence[Network] = (),
        max_per_user: int = 64,
        max_endpoints: int = 256,
        max_users: int = 1024,
        max_entries: int = 100_000,
        procfs: Procfs | None = None,
    ) -> None:
        self.directory = directory
        self._proc = procfs if procfs is not None else Procfs()
        self._boot: float | None = None
        self._networks = tuple(networks)
        self._max_per_user = max_per_user
        self._max_endpoints = max_endpoints
        self._max_users = max_users
        self._max_entries = max_entries
        self._totals: collections.Counter[str] = collections.Counter()
        self._counted: set[tuple[object, str]] = set()
        self._seen: set[tuple[object, str]] = set()
        #: Each file version's verdict: the registration it makes (if its process checks out) or why not.
        self._cache: dict[tuple[object, ...], Registered | _Skip] = {}
        self._used: set[tuple[object, ...]] = set()
        self._logged: set[str] = set()
        self._lines = 0
        self._unlogged = 0
        #: The endpoints the last scan found registered by an exited process (see :meth:`scan`).
        self.dead: set[Endpoint] = set()

    def skipped(self) -> dict[str, int]:
        """Registrations skipped so far, by reason; each file (each version of it) counted once."""
        return dict(self._totals)

    def scan(self, *, prune: bool = False) -> list[Registered]:
        """The registrations to serve now. With ``prune``, dead ones are deleted when permitted.
        :attr:`dead` holds the endpoints this scan found registered by a process that had exited: it
        died without unregistering (one that unregistered and then exited left no file to find)."""
        self._seen, self._used, self._lines, self._unlogged = set(), set(), 0, 0
        self.dead = set()
        self._boot = None  # read once per scan, when a registration needs it
        try:
            top = os.open(self.directory, _DIR_FLAGS)
        except FileNotFoundError:
            return []
        except OSError as exc:
            self._log_state("top", f"registration directory {self.directory} is unusable: {exc}")
            return []
        try:
            self._check_shared(os.fstat(top))
            uids = self._list_users(top)
            candidates: list[Registered] = []
            for uid in uids:
                candidates.extend(self._scan_user(top, uid, prune=prune))
            found = self._resolve_conflicts(candidates)
        finally:
            os.close(top)
        if len(found) > self._max_endpoints:
            for extra in found[self._max_endpoints :]:
                self._skip(("cap", extra.path), "too_many", extra.path, f"over {self._max_endpoints} in all")
            found = found[: self._max_endpoints]
        self._counted &= self._seen
        self._cache = {key: value for key, value in self._cache.items() if key in self._used}
        if self._unlogged:
            log.warning("babysitter: %d more registrations skipped (not logged one by one)", self._unlogged)
        return found

    # ------------------------------------------------------------------ directories

    def _check_shared(self, st: os.stat_result) -> None:
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            self._log_state(
                "sticky",
                f"registration directory {self.directory} is world-writable without the sticky bit: any "
                "user can rename another user's directory away (chmod 1777 it)",
            )
        if st.st_uid not in (0, os.geteuid()):
            self._log_state(
                "owner",
                f"registration directory {self.directory} belongs to uid {st.st_uid}, who can delete "
                "any user's registrations; create it root-owned (see exporters/)",
            )

    def _list_users(self, top: int) -> list[int]:
        uids: list[int] = []
        with os.scandir(top) as entries:
            for count, entry in enumerate(entries):
                if count >= self._max_entries:
                    self._log_state("entries", f"more than {self._max_entries} entries in {self.directory}")
                    break
                name = entry.name
                if name.startswith("."):
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if is_dir and name.isascii() and name.isdigit() and len(name) <= 10:
                    uids.append(int(name))
                elif name.endswith(".json"):
                    key = ("top", name, _identity(entry))
                    self._skip(key, "misplaced", self.directory / name, "not in a per-user directory")
        uids.sort()
        if len(uids) > self._max_users:
            self._log_state("users", f"more than {self._max_users} user directories in {self.directory}")
        return uids[: self._max_users]

    def _scan_user(self, top: int, uid: int, *, prune: bool) -> list[Registered]:
        where = self.directory / str(uid)
        try:
            fd = os.open(str(uid), _DIR_FLAGS, dir_fd=top)
        except OSError as exc:
            self._skip(("dir", uid), "unreadable", where, exc.strerror or str(exc))
            return []
        found: list[Registered] = []
        try:
            st = os.fstat(fd)
            if st.st_uid != uid:
                key = ("dir", uid, st.st_ino, st.st_uid)
                self._skip(key, "wrong_owner", where, f"directory belongs to uid {st.st_uid}")
                return []
            with os.scandir(fd) as entries:
                for count, entry in enumerate(entries):
                    if count >= 4 * self._max_per_user:
                        self._log_state(
                            f"many:{uid}", f"more than {4 * self._max_per_user} entries in {where}"
                        )
                        break
                    if entry.name.startswith(".") or not entry.name.endswith(".json"):
                        continue
                    registered = self._check_entry(fd, uid, entry, prune=prune)
                    if registered is not None:
                        found.append(registered)
        finally:
            os.close(fd)
        found.sort(key=lambda r: r.path.name)
        for extra in found[self._max_per_user :]:
            self._skip(
                ("cap", extra.path), "too_many", extra.path, f"over {self._max_per_user} for uid {uid}"
            )
        return found[: self._max_per_user]

    # ------------------------------------------------------------------ one file

    def _check_entry(self, fd: int, uid: int, entry: os.DirEntry[str], *, prune: bool) -> Registered | None:
        key = ("file", uid, entry.name, _identity(entry))
        registered = self._cache.get(key)
        if registered is None:
            judged = self._judge(fd, uid, entry)
            path = self.directory / str(uid) / entry.name
            registered = judged if isinstance(judged, _Skip) else Registered(judged, uid, path)
            self._cache[key] = registered
        self._used.add(key)
        if isinstance(registered, _Skip):
            self._skip(key, registered.reason, self.directory / str(uid) / entry.name, str(registered))
            return None
        verdict = self._process_verdict(registered.endpoint, uid)
        if verdict is not None:
            self._skip(key, verdict.reason, registered.path, str(verdict))
            if verdict.reason == "dead":
                self.dead.add(registered.endpoint)
            if verdict.reason == "dead" and prune:
                # Not ours to remove under a non-root agent: then it stays skipped, counted once.
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
            return None
        return registered

    def _judge(self, fd: int, uid: int, entry: os.DirEntry[str]) -> Endpoint | _Skip:
        try:
            lst = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(lst.st_mode):
                raise _Skip("not_regular", "a link, directory or special file")
            if lst.st_uid != uid:
                raise _Skip("wrong_owner", f"file belongs to uid {lst.st_uid}")
            raw, st = _read_regular(entry.name, fd)
            if st.st_uid != uid:
                raise _Skip("wrong_owner", f"file belongs to uid {st.st_uid}")
            try:
                endpoint = parse_endpoint(_decode((raw, st)))
            except ValueError as exc:
                raise _Skip("malformed", str(exc)) from None
            address = parse_target(endpoint.url).address
            if not (address.is_loopback or any(address in net for net in self._networks)):
                raise _Skip("forbidden_target", f"{address} is not loopback nor in an allowed network")
        except _Skip as skip:
            return skip
        except OSError as exc:
            return _Skip("unreadable", exc.strerror or str(exc))
        return endpoint

    def _process_verdict(self, endpoint: Endpoint, uid: int) -> _Skip | None:
        """None when the registering process is alive and runs as ``uid``; else why not (from /proc:
        its start, against the one registered, as a reused pid starts later; then its user ids)."""
        pid = endpoint.pid
        try:
            if self._boot is None:
                self._boot = self._proc.boot_time()
            ticks = self._proc.start_ticks(pid)
            if abs(ticks / CLOCK_TICKS + self._boot - endpoint.start_time) >= 1.0:
                return _Skip("dead", f"pid {pid} is another process now")
            uids = self._proc.uids(pid)
        except ProcessLookupError:
            return _Skip("dead", f"pid {pid} exited")
        except (OSError, ValueError) as exc:  # hidepid, an unreadable /proc: cannot vouch for it
            return _Skip("unreadable", f"cannot read process {pid}: {exc}"[:200])
        if uid not in uids:
            return _Skip("wrong_owner", f"pid {pid} runs as uid {uids[0]}, the file belongs to uid {uid}")
        return None

    # ------------------------------------------------------------------ conflicts

    def _resolve_conflicts(self, candidates: Iterable[Registered]) -> list[Registered]:
        """One registration per run and rank; a run belongs to the user who registered it first."""
        order = sorted(candidates, key=lambda r: (r.endpoint.start_time, r.endpoint.pid, r.path.name))
        owners: dict[str, Registered] = {}
        served: dict[tuple[str, int], Registered] = {}
        kept: list[Registered] = []
        for reg in order:
            ep = reg.endpoint
            first = owners.setdefault(ep.run, reg)
            holder = served.get((ep.run, ep.rank))
            if first.owner_uid != reg.owner_uid:
                detail = (
                    f"claims run={ep.run}, which uid {first.owner_uid} registered first "
                    f"(pid {first.endpoint.pid}); registered by uid {reg.owner_uid} (pid {ep.pid})"
                )
            elif holder is not None:
                detail = f"claims run={ep.run} rank={ep.rank}, already served by pid {holder.endpoint.pid}"
            else:
                served[(ep.run, ep.rank)] = reg
                kept.append(reg)
                continue
            self._skip(("conflict", reg.path, ep.pid, ep.start_time), "conflict", reg.path, detail)
        return sorted(kept, key=lambda r: (r.owner_uid, r.path.name))

    # ------------------------------------------------------------------ accounting

    def _skip(self, key: object, reason: str, path: Path, detail: str) -> None:
        mark = (key, reason)
        self._seen.add(mark)
        if mark in self._counted:
            return
        self._counted.add(mark)
        self._totals[reason] += 1
        if self._lines >= _MAX_LOG_LINES_PER_SCAN:
            self._unlogged += 1
            return
        self._lines += 1
        level = logging.INFO if reason == "dead" else logging.WARNING
        log.log(level, "babysitter: skipping registration %s (%s): %s", path, reason, detail)

    def _log_state(self, key: str, message: str) -> None:
        if key not in self._logged and len(self._logged) < 1000:
            self._logged.add(key)
            log.warning("babysitter: %s", message)


def _identity(entry: os.DirEntry[str]) -> tuple[int, ...]:
    """What changes when the entry is replaced or rewritten: a new version is judged (and counted) anew."""
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return (-1,)
    return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_uid, st.st_mode)
