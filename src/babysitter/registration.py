"""The local registration directory: how a node agent finds every tracker endpoint on its host.

Each tracker writes one small JSON file per metrics endpoint; the agent lists the directory, drops
files whose process is gone (pid and process start time must both match, so a reused pid is not
mistaken for the trainer), and serves those endpoints' metrics on its own port.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

__all__ = [
    "ENV_DIR",
    "Endpoint",
    "default_dir",
    "is_alive",
    "list_endpoints",
    "process_start_time",
    "register",
    "unregister",
]

log = logging.getLogger(__name__)

ENV_DIR = "BABYSITTER_REGISTRY_DIR"
_SCHEMA = 1
_MAX_FILE_BYTES = 16 * 1024


@dataclass(frozen=True)
class Endpoint:
    """One registered metrics endpoint of a training process."""

    pid: int
    start_time: float
    url: str
    run: str
    rank: int
    local_rank: int

    @property
    def name(self) -> str:
        """File name of the registration: unique per process and URL."""
        port = self.url.rsplit(":", 1)[-1].split("/", 1)[0]
        return f"{self.pid}-{port}.json"


def default_dir() -> Path:
    """``$BABYSITTER_REGISTRY_DIR``, else ``/tmp/babysitter`` (shared by every user of the host)."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path(tempfile.gettempdir()) / "babysitter"


def process_start_time(pid: int) -> float:
    """The process's start time as psutil reports it (stable for the process's life)."""
    return float(psutil.Process(pid).create_time())


def register(directory: Path, endpoint: Endpoint) -> Path:
    """Write the endpoint's registration atomically; raises OSError when the directory is unusable."""
    _ensure_dir(directory)
    target = directory / endpoint.name
    payload = json.dumps({"schema": _SCHEMA, **asdict(endpoint)}, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(prefix=".reg-", dir=directory)
    try:
        os.fchmod(fd, 0o644)  # the agent may run as another user; the file holds no secret
        os.write(fd, payload)
        os.close(fd)
        fd = -1
        os.replace(tmp, target)
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


def unregister(path: Path) -> None:
    """Remove a registration; a missing file is fine."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def is_alive(endpoint: Endpoint) -> bool:
    """True while the registering process still runs (same pid and same start time)."""
    try:
        return abs(process_start_time(endpoint.pid) - endpoint.start_time) < 1.0
    except (psutil.Error, OSError):
        return False


def list_endpoints(directory: Path, *, prune: bool = False) -> list[Endpoint]:
    """The live endpoints registered in ``directory``; with ``prune``, delete dead and bad files.

    Unreadable or malformed files are skipped with a log line. Only loopback URLs are accepted:
    a file in a shared directory must not make the agent fetch from elsewhere.
    """
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    found: list[Endpoint] = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = directory / name
        endpoint = _read(path)
        if endpoint is None or not is_alive(endpoint):
            if prune:
                unregister(path)
            continue
        found.append(endpoint)
    return found


def _read(path: Path) -> Endpoint | None:
    try:
        raw = _read_regular_file(path)
        data = json.loads(raw)
        if data.get("schema") != _SCHEMA:
            raise ValueError(f"unknown schema {data.get('schema')!r}")
        endpoint = Endpoint(
            pid=int(data["pid"]),
            start_time=float(data["start_time"]),
            url=str(data["url"]),
            run=str(data["run"]),
            rank=int(data["rank"]),
            local_rank=int(data["local_rank"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("babysitter: skipping bad registration %s: %s", path, exc)
        return None
    if not _is_loopback_url(endpoint.url):
        log.warning("babysitter: skipping registration %s: %s is not a loopback URL", path, endpoint.url)
        return None
    return endpoint


def _read_regular_file(path: Path) -> bytes:
    """Read a small regular file without following links or blocking.

    The directory is shared by every user of the host and the agent may run as root: a link to a
    secret, or a FIFO that would block the agent forever, must be refused, not read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        raw = os.read(fd, _MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > _MAX_FILE_BYTES:
        raise ValueError("file too large")
    return raw


def _is_loopback_url(url: str) -> bool:
    for prefix in ("http://", "https://"):
        if url.startswith(prefix):
            host = url[len(prefix) :].split("/", 1)[0].rsplit(":", 1)[0]
            return host in {"127.0.0.1", "localhost", "[::1]"}
    return False


def _ensure_dir(directory: Path) -> None:
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        # Shared like /tmp: every user's trainers register here; the sticky bit stops them
        # deleting each other's files.
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o1777)  # noqa: S103 (sticky, shared like /tmp: see above)
    mode = directory.stat().st_mode
    if not stat.S_ISDIR(mode):
        raise NotADirectoryError(str(directory))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"registration directory {directory} is not writable")
