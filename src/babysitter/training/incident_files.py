"""The incident directory's layout, its names, and file access that no symbolic link can redirect.

``RUN_DIR/incidents/<id>/`` holds one incident: ``request.json`` (what the ranks are asked for),
``ranks/rank<N>.json`` (each rank's answer), the evidence the gatherer adds (``alert.json``,
``ledger.json``, ``host.json``, ``hangs/``, ``crashes/``) and, written last, ``bundle.json``, the
summary that says the bundle is complete. ``RUN_DIR/incidents/crashes/`` holds the ranks' own crash
records (:mod:`babysitter.training.crash`).

The run directory is writable by whoever runs the job, and the gatherer may run as root (the
remediator): every path under ``incidents/`` is opened relative to a directory descriptor with
``O_NOFOLLOW``, so a link planted there cannot make a root gatherer write or read elsewhere, and
every read is bounded and of regular files only (a FIFO cannot block it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from babysitter import jsonin, jsonout

__all__ = [
    "BUNDLE",
    "CRASHES",
    "INCIDENTS",
    "RANKS",
    "REQUEST",
    "FileError",
    "incident_id",
    "list_ids",
    "open_dir",
    "opened_dir",
    "rank_file",
    "rank_of",
    "read_json",
    "read_regular",
    "valid_id",
    "write_file",
    "write_json",
]

INCIDENTS = "incidents"
CRASHES = "crashes"
REQUEST = "request.json"
BUNDLE = "bundle.json"
RANKS = "ranks"

#: ``20260101T120000Z-<hex fingerprint>``: the alert's start (UTC) and its fingerprint.
_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{1,64}$")
_HEX = re.compile(r"^[0-9a-fA-F]{1,64}$")
_RANK_FILE = re.compile(r"^rank([0-9]{1,7})\.json$")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class FileError(OSError):
    """A path under ``incidents/`` that is not what it must be (a link, not a regular file, too big)."""


def incident_id(starts_at: float, fingerprint: str) -> str:
    """The incident's id: the alert's start in UTC and its fingerprint.

    Alertmanager's notification templates can write the same string (``{{ .StartsAt.UTC.Format
    "20060102T150405Z" }}-{{ .Fingerprint }}``), so the page carries the id of the bundle the
    remediator gathers for it without asking anyone. A fingerprint that is not hex is hashed.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(max(0.0, float(starts_at))))
    if not _HEX.fullmatch(fingerprint):
        import hashlib

        fingerprint = hashlib.sha256(fingerprint.encode("utf-8", "replace")).hexdigest()[:16]
    return f"{stamp}-{fingerprint.lower()}"


def valid_id(name: str) -> bool:
    """Whether ``name`` is an incident id (and so a safe directory name)."""
    return bool(_ID.fullmatch(name))


def rank_file(rank: int) -> str:
    """The name of a rank's answer in ``ranks/``."""
    return f"rank{int(rank)}.json"


def rank_of(name: str) -> int | None:
    """The rank a ``ranks/`` file name is for, None when it is not an answer's name."""
    match = _RANK_FILE.fullmatch(name)
    return int(match.group(1)) if match else None


def open_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """A descriptor of the directory ``path`` (never through a link at its last component)."""
    return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)


@contextlib.contextmanager
def opened_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> Iterator[int]:
    """:func:`open_dir` as a context manager."""
    fd = open_dir(path, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def read_regular(name: str, *, dir_fd: int | None, limit: int) -> bytes:
    """The bytes of the regular file ``name`` (relative to ``dir_fd``), at most ``limit``.

    FileError for a link, a FIFO, a device or a file larger than ``limit``; OSError as the system says.
    """
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symbolic link
            raise FileError(exc.errno, f"{name} is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileError(f"{name} is not a regular file")
        if info.st_size > limit:
            raise FileError(f"{name} is {info.st_size} bytes, more than the {limit} read")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise FileError(f"{name} grew past the {limit} bytes read")
        return data
    finally:
        os.close(fd)


def read_json(name: str, *, dir_fd: int | None, limit: int) -> Any:
    """The JSON value of a regular file read with :func:`read_regular`; ValueError when it is not JSON
    or nests deeper than :data:`babysitter.jsonin.MAX_DEPTH`."""
    return jsonin.loads(read_regular(name, dir_fd=dir_fd, limit=limit), max_bytes=limit)


def write_file(
    name: str,
    data: bytes,
    *,
    dir_fd: int,
    mode: int = 0o600,
    owner: tuple[int, int] | None = None,
    replace: bool = False,
) -> int:
    """Write ``name`` in ``dir_fd`` whole or not at all (a temporary file, fsync, rename); its size.

    The temporary file is created ``O_EXCL | O_NOFOLLOW``; ``owner`` (uid, gid) is given to it before
    the rename when this process runs as root. Without ``replace`` an existing ``name`` is kept and
    FileExistsError raised (a rank answers once).
    """
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if owner is not None and os.geteuid() == 0:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return len(data)


def write_json(
    name: str,
    value: object,
    *,
    dir_fd: int,
    owner: tuple[int, int] | None = None,
    replace: bool = False,
) -> int:
    """:func:`write_file` of ``value`` as strict, compact JSON."""
    data = (jsonout.dumps(value, separators=(",", ":"), sort_keys=True) + "\n").encode()
    return write_file(name, data, dir_fd=dir_fd, owner=owner, replace=replace)


def list_ids(incidents: Path | int) -> list[str]:
    """The incident ids in an ``incidents/`` directory (a path or a descriptor), oldest first."""
    try:
        names = os.listdir(incidents)
    except FileNotFoundError:
        return []
    return sorted(name for name in names if valid_id(name))
