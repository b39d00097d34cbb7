"""Where babysitter acts (issue 21, point 4): ``babysitter remediate`` serves only with authentication,
undrains only what it drained itself for that alert, and matches names in full.

Before the fix (486be02): without ``--token-file`` the receiver served anyone on the host (one
unprivileged POST drained a node), a drain rehearsed in a dry run was undone for real once the policy
went live, an operator's drain that merely carried the ``babysitter: `` prefix was undone by a resolve,
and ``n1\\n`` was a valid host name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from babysitter import labels as L
from babysitter import registration
from babysitter.remediate.alerts import PayloadError, parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.policy import Hosts, parse_policy
from babysitter.remediate.targets import host_of, valid_host, valid_job
from remediate_helpers import RecordingBackend, alert, payload
from unpriv import public_tmp, run_as_nobody

TOKEN = "remediate-token-0123456789abcdef"  # noqa: S105 - a test token

HOOK = """#!{python}
import json, sys
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"action": sys.argv[1], "doc": json.load(sys.stdin)}}) + "\\n")
"""


def _policy(tmp: Path, hook: Path) -> Path:
    policy = {
        "backend": "script",
        "script": {"path": str(hook)},
        "audit_log": str(tmp / "audit.jsonl"),
        "rails": {
            "rate_limit": {"actions": 10, "window": "10m"},
            "drain_cap": {"fraction": 0.5, "window": "1h", "cluster_nodes": 10},
        },
        "rules": [{"match": {"alertname": "GpuDown"}, "actions": ["drain"]}],
    }
    path = tmp / "policy.json"
    path.write_text(json.dumps(policy))
    return path


def _start(tmp: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    port_file = tmp / f"port-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "babysitter", "remediate", "--policy", str(tmp / "policy.json")]
    argv += ["--port-file", str(port_file), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), port_file


def _served_or_exited(proc: subprocess.Popen[str], port_file: Path, timeout: float = 30.0) -> str | None:
    """The address once serving, or None when the process exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return port_file.read_text().strip()
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    raise AssertionError("remediate neither served nor exited")


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.terminate()
    _, err = proc.communicate(timeout=20)
    return err


_POST = textwrap.dedent(
    """
    import json, sys, urllib.error, urllib.request
    url, token_file, body = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    try:
        open(token_file).read()
        print("read the token", flush=True)
    except PermissionError:
        pass
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            print(response.status)
    except urllib.error.HTTPError as exc:
        print(exc.code)
    """
)


@pytest.fixture(name="shared")
def _shared() -> object:
    yield from public_tmp()


def test_remediate_serves_no_one_without_authentication(shared: Path) -> None:
    """Without a token or mTLS, ``babysitter remediate`` refuses to start (exit 2, saying how to give
    one); with a token (a 0600 file), another local user (nobody) cannot read it and their POST, which
    drained a node before, is refused (401) and runs nothing; Alertmanager's request with the token
    drains."""
    log = shared / "calls.jsonl"
    hook = shared / "hook.py"
    hook.write_text(HOOK.format(python=sys.executable, log=str(log)))
    hook.chmod(0o755)
    _policy(shared, hook)
    proc, port_file = _start(shared, "--listen-address", "127.0.0.1:0")
    try:
        address = _served_or_exited(proc, port_file)
    finally:
        err = _stop(proc)
    assert address is None, "served without authentication"
    assert proc.returncode == 2
    assert "--token-file" in err and "--insecure-no-auth" in err, err

    token = shared / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    proc, port_file = _start(shared, "--listen-address", "127.0.0.1:0", "--token-file", str(token))
    try:
        address = _served_or_exited(proc, port_file)
        assert address is not None, proc.stderr.read() if proc.stderr else ""
        url = f"http://{address}/alerts"
        body = json.dumps(payload(alert("GpuDown", instance="n1:9400", gpu="2")))
        other = run_as_nobody(_POST, url, str(token), body)
        assert other.returncode == 0, other.stderr
        assert other.stdout.split() == ["401"]  # could not read the token, and was refused
        request = urllib.request.Request(
            url, data=body.encode(), method="POST", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            assert response.status == 200
        deadline = time.monotonic() + 20
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        _stop(proc)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["action"], c["doc"]["host"]) for c in calls] == [("drain", "n1")]


def test_insecure_no_auth_is_loopback_only_and_loud(tmp_path: Path) -> None:
    """``--insecure-no-auth`` is refused on a non-loopback address; on loopback it serves and says, at
    start, that anyone on the host can make it act."""
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK.format(python=sys.executable, log=str(tmp_path / "calls.jsonl")))
    hook.chmod(0o755)
    _policy(tmp_path, hook)
    proc, port_file = _start(tmp_path, "--listen-address", "0.0.0.0:0", "--insecure-no-auth")
    try:
        assert _served_or_exited(proc, port_file) is None
    finally:
        err = _stop(proc)
    assert proc.returncode == 2 and "loopback" in err, err
    proc, port_file = _start(tmp_path, "--listen-address", "127.0.0.1:0", "--insecure-no-auth")
    try:
        assert _served_or_exited(proc, port_file) is not None
    finally:
        err = _stop(proc)
    assert "WITHOUT AUTHENTICATION" in err, err


# ------------------------------------------------------------------------------------ undrain


def _engine(tmp: Path, backend: RecordingBackend, *, dry_run: bool, undrain: bool = True) -> Remediator:
    policy = parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(tmp / "audit.jsonl"),
            "dry_run": dry_run,
            "rails": {
                "rate_limit": {"actions": 10, "window": "10m"},
                "drain_cap": {"fraction": 0.5, "window": "1h"},
            },
            "rules": [
                {"match": {"alertname": "GpuDown"}, "actions": ["drain"], "undrain_on_resolve": undrain}
            ],
        }
    )
    return Remediator(policy, backend, AuditLog(policy.audit_log), clock=lambda: 1_700_000_100.0)


def _notify(engine: Remediator, status: str, **labels: str) -> None:
    engine.handle(parse_notification(payload(alert("GpuDown", status=status, fingerprint="ab12", **labels))))


def test_a_rehearsed_drain_is_never_undone_for_real(tmp_path: Path) -> None:
    """A drain made in a dry run (nothing happened to the node) holds nothing: once the policy is live,
    the alert's resolve must not resume a node someone else drained meanwhile."""
    backend = RecordingBackend(["n1", "n2", "n3"])
    rehearsal = _engine(tmp_path, backend, dry_run=True)
    _notify(rehearsal, "firing", instance="n1:9400")
    assert backend.calls == [("drain", "n1", True)]
    rehearsal.audit.close()
    backend.drained["n1"] = "babysitter: drained by an operator for a reason of their own"
    live = _engine(tmp_path, backend, dry_run=False)  # same audit log, the policy went live
    _notify(live, "resolved", instance="n1:9400")
    assert ("undrain", "n1", False) not in backend.calls
    assert "n1" in backend.drained


def test_an_undrain_needs_the_drain_this_remediator_made_for_that_alert(tmp_path: Path) -> None:
    """Remediate drains n1 for an alert; an operator resumes it and drains it again for another reason
    (which even starts with babysitter's prefix): the resolve leaves that drain alone. A resolve of an
    alert that never drained, or whose rule does not undrain, resumes nothing. The drain that is its
    own is undone."""
    backend = RecordingBackend(["n1", "n2", "n3", "n4"])
    engine = _engine(tmp_path, backend, dry_run=False)
    _notify(engine, "firing", instance="n1:9400")
    assert backend.drained["n1"].startswith("babysitter: ")
    backend.drained["n1"] = "babysitter: held for RMA by the operator"
    _notify(engine, "resolved", instance="n1:9400")
    assert backend.drained.get("n1") == "babysitter: held for RMA by the operator"
    assert not [c for c in backend.calls if c[0] == "undrain" and not c[2]]

    backend.drained["n2"] = "babysitter: someone else's"
    _notify(engine, "resolved", instance="n2:9400")  # never drained by this remediator for this alert
    assert "n2" in backend.drained

    engine.audit.close()
    keeps = _engine(tmp_path / "keeps", backend, dry_run=False, undrain=False)
    (tmp_path / "keeps").mkdir(exist_ok=True)
    _notify(keeps, "firing", instance="n3:9400")
    _notify(keeps, "resolved", instance="n3:9400")
    assert "n3" in backend.drained  # the policy does not ask for an undrain

    (tmp_path / "own").mkdir()
    own = _engine(tmp_path / "own", backend, dry_run=False)
    _notify(own, "firing", instance="n4:9400")
    _notify(own, "resolved", instance="n4:9400")
    assert "n4" not in backend.drained
    assert ("undrain", "n4", False) in backend.calls


# ------------------------------------------------------------------------------------ names in full


@pytest.mark.parametrize("bad", ["n1\n", "n1\n\n"])
def test_names_are_matched_in_full(bad: str) -> None:
    """A trailing newline (``$`` matches before it) is refused everywhere a name is checked: host,
    job, the host an alert names, a run in a registration, a user's label name, an alert's label."""
    assert valid_host("n1")
    assert not valid_host(bad)
    assert not valid_job("123" + bad[2:])
    assert not valid_job("ns/pod" + bad[2:])
    assert host_of({"instance": bad + ":9400"}, Hosts()) is None
    assert host_of({"instance": bad}, Hosts()) is None
    good = {"pid": os.getpid(), "start_time": 1.0, "url": "http://127.0.0.1:9/metrics", "run": "r"}
    good |= {"rank": 0, "local_rank": 0, "schema": 1}
    registration.parse_endpoint(good)
    with pytest.raises(ValueError, match="run"):
        registration.parse_endpoint({**good, "run": "r" + bad[2:]})
    with pytest.raises(ValueError):
        registration.parse_endpoint({**good, "url": "http://127.0.0.1:9/metrics" + bad[2:]})
    with pytest.raises(ValueError):
        L.validate_labels({"cluster" + bad[2:]: "x"})
    with pytest.raises(PayloadError):
        parse_notification(
            payload({**alert("GpuDown"), "labels": {"alertname": "GpuDown", "a" + bad[2:]: "x"}})
        )
