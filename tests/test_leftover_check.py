"""The suite's own check that nothing it started outlives it (leftover_check.py, issue 32), run on a
nested pytest session with xdist workers, as `make test` runs the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proc_helpers import SESSION_MARKER

TESTS = Path(__file__).resolve().parent

LEAKY = """
import os, subprocess, sys

def test_leaks_a_daemon(tmp_path):
    # Its own session, its parent (the worker) gone at the end: what a daemonizing server does.
    p = subprocess.Popen(["sleep", "301"], start_new_session=True)
    (tmp_path.parent.parent / "inherited.pid").write_text(str(p.pid))

def test_leaks_with_a_bare_environment(tmp_path):
    # No inherited marker: found by the session's temp dir in its command line.
    argv = [sys.executable, "-c", "import time; time.sleep(302)", str(tmp_path / "config")]
    p = subprocess.Popen(argv, env={"PATH": os.environ["PATH"]}, start_new_session=True, cwd="/")
    (tmp_path.parent.parent / "bare.pid").write_text(str(p.pid))

def test_cleans_up():
    p = subprocess.Popen(["sleep", "303"])
    p.terminate()
    p.wait()
"""

CLEAN = """
import subprocess

def test_cleans_up():
    p = subprocess.Popen(["sleep", "304"])
    p.kill()
    p.wait()
"""


def _session(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_nested.py").write_text(body)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "leftover_check",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            f"--basetemp={tmp_path / 'bt'}",
            "test_nested.py",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


@pytest.mark.slow
def test_a_process_that_outlives_the_session_fails_it_by_name_and_is_killed(tmp_path: Path) -> None:
    done = _session(tmp_path, LEAKY)
    out = done.stdout + done.stderr
    assert "3 passed" in out, out
    assert done.returncode == 1, out
    inherited = int((tmp_path / "bt/inherited.pid").read_text())
    bare = int((tmp_path / "bt/bare.pid").read_text())
    assert "processes left running" in out and "2 process(es) started by this test session" in out, out
    assert f"pid {inherited} sleep: sleep 301" in out, out
    assert f"pid {bare} python" in out and f"time.sleep(302) {tmp_path}/bt/" in out, out
    assert "sleep 303" not in out  # stopped by its test
    assert not _alive(inherited) and not _alive(bare)


@pytest.mark.slow
def test_a_clean_session_passes_and_spares_other_sessions_processes(tmp_path: Path) -> None:
    """A process of another session (this one's: another marker, another temp dir) is neither
    counted nor killed."""
    other = subprocess.Popen(["sleep", "305"], env={**os.environ, SESSION_MARKER: "another-session"})
    try:
        done = _session(tmp_path, CLEAN)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "1 passed" in out and "processes left running" not in out, out
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
