"""Processes a test started, found again by what they inherited, and stopped for good.

A process's initial environment (``/proc/PID/environ``) survives daemonizing, a new session and the
death of its parent: a Slurm cluster's daemons, job steps and job processes all carry the cluster's
``SLURM_CONF``, and what this test session starts carries :data:`SESSION_MARKER` or names a path in
the session's temporary directory (``leftover_check``). Other sessions on the machine (other
checkouts, other agents) carry other values and are never matched.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["SESSION_MARKER", "Proc", "find", "kill_and_wait"]

#: Set to a value unique to the session in the controlling pytest process before it starts workers;
#: every process started with ``os.environ`` (or a copy of it) inherits it.
SESSION_MARKER = "BABYSITTER_TEST_SESSION"


@dataclass(frozen=True)
class Proc:
    """A live process: its pid, its name (``comm``) and its command line."""

    pid: int
    name: str
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} {self.name}: {self.cmdline[:200]}"


def _read(pid: int, what: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return None


def _live(pid: int) -> bool:
    """Running or sleeping; a zombie holds nothing but its pid (its parent reaps it)."""
    stat = _read(pid, "stat")
    return stat is not None and stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X", b"")


def _matches(pid: int, env: dict[str, str], mentions: str | None) -> bool:
    environ = _read(pid, "environ") or b""
    entries = set(environ.split(b"\0"))
    if env and all(f"{k}={v}".encode() in entries for k, v in env.items()):
        return True
    if mentions is None:
        return False
    if mentions.encode() in environ or mentions.encode() in (_read(pid, "cmdline") or b""):
        return True
    try:
        return f"{os.readlink(f'/proc/{pid}/cwd')}/".startswith(mentions)
    except OSError:
        return False


def find(env: dict[str, str], *, mentions: str | None = None) -> list[Proc]:
    """Live processes (this one excluded) whose initial environment holds every ``env`` pair, or whose
    environment or command line contains ``mentions`` or whose working directory lies under it: a
    process that sets its title (slurmstepd) overwrites most of what ``/proc/PID/environ`` shows, but
    not its paths (its SLURM_CONF)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        if not _matches(pid, env, mentions) or not _live(pid):
            continue
        name = (_read(pid, "comm") or b"?").decode(errors="replace").strip()
        cmdline = (_read(pid, "cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
        found.append(Proc(pid, name, cmdline))
    return found


def kill_and_wait(
    procs: Iterable[Proc], env: dict[str, str], *, mentions: str | None = None, timeout: float = 10.0
) -> list[Proc]:
    """SIGKILL each process that still matches (as :func:`find`; checked once a pidfd holds it, so a
    reused pid is never hit) and wait until it has exited; the ones still alive after ``timeout``."""
    held: list[tuple[Proc, int]] = []
    for proc in procs:
        try:
            fd = os.pidfd_open(proc.pid)
        except OSError:  # already gone
            continue
        if not _matches(proc.pid, env, mentions):  # the pid was reused before the pidfd: another process
            os.close(fd)
            continue
        with contextlib.suppress(OSError):  # exited in between
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        held.append((proc, fd))
    deadline = time.monotonic() + timeout
    left = []
    try:
        for proc, fd in held:  # a pidfd turns readable when its process has exited
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                left.append(proc)
    finally:
        for _, fd in held:
            os.close(fd)
    return left
