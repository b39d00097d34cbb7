"""Checkpoint-directory bandwidth: write, fsync and cold read of one checkpoint-sized file.

The node agent's storage probe (babysitter.node.storage.probe) times a small file every minute for
latency; qualification needs bandwidth, which only a file the size of a checkpoint shard shows
(1 GiB by default; caches and write-back buffers hide everything smaller). Bounded: at most
:data:`MAX_SIZE_BYTES`, and never more than half of the free space.

The data is random (a compressing or deduplicating file system would otherwise report fantasy
rates). Write time covers create and write; fsync is timed apart (it is where NFS and Lustre
clients spend their time); the read-back drops the file's cached pages first
(``POSIX_FADV_DONTNEED`` after the fsync), so it reads from storage on local file systems; network
file systems may still serve some pages from the client cache.

The file, ``.babysitter-probe-bw.<host>.<pid>`` (hidden, mode 0600, ``O_EXCL|O_NOFOLLOW``), is
removed on every way out, failures included. Errors are the result, never raised.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import time
from pathlib import Path

from babysitter.probe.results import StorageResult

__all__ = ["MAX_SIZE_BYTES", "measure_storage", "probe_file_name"]

MAX_SIZE_BYTES = 64 * 2**30
_CHUNK = 8 * 2**20


def probe_file_name(host: str, pid: int | None = None) -> str:
    """The probe's file name in a checkpoint directory."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:64] or "host"
    return f".babysitter-probe-bw.{safe}.{os.getpid() if pid is None else pid}"


def _error(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "error")
    return f"{name}: {exc.strerror or exc}"


def measure_storage(directory: Path, *, size_bytes: int, host: str | None = None) -> StorageResult:
    """Write + fsync + cold read of ``size_bytes`` in ``directory``; the file is always removed."""
    host = host or socket.gethostname()
    result = StorageResult(host=host, path=str(directory), size_bytes=size_bytes)
    if not 0 < size_bytes <= MAX_SIZE_BYTES:
        result.error = f"size must be in (0, {MAX_SIZE_BYTES}] bytes"
        return result
    try:
        st = os.statvfs(directory)
    except OSError as exc:
        result.error = _error(exc)
        return result
    free = st.f_bavail * st.f_frsize
    if size_bytes > free // 2:
        result.error = f"skipped: {size_bytes} bytes is more than half of the {free} bytes free"
        return result
    target = directory / probe_file_name(host)
    chunk = os.urandom(min(_CHUNK, size_bytes))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = -1
    try:
        t0 = time.perf_counter()
        fd = os.open(target, flags, 0o600)
        left = size_bytes
        while left > 0:
            view = memoryview(chunk)[: min(len(chunk), left)]
            while view:
                written = os.write(fd, view)
                view = view[written:]
                left -= written
        t1 = time.perf_counter()
        os.fsync(fd)
        t2 = time.perf_counter()
        result.write_seconds, result.fsync_seconds = t1 - t0, t2 - t1
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        fd = -1
        t3 = time.perf_counter()
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        buffer = bytearray(_CHUNK)
        got = 0
        while True:
            n = os.readv(fd, [buffer])
            if n == 0:
                break
            got += n
        result.read_seconds = time.perf_counter() - t3
        if got != size_bytes:
            result.error = f"read back {got} of {size_bytes} bytes"
    except OSError as exc:
        result.error = _error(exc)
    finally:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(target)
    return result
