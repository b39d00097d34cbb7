"""The script backend: a user's program run as ``PATH ACTION`` (no shell) with the alert as JSON on stdin."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from babysitter.remediate.backends.script import ScriptBackend
from babysitter.remediate.policy import ScriptOptions

ALERT = {"name": "GpuXidCritical", "labels": {"instance": "n1:9400", "xid": "79"}, "starts_at": 1.0}

HOOK = """#!{python}
import json, sys
record = {{"argv": sys.argv[1:], "stdin": json.load(sys.stdin)}}
with open({log!r}, "a") as fh:
    fh.write(json.dumps(record) + "\\n")
print("hook says", sys.argv[1])
sys.exit({code})
"""


def hook(
    tmp: Path, *, code: int = 0, body: str | None = None, timeout: float = 5.0
) -> tuple[ScriptBackend, Path]:
    log = tmp / "calls.jsonl"
    path = tmp / "hook.py"
    path.write_text(body or HOOK.format(python=sys.executable, log=str(log), code=code))
    path.chmod(0o755)
    return ScriptBackend(ScriptOptions(path=str(path), timeout=timeout)), log


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_each_action_runs_the_program_with_the_documented_json_on_stdin(tmp_path: Path) -> None:
    """drain, undrain, requeue and annotate (of a host, of a job) run ``PATH ACTION`` with the
    action, host, job, reason, dry_run and the alert on stdin; exit 0 is success."""
    backend, log = hook(tmp_path)
    assert backend.drain("n1", "babysitter: Xid 79", dry_run=False, alert=ALERT).ok
    assert backend.undrain("n1", "babysitter: ", dry_run=False, alert=ALERT).ok
    assert backend.requeue("12", "babysitter: Xid 79", dry_run=False, alert=ALERT).ok
    out = backend.annotate_host("n2", "babysitter: hot", dry_run=False, alert=ALERT)
    assert out.ok and out.steps[0].output == "hook says annotate" and out.steps[0].code == 0
    assert backend.annotate_job("13", "babysitter: slow", dry_run=False).ok
    seen = calls(log)
    assert [c["argv"] for c in seen] == [["drain"], ["undrain"], ["requeue"], ["annotate"], ["annotate"]]
    assert seen[0]["stdin"] == {
        "action": "drain",
        "host": "n1",
        "job": None,
        "reason": "babysitter: Xid 79",
        "dry_run": False,
        "alert": ALERT,
    }
    assert (seen[2]["stdin"]["host"], seen[2]["stdin"]["job"]) == (None, "12")  # type: ignore[index]
    assert (seen[3]["stdin"]["host"], seen[3]["stdin"]["job"]) == ("n2", None)  # type: ignore[index]
    assert (seen[4]["stdin"]["host"], seen[4]["stdin"]["job"]) == (None, "13")  # type: ignore[index]


def test_a_dry_run_runs_nothing_and_records_the_command(tmp_path: Path) -> None:
    """A dry run plans the command and does not run the program."""
    backend, log = hook(tmp_path)
    out = backend.drain("n1", "babysitter: x", dry_run=True)
    assert out.ok and out.steps[0].argv == (str(tmp_path / "hook.py"), "drain") and out.steps[0].ok is None
    assert calls(log) == []


def test_a_failing_or_hanging_program_is_a_failed_action_with_its_output(tmp_path: Path) -> None:
    """Exit 3: failed, with what the program printed; past the timeout: failed, 'timed out'; a
    program that cannot run: failed, saying why."""
    backend, _ = hook(tmp_path, code=3)
    out = backend.requeue("12", "x", dry_run=False)
    assert not out.ok and out.steps[0].code == 3 and "hook says requeue" in out.detail
    slow, _ = hook(tmp_path, body="#!/bin/sh\nexec sleep 60\n", timeout=0.5)
    out = slow.drain("n1", "x", dry_run=False)
    assert not out.ok and "timed out after 0.5 s" in out.detail
    missing = ScriptBackend(ScriptOptions(path=str(tmp_path / "absent"), timeout=1.0))
    out = missing.drain("n1", "x", dry_run=False)
    assert not out.ok and "cannot run" in out.detail


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_timeout_kills_everything_the_program_started(tmp_path: Path) -> None:
    """A hook that starts a child and hangs: at the timeout the hook and its child are both killed (a
    child left running could hold the remediator's pipe or act after the action was called failed)."""
    pid_file = tmp_path / "child.pid"
    body = f"#!/bin/sh\nsleep 120 >/dev/null 2>&1 &\necho $! > {pid_file}\nexec sleep 120\n"
    backend, _ = hook(tmp_path, body=body, timeout=1.0)
    out = backend.drain("n1", "x", dry_run=False)
    child = int(pid_file.read_text())
    try:
        assert not out.ok and "timed out after 1 s" in out.detail
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the hook's child outlived the timeout"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
