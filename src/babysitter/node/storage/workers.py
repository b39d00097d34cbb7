"""The checkpoint sentinel's per-run workers: one process per run directory, as the user who controls it,
within a time and a memory budget.

**Why a process per run.** Everything a run directory holds is written by its user, and everything the
sentinel does there (open, read, parse) can be made to block (a FIFO, a hung mount), to recurse, or to
allocate. In a process of its own, one run's files cost that run: the agent waits for its answer at
most ``--checkpoint-run-timeout`` seconds per pass, then kills it; a ``MemoryError`` under its
``RLIMIT_AS`` or any other death ends only that worker. And a process can drop root for the run's
owner, which a thread cannot.

**Why fork without exec.** The worker must not need to read the agent's code: CI clones into a 0700
directory, deployments install under ``/root`` or ``/opt`` with tight permissions, and an unprivileged
user exec'ing Python there cannot import it. A forked child already has every module loaded. The agent
is multi-threaded, so the child does nothing that needs a lock another thread may hold: the modules it
uses are imported before the fork, the garbage collector is frozen across it (objects of other threads
are never finalized in the child), logging is off and the standard streams point at ``/dev/null``
(the child returns its messages to the agent, which logs them), no name service lookups (the agent
resolves the user's groups and sends them), and it leaves only through ``os._exit``.

**In the child, in this order:** a new session; default signal handlers, nothing blocked; every
descriptor closed but its socket; the standard ones on ``/dev/null``; no core dumps. Where the agent is
root, the child (still root) walks the run directory's path as far as root alone controls it
(:func:`.owner.walk`) and sends what it found; the agent answers with the credentials to take. Then
supplementary groups, gid and uid (``setgroups``, ``setresgid``, ``setresuid``; a switch back to root
must then fail, or the worker exits), ``PR_SET_DUMPABLE`` 0 (the user it now runs as cannot ptrace it
or read its memory, which is a copy of the agent's), ``PR_SET_NO_NEW_PRIVS``, the parent-death signal,
and ``RLIMIT_AS`` at its current size plus the memory budget. Then it answers requests over its socket,
one length-prefixed JSON frame each way, until the socket closes; before each pass it walks the whole
path again as its user and refuses (``mismatch``) when someone else has a say in it, or (``moved``)
when the directory it entered is no longer the one the path names.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import json
import logging
import os
import resource
import signal
import socket
import stat
import struct
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from babysitter import jsonin
from babysitter.catalog.storage import CHECK_FAILURE_REASONS
from babysitter.node.storage.owner import Identity, Walk, decide, walk
from babysitter.node.storage.runcheck import RunChecker, RunReport, RunSettings

__all__ = ["EXIT_ERROR", "EXIT_MEMORY", "EXIT_PRIVILEGES", "FAILURE_REASONS", "Worker", "WorkerSpec"]

#: Why a run's checks failed (``checkpoint_check_failing{reason}``).
FAILURE_REASONS = CHECK_FAILURE_REASONS
EXIT_MEMORY, EXIT_PRIVILEGES, EXIT_ERROR = 3, 4, 5
_HEADER = struct.Struct(">I")
_MAX_REQUEST = 1 << 16
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 1, 4, 38


def _libc() -> Callable[..., int] | None:
    """``prctl`` from the C library the interpreter is linked with, found now (in the agent), not after
    a fork (and without ``ctypes.util.find_library``, which runs ``ldconfig``)."""
    for name in (None, "libc.so.6"):
        try:
            prctl: Callable[..., int] = ctypes.CDLL(name, use_errno=True).prctl
        except (OSError, AttributeError):
            continue
        return prctl
    return None


_PRCTL = _libc()


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is started with: the run directory as configured, the credentials (None: the agent
    is root, and the worker first walks the path and is told whose to take), the check's settings, the
    memory budget (bytes beyond its size at start), and the test hook that replaces the ledger."""

    run_dir: Path
    identity: Identity | None
    settings: RunSettings
    memory: int
    read_ledger: Callable[[Path], Sequence[object]] | None = None


class WorkerDied(Exception):
    """A worker that cannot answer: ``reason`` is one of :data:`FAILURE_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail


class Worker:
    """The agent's handle on one worker process: its pid, its socket, and the frame being read."""

    def __init__(self, spec: WorkerSpec, pid: int, sock: socket.socket) -> None:
        self.spec = spec
        self.pid = pid
        self.sock = sock
        self.started = time.monotonic()
        #: The credentials it took (None until the agent told it, when the agent is root).
        self.identity = spec.identity
        #: "hello": its walk is due; "ready": it waits for a request; "asked": its answer is due.
        self.state = "hello" if spec.identity is None else "ready"
        self._buffer = bytearray()
        self._status: int | None = None
        self.killed = False

    @classmethod
    def start(cls, spec: WorkerSpec) -> Worker:
        """Fork a worker for ``spec`` (OSError when the system cannot)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        gc.freeze()  # objects of this and other threads stay out of the child's collections
        try:
            pid = os.fork()
        except BaseException:
            gc.unfreeze()
            parent.close()
            child.close()
            raise
        if pid == 0:  # the child: never returns
            code = EXIT_ERROR
            try:
                code = _child(child.fileno(), spec)
            except BaseException:  # nothing may escape into the agent's stack
                code = EXIT_ERROR
            finally:
                os._exit(code)
        gc.unfreeze()
        child.close()
        parent.setblocking(False)
        return cls(spec, pid, parent)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, request: dict[str, object]) -> None:
        """Send one request (small: it fits the socket buffer of a worker that is waiting for it)."""
        data = json.dumps(request, separators=(",", ":")).encode()
        try:
            sent = self.sock.send(_HEADER.pack(len(data)) + data)
        except (BrokenPipeError, ConnectionResetError):
            raise self._ended() from None  # it exited: how says why (no credentials, no memory...)
        except OSError as exc:
            raise WorkerDied("crashed", f"cannot send to the worker: {exc.strerror or exc}") from None
        if sent != _HEADER.size + len(data):
            raise WorkerDied("crashed", "the worker does not read its requests")

    def receive(self, limit: int) -> dict[str, object] | None:
        """Read what is there: the reply once complete (None until then); WorkerDied at the end of the
        stream or for a frame that is not a bounded JSON object."""
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise WorkerDied("crashed", f"{exc.strerror or exc}") from None
        if not data:
            raise self._ended()
        self._buffer += data
        if len(self._buffer) < _HEADER.size:
            return None
        (length,) = _HEADER.unpack_from(self._buffer)
        if length > limit:
            raise WorkerDied("crashed", f"the worker's answer is {length} bytes, more than {limit}")
        if len(self._buffer) < _HEADER.size + length:
            return None
        frame = bytes(self._buffer[_HEADER.size : _HEADER.size + length])
        del self._buffer[: _HEADER.size + length]
        try:
            reply = jsonin.loads(frame, max_bytes=limit)
        except ValueError:
            raise WorkerDied("crashed", "the worker's answer is not JSON") from None
        if type(reply) is not dict:
            raise WorkerDied("crashed", "the worker's answer is not an object")
        return reply

    def _ended(self) -> WorkerDied:
        """Why the worker's stream ended, from how it exited (waits a moment for it to)."""
        status = self.reap(wait=1.0)
        if status is None:
            return WorkerDied("crashed", "the worker closed its socket")
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            reason = {EXIT_MEMORY: "memory", EXIT_PRIVILEGES: "privileges"}.get(code, "error")
            return WorkerDied(reason, f"the worker exited with status {code}")
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        return WorkerDied("crashed", f"the worker was killed by {name}")

    def kill(self) -> None:
        """SIGKILL it (a stopped or hung worker too; one blocked in the kernel dies when the call ends)."""
        self.killed = True
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def reap(self, wait: float = 0.0) -> int | None:
        """Its wait status once it has exited (None while it runs), waiting up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while self._status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored)
                self._status = 0
                break
            if pid:
                self._status = status
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        return self._status

    def close(self) -> None:
        """Close its socket (an idle worker exits on the end of its stream)."""
        with contextlib.suppress(OSError):
            self.sock.close()


# --- the child ----------------------------------------------------------------------------------------


def _quiet() -> None:
    """Nothing the child does may write where the agent writes, or take a lock another thread held: its
    standard descriptors become /dev/null (the Python streams wrap them anew, locks and all)."""
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the child's streams, for its whole life
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115


def _reset_signals() -> None:
    os.setsid()
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a closed socket is an error return, not a death


def _prctl(option: int, value: int) -> bool:
    return _PRCTL is not None and _PRCTL(option, value, 0, 0, 0) == 0


def _drop(identity: Identity) -> None:
    """Take the identity's credentials for good (PermissionError when the agent lacks the right)."""
    if identity.uid is not None:
        gid = identity.gid if identity.gid is not None else identity.uid
        os.setgroups(list(identity.groups))
        os.setresgid(gid, gid, gid)
        os.setresuid(identity.uid, identity.uid, identity.uid)
        if os.getresuid() != (identity.uid,) * 3 or os.getresgid() != (gid,) * 3:
            raise PermissionError(errno.EPERM, "the credentials did not change")
        if identity.uid != 0:
            try:
                os.setuid(0)
            except PermissionError:
                pass
            else:
                raise PermissionError(errno.EPERM, "root could be taken back")
    # After the uid change, which sets it from fs.suid_dumpable (1 on hosts set up for debugging): a
    # worker the user could ptrace would give them a copy of the agent's memory.
    if not _prctl(_PR_SET_DUMPABLE, 0) and identity.uid is not None:
        raise PermissionError(errno.EPERM, "cannot make the worker undumpable")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def _limit_memory(budget: int) -> bool:
    """RLIMIT_AS at the size now plus ``budget``; False when the size cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    limit = pages * os.sysconf("SC_PAGE_SIZE") + budget
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return True


def _frame(obj: dict[str, object]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return _HEADER.pack(len(data)) + data


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    buffer = b""
    while len(buffer) < size:
        chunk = os.read(fd, size - len(buffer))
        if not chunk:
            return None
        buffer += chunk
    return buffer


def _receive(fd: int) -> dict[str, object] | None:
    """The next request, None at the end of the stream (or for one that is not a small JSON object)."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    data = _read_exactly(fd, length) if length <= _MAX_REQUEST else None
    if data is None:
        return None
    request = json.loads(data)
    return request if type(request) is dict else None


def _report(report: RunReport, here: os.stat_result) -> dict[str, object]:
    out = asdict(report)
    out["checks"] = [c.to_json() for c in report.checks]
    out["notes"] = [n[:512] for n in report.notes[:8]]
    out["ok"] = True
    out["dir"] = [here.st_uid, here.st_gid, here.st_mode]
    return out


def _child(fd: int, spec: WorkerSpec) -> int:
    """The worker's life: set up, take its credentials, then answer until the socket closes. Its exit
    status."""
    _reset_signals()
    os.closerange(3, fd)
    os.closerange(fd + 1, max(fd + 2, os.sysconf("SC_OPEN_MAX")))
    _quiet()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    parent = os.getppid()
    identity = spec.identity
    if identity is None:  # root: say who controls the path (as far as root alone does), learn whose rights
        try:
            found = walk(spec.run_dir, full=False)
        except OSError as exc:
            found = Walk(frozenset(), exists=False, why=f"cannot be walked: {exc.strerror or exc}")
        try:
            _send(fd, _frame({"walk": found.to_json()}))
            message = _receive(fd)
        except (OSError, ValueError, RecursionError):
            return EXIT_ERROR
        if message is None:
            return 0
        try:
            identity = Identity.from_json(message.get("identity"))
        except ValueError:
            return EXIT_ERROR
    try:
        _drop(identity)
    except OSError as exc:
        with contextlib.suppress(OSError):
            _send(fd, _frame({"ok": False, "reason": "privileges", "detail": f"{exc.strerror or exc}"}))
        return EXIT_PRIVILEGES
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the agent died before the signal was set
        return 0
    notes = [] if _limit_memory(spec.memory) else ["no memory limit: /proc/self/statm cannot be read"]
    # Preallocated: once memory is short, building an answer may itself fail.
    out_of_memory = _frame({"ok": False, "reason": "memory", "detail": "MemoryError"})
    session = _Session(spec, identity)
    while True:
        try:
            request = _receive(fd)
        except (OSError, ValueError, RecursionError):
            return EXIT_ERROR
        if request is None:
            return 0
        try:
            reply = session.answer(request)
            if notes:
                reply["notes"] = [*notes, *reply.get("notes", [])]  # type: ignore[misc]
                notes = []
            _send(fd, _frame(reply))
        except MemoryError:
            with contextlib.suppress(Exception):
                _send(fd, out_of_memory)
            return EXIT_MEMORY
        except OSError:  # the agent went away
            return 0
        except Exception as exc:  # a bug, or an input no check foresaw: this run only
            with contextlib.suppress(Exception):
                detail = f"{type(exc).__name__}: {str(exc)[:200]}"
                _send(fd, _frame({"ok": False, "reason": "error", "detail": detail}))
            return EXIT_ERROR


class _Session:
    """The worker's state between requests: its run directory (entered once) and the run's checker."""

    def __init__(self, spec: WorkerSpec, identity: Identity) -> None:
        self.spec = spec
        self.identity = identity
        self.checker: RunChecker | None = None
        self.here: os.stat_result | None = None

    def _unchecked(self, why: str) -> dict[str, object]:
        self.checker = self.here = None
        return {"ok": True, "run": None, "ledger_ok": False, "detail": why, "checks": []}

    def answer(self, request: dict[str, object]) -> dict[str, object]:
        """One request: make sure the run directory is still the one its principal alone controls and
        enter it (the first time), then one pass."""
        wall, credit, seconds = request.get("wall"), request.get("credit"), request.get("seconds")
        if type(wall) is not float or type(credit) is not int or type(seconds) is not float:
            return {"ok": False, "reason": "error", "detail": "bad request"}
        owner, private_gid = self.identity.owner, self.identity.private_gid
        if owner is not None:  # every pass: the path may have changed hands since
            found = walk(self.spec.run_dir, full=True)
            if not found.exists:
                return self._unchecked(found.why)
            principal = decide(found, lambda uid: private_gid if uid == owner else None)
            if principal.uid != owner:
                why = principal.why or f"it is controlled by uid {principal.uid}"
                return {"ok": False, "reason": "mismatch", "detail": why}
        try:
            now = os.stat(self.spec.run_dir)
        except OSError as exc:
            return self._unchecked(f"cannot enter the run directory: {exc.strerror or exc}")
        if self.here is not None and (now.st_dev, now.st_ino) != (self.here.st_dev, self.here.st_ino):
            return {"ok": False, "reason": "moved", "detail": "the run directory was replaced"}
        if self.checker is None or self.here is None:
            try:
                os.chdir(self.spec.run_dir)
                here = os.stat(".")
            except OSError as exc:
                return self._unchecked(f"cannot enter the run directory: {exc.strerror or exc}")
            if (here.st_dev, here.st_ino) != (now.st_dev, now.st_ino) or not stat.S_ISDIR(here.st_mode):
                return {"ok": False, "reason": "moved", "detail": "the run directory was replaced"}
            self.here = here
            self.checker = RunChecker(
                self.spec.run_dir,
                replace(self.spec.settings, owner=owner, private_gid=private_gid),
                read_ledger=self.spec.read_ledger,  # type: ignore[arg-type]
            )
        report = self.checker.check(wall, credit, seconds)
        return _report(report, self.here)
