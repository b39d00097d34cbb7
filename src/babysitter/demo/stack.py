"""Start and stop the demo's processes: everything on loopback, in one work directory, nothing left behind.

Each child runs in its own session (process group) so that stopping it also stops what it started,
and so that Ctrl-C in the terminal reaches only the demo, which then stops the children in order
(SIGCONT for a frozen one, SIGTERM, then SIGKILL after a grace period). On Linux a child also gets a
parent-death signal, so even a SIGKILLed demo leaves no orphan behind. :meth:`Stack.close` is
registered with ``atexit`` and is idempotent.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "INSTALL_HINT",
    "SCRAPE_TIMEOUT",
    "Binaries",
    "Stack",
    "StackError",
    "find_binaries",
    "free_port",
    "prometheus_config",
    "wait_ready",
    "write_json",
]

log = logging.getLogger(__name__)

#: Prometheus's scrape interval and timeout in the demo, in seconds.
SCRAPE_TIMEOUT = 1.0

INSTALL_HINT = "sudo apt-get install prometheus prometheus-alertmanager"

# Runs in the child before exec: die with the demo (PR_SET_PDEATHSIG = 1), unless it is already gone.
_GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class StackError(RuntimeError):
    """A process of the stack failed to start or become ready."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the Prometheus and Alertmanager binaries (None: not installed)."""

    prometheus: str | None
    alertmanager: str | None

    def missing(self) -> list[str]:
        """Names of the missing ones."""
        return [
            name
            for name, path in (("prometheus", self.prometheus), ("alertmanager", self.alertmanager))
            if not path
        ]


def _find(explicit: str | None, names: Sequence[str]) -> str | None:
    if explicit is not None:
        path = shutil.which(explicit) if os.sep not in explicit else explicit
        return path if path and os.access(path, os.X_OK) and Path(path).is_file() else None
    for name in names:
        found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/local/bin")
        if found:
            return found
    return None


def find_binaries(prometheus: str | None = None, alertmanager: str | None = None) -> Binaries:
    """Look for the binaries on PATH and in /usr/bin (Debian's package names), or check given paths."""
    return Binaries(
        prometheus=_find(prometheus, ("prometheus",)),
        alertmanager=_find(alertmanager, ("prometheus-alertmanager", "alertmanager")),
    )


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (for servers that cannot bind port 0 themselves)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prometheus_config(
    *, agent: str | None, rule_files: Sequence[Path], alertmanager: str | None, cluster: str
) -> dict[str, object]:
    """Scrape the node agent every second (it serves the trainers too), evaluate rules every second."""
    config: dict[str, object] = {
        "global": {
            "scrape_interval": f"{SCRAPE_TIMEOUT:g}s",
            "scrape_timeout": f"{SCRAPE_TIMEOUT:g}s",
            "evaluation_interval": "1s",
        },
        "scrape_configs": [
            {
                "job_name": "babysitter-node",
                # As exporters/prometheus-scrape.yml: no honor_labels, the trainer's own cluster dropped.
                "static_configs": [{"targets": [agent] if agent else [], "labels": {"cluster": cluster}}],
                "metric_relabel_configs": [{"action": "labeldrop", "regex": "exported_.*"}],
            }
        ],
        "rule_files": [str(p) for p in rule_files],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


def wait_ready(url: str, proc: subprocess.Popen[bytes], *, timeout: float, what: str, log_path: Path) -> None:
    """Poll ``url`` until it answers 200; StackError when the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{what} exited with {proc.returncode}: {_tail(log_path)}")
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(url, timeout=1) as response,  # noqa: S310 - loopback URL we built
        ):
            if response.status == 200:
                return
        time.sleep(0.2)
    raise StackError(f"{what} not ready after {timeout:g} s: {_tail(log_path)}")


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip() or "(empty log)"
    except OSError:
        return "(no log)"


class Stack:
    """The processes the demo started, each with a log file under ``workdir/logs``."""

    def __init__(self, workdir: Path, *, grace: float = 10.0) -> None:
        self.workdir = workdir
        self.grace = grace
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True, mode=0o755)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._files: list[IO[bytes]] = []
        self._closed = False
        atexit.register(self.close)

    def log_path(self, name: str) -> Path:
        """Where the output of process ``name`` goes."""
        return self.logs / f"{name}.log"

    def start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` (no shell) in its own session, output appended to its log."""
        if self._closed:
            raise StackError("the stack is closed")
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise StackError(f"{name} is already running (pid {old.pid})")
        out = self.log_path(name).open("ab")
        self._files.append(out)
        full = list(argv)
        if sys.platform.startswith("linux"):
            full = [sys.executable, "-c", _GUARD, str(os.getpid()), *full]
        proc = subprocess.Popen(
            full,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            close_fds=True,
        )
        self.procs[name] = proc
        return proc

    def start_server(
        self,
        name: str,
        argv: Callable[[int], Sequence[str]],
        *,
        ready_path: str = "/-/ready",
        timeout: float = 60.0,
        attempts: int = 3,
    ) -> int:
        """Start a server that cannot bind port 0 itself on a free loopback port (``argv(port)``) and
        wait until ``ready_path`` answers; another port when the one picked was taken meanwhile."""
        for attempt in range(1, attempts + 1):
            port = free_port()
            proc = self.start(name, argv(port))
            try:
                wait_ready(
                    f"http://127.0.0.1:{port}{ready_path}",
                    proc,
                    timeout=timeout,
                    what=name,
                    log_path=self.log_path(name),
                )
                return port
            except StackError as exc:
                if attempt == attempts or "address already in use" not in str(exc):
                    raise
                log.warning("demo: %s lost its port %d to another process, retrying", name, port)
                self.stop(name, grace=2)
        raise AssertionError("unreachable")  # pragma: no cover

    def alive(self, name: str) -> bool:
        """Whether process ``name`` runs."""
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def signal(self, name: str, sig: int) -> bool:
        """Send ``sig`` to process ``name``'s group; False when it is not running."""
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
            return True
        return False

    def stop(self, name: str, *, grace: float | None = None) -> int | None:
        """SIGCONT + SIGTERM the group, SIGKILL after ``grace`` s (default: the stack's); the exit code
        (None if never started)."""
        grace = self.grace if grace is None else grace
        proc = self.procs.get(name)
        if proc is None:
            return None
        if proc.poll() is None:
            self.signal(name, signal.SIGCONT)
            self.signal(name, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("demo: %s did not stop in %g s, killing it", name, grace)
                self.signal(name, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        # Anything the child left in its group (a grandchild) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.returncode

    def close(self) -> None:
        """Stop every process, newest first; never raises. Safe to call again, also after an
        interruption: a later call (atexit) stops the ones an interrupted call did not reach."""
        self._closed = True
        for name in reversed(list(self.procs)):
            try:
                self.stop(name)
            except Exception as exc:  # keep stopping the others
                log.warning("demo: stopping %s failed: %s", name, exc)
            self.procs.pop(name, None)
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


def write_json(path: Path, data: object) -> Path:
    """Write ``data`` as JSON (also valid YAML for Prometheus and Alertmanager), mode 0644."""
    path.write_text(json.dumps(data, indent=2) + "\n")
    path.chmod(0o644)
    return path
