"""A process's start time and user ids, read from /proc directly: what the agent checks of every
registration at every scrape.

``psutil.Process(pid)`` with ``create_time()`` and ``uids()`` read ``/proc/<pid>/stat``,
``/proc/<pid>/status`` and all of ``/proc/stat`` (for the boot time: on a large host, hundreds of
lines the kernel formats on each read) for every registration; here the boot time is read once per
scan and the rest is two small files. The arithmetic is psutil's, because registrations store
psutil's ``create_time()`` (:func:`babysitter.registration.process_start_time`): the start tick of
``/proc/<pid>/stat`` over the clock-tick rate, plus the ``btime`` line of ``/proc/stat``.

A pid that is not there (or exits while read) raises :class:`ProcessLookupError`; a file that
cannot be read, :class:`OSError`; content that is not what proc(5) documents, :class:`ValueError`.
"""

from __future__ import annotations

import errno
import os

__all__ = ["CLOCK_TICKS", "Procfs"]

#: The kernel's clock ticks per second (``USER_HZ``), the unit of the start time in ``/proc/<pid>/stat``.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_MAX_BYTES = 65536  # /proc/<pid>/stat and status are under 2 KiB; the bound is for a bad procfs root


class Procfs:
    """Reads processes from ``root`` (``/proc``, or a test's tree)."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root.rstrip("/") or "/"

    def _read(self, relative: str, pid: int | None = None) -> bytes:
        try:
            fd = os.open(f"{self.root}/{relative}", _FLAGS)
        except FileNotFoundError:
            if pid is None:
                raise
            raise ProcessLookupError(errno.ESRCH, f"no process {pid}") from None
        try:
            return os.read(fd, _MAX_BYTES)
        except ProcessLookupError:  # the kernel says ESRCH when the process exited after the open
            raise ProcessLookupError(errno.ESRCH, f"process {pid} exited") from None
        finally:
            os.close(fd)

    def boot_time(self) -> float:
        """Seconds since the epoch at boot, as ``/proc/stat`` says (whole seconds, like psutil's)."""
        fd = os.open(f"{self.root}/stat", _FLAGS)
        try:
            chunks = []
            for _ in range(64):  # btime follows a line per CPU and the interrupt counts: read it all
                chunk = os.read(fd, _MAX_BYTES)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
        data = b"\n" + b"".join(chunks)
        at = data.find(b"\nbtime ")
        if at < 0:
            raise ValueError(f"no btime line in {self.root}/stat")
        end = data.find(b"\n", at + 1)
        return float(int(data[at + 7 : end if end >= 0 else None]))

    def start_ticks(self, pid: int) -> int:
        """Clock ticks from boot to the process's start (field 22 of ``/proc/<pid>/stat``)."""
        data = self._read(f"{pid}/stat", pid)
        # The command name is in parentheses and may hold anything, parentheses too: the fields
        # start after the last ")".
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) < 20 or data.rfind(b")") < 0:
            raise ValueError(f"{self.root}/{pid}/stat is not proc(5)'s stat")
        return int(fields[19])

    def start_time(self, pid: int, boot_time: float) -> float:
        """The process's start, in seconds since the epoch: psutil's ``create_time()``."""
        return self.start_ticks(pid) / CLOCK_TICKS + boot_time

    def uids(self, pid: int) -> tuple[int, int]:
        """The process's real and effective user ids (the ``Uid:`` line of ``/proc/<pid>/status``)."""
        data = self._read(f"{pid}/status", pid)
        at = data.find(b"\nUid:")
        if at < 0:
            raise ValueError(f"no Uid line in {self.root}/{pid}/status")
        end = data.find(b"\n", at + 1)
        values = data[at + 5 : end if end >= 0 else None].split()
        if len(values) < 2:
            raise ValueError(f"{self.root}/{pid}/status has a short Uid line")
        return int(values[0]), int(values[1])
