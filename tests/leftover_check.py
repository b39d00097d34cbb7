"""A pytest plugin: the session fails when a process it started outlives it (loaded by conftest.py).

The controlling pytest process puts a value unique to the session in :data:`SESSION_MARKER` before it
starts its workers; everything the tests start (servers, daemons, trainers) inherits it. A process
that sets its title overwrites what ``/proc/PID/environ`` shows (slurmstepd keeps only its
SLURM_CONF), so a process that names a path under the session's temporary directory (pytest's
basetemp) counts too. After the session, the workers gone, any such process is a leak: the check
waits a few seconds for processes still exiting, then names the rest, kills them and sets the exit
status to 1. Processes of other sessions (other helpers' test runs on the same machine) carry
another value and other paths, and are never counted.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from collections.abc import Generator
from pathlib import Path

import pytest

from proc_helpers import SESSION_MARKER, Proc, find, kill_and_wait

__all__ = ["GRACE_SECONDS"]

#: How long processes that a test's teardown stopped may take to exit before they count as leaks.
GRACE_SECONDS = 10.0


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if not _is_worker(config):  # a nested pytest gets its own value, so it never counts ours
        os.environ[SESSION_MARKER] = f"{os.getpid()}-{uuid.uuid4().hex}"


def _basetemp(config: pytest.Config) -> str | None:
    """The session's temporary directory (its workers' are under it), with a trailing slash; None
    for a ``--basetemp`` as wide as the system's temporary directory, which other sessions share."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return None
    base = Path(factory.getbasetemp()).resolve()
    if Path(tempfile.gettempdir()).resolve().is_relative_to(base):
        return None
    return f"{base}/"


def _leftovers(marker: dict[str, str], basetemp: str | None) -> list[Proc]:
    deadline = time.monotonic() + GRACE_SECONDS
    while True:
        found = find(marker, mentions=basetemp)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    """After every other plugin's sessionfinish: xdist has stopped its workers by then."""
    result = yield
    config = session.config
    value = os.environ.get(SESSION_MARKER)
    if _is_worker(config) or not value:
        return result
    marker = {SESSION_MARKER: value}
    basetemp = _basetemp(config)
    left = _leftovers(marker, basetemp)
    if left:
        survivors = kill_and_wait(left, marker, mentions=basetemp)
        lines = [
            f"{len(left)} process(es) started by this test session outlived it (found by "
            f"{SESSION_MARKER}={value} in their environment, or {basetemp} in it, their command line "
            "or working directory; killed):",
            *(f"  {proc}" for proc in left),
            *(f"  still alive after SIGKILL: {proc}" for proc in survivors),
        ]
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "processes left running", red=True)
            for line in lines:
                reporter.write_line(line)
        else:
            sys.stderr.write("\n".join(lines) + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result
