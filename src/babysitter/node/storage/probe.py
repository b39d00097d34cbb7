"""The storage probe: write, fsync, read back and delete a small file in every checkpoint directory.

Checkpoint saves that time out are mostly slow or sick shared file systems; the probe measures the
same path a save takes (create, write, fsync) plus a read-back with the cached pages dropped, on a
timer, with bounded I/O (``size_bytes`` per directory per ``interval_seconds``).

Each directory has its own thread, so a hung mount (NFS/Lustre calls block in the kernel, unkillable)
stalls only its own probe; ``storage_probe_running_seconds`` then grows and shows it. ``collect()``
never touches the file system: it reports what the threads measured.

**No files left behind.** The probe file has one fixed, recognizable name per host,
``.babysitter-probe.<hostname>`` (hidden, never a checkpoint name), created with
``O_CREAT|O_EXCL|O_NOFOLLOW`` and mode 0600, and unlinked right after the read-back, also when a
step fails. If the agent is killed between create and unlink, the file stays until the next probe
of that directory, which removes it first (every start probes at once). Per host, not per process,
so a restarted agent finds its predecessor's file; hosts sharing a directory never collide.

**Failures** (missing directory, permission, read-only, full, I/O error, stale NFS handle, corrupt
read-back) set ``storage_probe_up{path}`` to 0, count ``storage_probe_errors_total{path,reason}``
and log one line when a directory's state changes (and one when it recovers); other directories are
probed as usual.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import re
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import Metric

from babysitter.catalog import storage as S
from babysitter.catalog._spec import MetricSpec

__all__ = [
    "MAX_SIZE_BYTES",
    "MIN_INTERVAL_SECONDS",
    "ProbeResult",
    "StorageProbeCollector",
    "probe_file_name",
    "probe_once",
]

log = logging.getLogger(__name__)

MAX_SIZE_BYTES = 64 * 1024 * 1024
MIN_INTERVAL_SECONDS = 0.05
_PREFIX = ".babysitter-probe."


def probe_file_name(hostname: str | None = None) -> str:
    """The probe file's name in every directory: fixed per host, so the next start can clean it up."""
    host = hostname if hostname is not None else socket.gethostname()
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:64] or "host"
    return _PREFIX + safe


@dataclass
class ProbeResult:
    """One probe of one directory: step latencies (None for steps not reached) and the failure, if any."""

    path: Path
    reason: str = ""  # "" when the probe succeeded, else one of catalog.storage.PROBE_ERROR_REASONS
    detail: str = ""  # the error message, for the log line
    write_seconds: float | None = None
    fsync_seconds: float | None = None
    read_seconds: float | None = None
    free_bytes: int | None = None
    size_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return not self.reason


def _reason(exc: OSError) -> str:
    code = exc.errno
    if code in (errno.ENOENT, errno.ENOTDIR):
        return "missing"
    if code in (errno.EACCES, errno.EPERM):
        return "permission"
    if code == errno.EROFS:
        return "read_only"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "no_space"
    if code == errno.EIO:
        return "io"
    if code == errno.ESTALE:
        return "stale"
    return "other"


def _fail(result: ProbeResult, exc: OSError) -> ProbeResult:
    result.reason = _reason(exc)
    result.detail = f"{exc.strerror or type(exc).__name__} ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
    return result


def probe_once(directory: Path, size_bytes: int = 64 * 1024, *, file_name: str | None = None) -> ProbeResult:
    """Probe ``directory`` once: statvfs, create+write, fsync, read back (cache dropped), delete.

    Never raises for file system errors: they are the result. The probe file is removed on every
    path out of this function that got as far as creating it.
    """
    result = ProbeResult(path=directory)
    target = directory / (file_name or probe_file_name())
    try:
        st = os.statvfs(directory)
        result.free_bytes = st.f_bavail * st.f_frsize
        result.size_bytes = st.f_blocks * st.f_frsize
    except OSError as exc:
        return _fail(result, exc)
    payload = os.urandom(size_bytes)  # incompressible, and a fresh pattern so a stale read shows
    created = False
    try:
        start = time.perf_counter()
        fd = _create(target)
        created = True
        try:
            _write_all(fd, payload)
            result.write_seconds = time.perf_counter() - start
            start = time.perf_counter()
            os.fsync(fd)
            result.fsync_seconds = time.perf_counter() - start
            with contextlib.suppress(OSError, AttributeError):  # best effort: not every FS honours it
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        start = time.perf_counter()
        data = _read_all(target, size_bytes)
        result.read_seconds = time.perf_counter() - start
        if data != payload:
            result.reason = "corrupt"
            result.detail = f"read back {len(data)} bytes that differ from the {size_bytes} written"
    except OSError as exc:
        _fail(result, exc)
    finally:
        if created:
            try:
                os.unlink(target)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if result.ok:
                    _fail(result, exc)
    return result


def _create(target: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(target, flags, 0o600)
    except FileExistsError:
        # Left by an agent killed mid-probe (same host name, so ours): remove it and go on.
        os.unlink(target)
        return os.open(target, flags, 0o600)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_all(target: Path, size: int) -> bytes:
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        remaining = size + 1  # one byte more than written, to notice a file that grew
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass
class _PathState:
    last: ProbeResult | None = None
    running_since: float | None = None  # monotonic start of the probe in progress
    errors: dict[str, int] = field(default_factory=dict)


class StorageProbeCollector:
    """The ``storage`` collector: probes each directory every ``interval_seconds`` on its own thread.

    Bad configuration (no paths, size or interval out of range) raises ValueError at construction;
    everything at run time is a metric. ``start()`` is idempotent and also happens on the first
    ``collect()``.
    """

    name = "storage"

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        size_bytes: int = 64 * 1024,
        interval_seconds: float = 30.0,
    ) -> None:
        if not 1 <= size_bytes <= MAX_SIZE_BYTES:
            raise ValueError(f"storage probe size must be 1..{MAX_SIZE_BYTES} bytes, got {size_bytes}")
        if not interval_seconds >= MIN_INTERVAL_SECONDS:
            raise ValueError(
                f"storage probe interval must be >= {MIN_INTERVAL_SECONDS} s, got {interval_seconds}"
            )
        unique = list(dict.fromkeys(Path(p) for p in paths))
        if not unique:
            raise ValueError("storage probe needs at least one directory")
        self.paths = unique
        self.size_bytes = size_bytes
        self.interval_seconds = float(interval_seconds)
        self._file_name = probe_file_name()
        self._lock = threading.Lock()
        self._state = {p: _PathState() for p in unique}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False

    def start(self) -> None:
        """Start one probe thread per directory; each probes at once, then every interval (±10%)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        for path in self.paths:
            thread = threading.Thread(
                target=self._run, args=(path,), name=f"babysitter-storage-probe:{path}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Stop the threads; a thread stuck in a hung file system call is left behind (daemon)."""
        self._stop.set()
        deadline = time.monotonic() + 2.0
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    def collect(self) -> Iterable[Metric]:
        self.start()
        now = time.monotonic()
        with self._lock:
            snapshot = [(p, s.last, s.running_since, dict(s.errors)) for p, s in self._state.items()]
        families = {
            spec.name: spec.family()
            for spec in (
                S.STORAGE_PROBE_UP,
                S.STORAGE_PROBE_WRITE,
                S.STORAGE_PROBE_FSYNC,
                S.STORAGE_PROBE_READ,
                S.STORAGE_PROBE_ERRORS,
                S.STORAGE_PROBE_RUNNING,
                S.STORAGE_FREE,
                S.STORAGE_SIZE,
            )
        }

        def add(spec: MetricSpec, labels: list[str], value: float | None) -> None:
            if value is not None:
                families[spec.name].add_metric(labels, float(value))  # type: ignore[attr-defined]

        for path, last, running_since, errors in snapshot:
            label = _label(path)
            add(S.STORAGE_PROBE_RUNNING, [label], 0.0 if running_since is None else now - running_since)
            # Only the reasons that occurred (8 zero series per path and host would take a quarter of
            # the host's series budget); readers count a series born at 1 as an increase, as the Xid
            # counter's do (generate.promql.new_or_increased).
            for reason in S.PROBE_ERROR_REASONS:
                if errors.get(reason):
                    add(S.STORAGE_PROBE_ERRORS, [label, reason], errors[reason])
            if last is None:
                continue
            add(S.STORAGE_PROBE_UP, [label], 1.0 if last.ok else 0.0)
            add(S.STORAGE_PROBE_WRITE, [label], last.write_seconds)
            add(S.STORAGE_PROBE_FSYNC, [label], last.fsync_seconds)
            add(S.STORAGE_PROBE_READ, [label], last.read_seconds)
            add(S.STORAGE_FREE, [label], last.free_bytes)
            add(S.STORAGE_SIZE, [label], last.size_bytes)
        return list(families.values())

    def last_results(self) -> dict[Path, ProbeResult | None]:
        """The latest result per directory (None before its first probe finished)."""
        with self._lock:
            return {p: s.last for p, s in self._state.items()}

    def _run(self, path: Path) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._state[path].running_since = time.monotonic()
            try:
                result = probe_once(path, self.size_bytes, file_name=self._file_name)
            except Exception as exc:  # a bug, not a file system error: still a metric, never a dead thread
                log.exception("babysitter: storage probe of %s failed unexpectedly", path)
                result = ProbeResult(path=path, reason="other", detail=f"{type(exc).__name__}: {exc}")
            self._record(path, result)
            jitter = random.uniform(-0.1, 0.1) * self.interval_seconds  # spread hosts sharing one FS
            self._stop.wait(self.interval_seconds + jitter)

    def _record(self, path: Path, result: ProbeResult) -> None:
        with self._lock:
            state = self._state[path]
            previous = state.last
            state.last = result
            state.running_since = None
            if not result.ok:
                state.errors[result.reason] = state.errors.get(result.reason, 0) + 1
        if not result.ok and (previous is None or previous.reason != result.reason):
            log.warning(
                "babysitter: storage probe of %s failed: %s: %s (other directories are still probed)",
                path,
                result.reason,
                result.detail,
            )
        elif result.ok and previous is not None and not previous.ok:
            log.info("babysitter: storage probe of %s works again", path)


def _label(path: Path) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", "", str(path))
