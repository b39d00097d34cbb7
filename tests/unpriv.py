"""Running test code as an unprivileged user (``nobody``), or skipping and saying why it cannot run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["NOBODY", "nobody_python", "popen_as_nobody", "public_tmp", "run_as_nobody"]

NOBODY = 65534
_TESTS = Path(__file__).resolve().parent


def nobody_python() -> list[str]:
    """The command prefix running this Python as uid/gid 65534; skips when that is impossible."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to an unprivileged user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c"]
    probe = subprocess.run(
        [*prefix, "import babysitter, node_helpers"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        cwd="/",
    )
    if probe.returncode != 0:
        # A checkout under a 0700 directory (mktemp -d) cannot be read by the unprivileged user.
        pytest.skip(f"this checkout is not readable by an unprivileged user: {probe.stderr.strip()[-200:]}")
    return prefix


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(_TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def run_as_nobody(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -c script args...`` as nobody and wait for it."""
    return subprocess.run(
        [*nobody_python(), script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd="/",
    )


def popen_as_nobody(script: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -c script args...`` as nobody (stdout piped)."""
    return subprocess.Popen(
        [*nobody_python(), script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd="/",
    )


def public_tmp() -> Iterator[Path]:
    """A temp directory every user can traverse (pytest's tmp_path is 0700, closed to nobody).

    A generator for a fixture: ``yield from public_tmp()``.
    """
    path = Path(tempfile.mkdtemp(prefix="babysitter-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
