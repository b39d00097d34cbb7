"""Opening files that users control: regular files only, never blocking, with a bound on what is read.

A run directory is written by its user and read by the node agent (as root) and by the CLI. ``open()``
of a FIFO blocks until someone writes to it (forever, for a sentinel pass or a ``report``), opening a
device can have side effects, and reading ``/dev/zero`` never ends. :func:`open_regular` looks before
it opens (``stat``, or ``lstat`` where the last component must not be a link), opens with
``O_NONBLOCK`` (and ``O_NOFOLLOW``), and checks that what it opened is the regular file it looked at;
anything else is :class:`NotRegularFileError`. :func:`read_regular` also refuses a file larger than
its caller's bound (:class:`TooLargeError`) before reading it. Both are ``OSError`` subclasses, so a
caller's "cannot be read" path reports them with their ``strerror``.

What this does not close: the race of a directory higher up the path swapped for a link between the
look and the open (the sentinel's per-run, privilege-dropped workers close that one).
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotRegularFileError", "TooLargeError", "open_regular", "read_regular"]


class NotRegularFileError(OSError):
    """The path is a FIFO, device, socket, directory, or a link where none is followed."""


class TooLargeError(OSError):
    """The file is larger than its reader accepts."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link (not followed)"
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> int:
    """A read-only descriptor of the regular file at ``path`` (the caller closes it).

    ``follow_symlinks=False``: the last component must not be a symbolic link (for files whose name a
    user chose inside a tree the reader walks: a manifest's entries). FileNotFoundError when there is
    nothing there; NotRegularFileError for anything but a regular file, never opened."""
    name = os.fspath(path)
    st = os.stat(name) if follow_symlinks else os.lstat(name)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(errno.EINVAL, _kind(st.st_mode), name)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFileError(errno.ELOOP, _kind(stat.S_IFLNK), name) from None
        raise
    try:
        now = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, "replaced while it was opened", name)
    return fd


def read_regular(
    path: str | os.PathLike[str], *, limit: int | None = None, follow_symlinks: bool = True
) -> bytes:
    """The bytes of the regular file at ``path`` (see :func:`open_regular`), at most ``limit`` of
    them: TooLargeError, before anything is read, when the file is larger (or grows past it)."""
    name = os.fspath(path)
    with os.fdopen(open_regular(name, follow_symlinks=follow_symlinks), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if limit is not None and size > limit:
            raise TooLargeError(errno.EFBIG, f"{size} bytes, more than the {limit} read here", name)
        if limit is None:
            data = fh.read()
        else:
            # Asked for what fstat says (a read of n bytes allocates n at once: limit + 1 would cost a
            # 40 MiB buffer for every small manifest, past a sentinel worker's memory budget), then
            # in bounded pieces while it grows.
            data = fh.read(min(size, limit) + 1)
            while len(data) <= limit:
                more = fh.read(min(limit + 1 - len(data), 1 << 20))
                if not more:
                    break
                data += more
    if limit is not None and len(data) > limit:
        raise TooLargeError(errno.EFBIG, f"grew past the {limit} bytes read here", name)
    return data
