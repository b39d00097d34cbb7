"""The tracker's side: write (and remove) this process's registration in its user's own directory.

Layout: ``<dir>/<uid>/<pid>-<port>.json``. ``<dir>`` is shared by every user like /tmp (mode 1777,
sticky: nobody can delete or rename another user's entry); ``<dir>/<uid>`` belongs to that user
alone (mode 0755), so no other user can add, replace or remove a file in it, and a name another user
squats on (a directory called ``<uid>`` they own) is refused here with an error instead of used.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from dataclasses import asdict
from pathlib import Path

import psutil

from babysitter.registration._endpoint import SCHEMA, Endpoint, parse_endpoint
from babysitter.registration.scan import is_alive, read_registration

__all__ = ["ENV_DIR", "default_dir", "process_start_time", "register", "unregister", "user_dir"]

ENV_DIR = "BABYSITTER_REGISTRY_DIR"


def default_dir() -> Path:
    """``$BABYSITTER_REGISTRY_DIR``, else ``/tmp/babysitter`` (shared by every user of the host)."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path(tempfile.gettempdir()) / "babysitter"


def process_start_time(pid: int) -> float:
    """The process's start time as psutil reports it (stable for the process's life)."""
    return float(psutil.Process(pid).create_time())


def user_dir(directory: Path, uid: int | None = None) -> Path:
    """Where the registrations of ``uid`` (default: this process's) live."""
    return directory / str(os.geteuid() if uid is None else uid)


def register(directory: Path, endpoint: Endpoint) -> Path:
    """Write the endpoint's registration atomically; OSError saying why when it cannot.

    Dead registrations of the same user (a SIGKILLed run) are removed on the way: only their owner
    (or root) may remove them, and an agent that runs as a dynamic user cannot.
    """
    parse_endpoint({"schema": SCHEMA, **asdict(endpoint)})  # what the agent would refuse, refuse here
    own = _ensure_user_dir(directory)
    _prune_dead(own)
    target = own / endpoint.name
    payload = json.dumps({"schema": SCHEMA, **asdict(endpoint)}, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(prefix=".reg-", dir=own)
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
    """Remove a registration; a missing file is fine, and so is any other error (it is only a hint)."""
    with contextlib.suppress(OSError):
        path.unlink()


def _ensure_user_dir(directory: Path) -> Path:
    _ensure_shared_dir(directory)
    own = user_dir(directory)
    with contextlib.suppress(FileExistsError):
        os.mkdir(own, 0o755)
        os.chmod(own, 0o755)  # noqa: S103 (whatever the umask: the agent, another user, must read it)
    st = os.lstat(own)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"registration directory {own} is not a directory")
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"registration directory {own} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}): another user created it; an administrator should remove it"
        )
    if st.st_mode & 0o022:
        os.chmod(own, 0o755)  # noqa: S103 (readable by the agent, writable by this user alone)
    return own


def _ensure_shared_dir(directory: Path) -> None:
    if not os.path.lexists(directory):
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o755)
            # Shared like /tmp: every user's trainers register here; the sticky bit stops them
            # deleting or renaming each other's directories. An administrator should create it
            # root-owned instead (exporters/): its owner may delete anything in it.
            with contextlib.suppress(OSError):
                os.chmod(directory, 0o1777)  # noqa: S103 (sticky, shared like /tmp: see above)
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        raise NotADirectoryError(f"registration directory {directory} is a symbolic link; refusing it")
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(str(directory))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"registration directory {directory} is not writable")


def _prune_dead(own: Path) -> None:
    with contextlib.suppress(OSError):
        for entry in os.scandir(own):
            if not entry.name.endswith(".json"):
                continue
            try:
                endpoint = read_registration(Path(entry.path))
            except (OSError, ValueError):
                continue
            if not is_alive(endpoint):
                unregister(Path(entry.path))
