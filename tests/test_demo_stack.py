"""The demo's plumbing: the pager receiver over real HTTP, process groups that stop completely, and the
Prometheus configuration checked by promtool (the Alertmanager one: test_demo_routing.py)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from babysitter.demo.pager import Page, PagerServer
from babysitter.demo.runner import demo_generate_config
from babysitter.demo.stack import (
    Stack,
    find_binaries,
    prometheus_config,
    write_json,
)

# An Alertmanager 0.25 webhook body, as its notifier sends it (trimmed to the fields the pager reads
# plus the envelope).
NOTIFICATION = {
    "version": "4",
    "groupKey": '{}:{alertname="GpuDown"}',
    "status": "firing",
    "receiver": "pager",
    "groupLabels": {"alertname": "GpuDown"},
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "GpuDown", "severity": "critical", "gpu": "3", "instance": "n1:9946"},
            "annotations": {"summary": "GPU 3 of n1:9946 does not answer."},
            "startsAt": "2026-11-30T03:00:00Z",
        },
        {
            "status": "resolved",
            "labels": {"alertname": "TrainingStalled", "severity": "critical", "run": "demo"},
            "annotations": {},
        },
    ],
}


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})  # noqa: S310 - loopback test URL
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback test URL
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _post_headers_only(port: int, length: int) -> int:
    """A POST announcing ``length`` bytes: an oversized body is refused before it is read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.putrequest("POST", "/pager")
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        return int(conn.getresponse().status)
    finally:
        conn.close()


def test_pager_receives_alertmanager_notifications() -> None:
    got: list[Page] = []
    pager = PagerServer(got.append).start()
    try:
        assert pager.url.startswith("http://127.0.0.1:")
        assert _post(pager.url, json.dumps(NOTIFICATION).encode()) == 200
        assert [(p.status, p.name, p.severity, p.subject()) for p in got] == [
            ("firing", "GpuDown", "critical", "instance=n1:9946 gpu=3"),
            ("resolved", "TrainingStalled", "critical", "run=demo"),
        ]
        assert got[0].summary == "GPU 3 of n1:9946 does not answer."
        assert {p.receiver for p in got} == {"pager"}, "the notification's receiver"
        assert pager.url_for("chat") == f"http://127.0.0.1:{pager.port}/chat"
        assert pager.snapshot() == got
    finally:
        pager.close()


def test_pager_rejects_garbage_and_keeps_serving(caplog: pytest.LogCaptureFixture) -> None:
    def broken(page: Page) -> None:
        raise RuntimeError("terminal gone")

    pager = PagerServer(broken).start()
    try:
        assert _post(pager.url, b"{not json") == 400
        assert _post(pager.url, b'{"alerts": "many"}') == 400
        assert _post_headers_only(pager.port, 1024 * 1024 + 1) == 413
        assert pager.rejected == 2
        assert sum("malformed notification" in r.message for r in caplog.records) == 1
        # A callback that raises costs a log line, not the receiver.
        assert _post(pager.url, json.dumps(NOTIFICATION).encode()) == 200
        assert len(pager.snapshot()) == 2
        assert any("page callback failed" in r.message for r in caplog.records)
    finally:
        pager.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


# A child that ignores SIGTERM and starts a grandchild, printing both pids.
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(g.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _grandchild(stack: Stack, name: str) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = stack.log_path(name).read_text().strip()
        if text:
            return int(text.splitlines()[0])
        time.sleep(0.05)
    raise AssertionError("child did not report its grandchild")


def test_stack_stops_whole_process_groups(tmp_path: Path) -> None:
    """SIGTERM-ignoring children, their own children and frozen ones: all gone after close()."""
    stack = Stack(tmp_path, grace=2.0)
    try:
        stubborn = stack.start("stubborn", [sys.executable, "-c", STUBBORN])
        grandchild = _grandchild(stack, "stubborn")
        frozen = stack.start("frozen", [sys.executable, "-c", "import time; time.sleep(600)"])
        assert stack.signal("frozen", signal.SIGSTOP)
        assert os.getpgid(stubborn.pid) == stubborn.pid, "own process group"
        t = time.monotonic()
        with pytest.raises(Exception, match="already running"):
            stack.start("frozen", ["true"])
        for proc in (stubborn, frozen):
            assert proc.poll() is None
        stack.stop("frozen", grace=5)
        assert frozen.returncode == -signal.SIGTERM, "SIGCONT let the frozen child take its SIGTERM"
        stack.close()
        assert stubborn.returncode == -signal.SIGKILL
        assert _wait_dead([stubborn.pid, grandchild]) == []
        assert time.monotonic() - t < 20
        stack.close()  # idempotent
        assert not stack.signal("stubborn", signal.SIGTERM)
    finally:
        stack.close()


def test_children_die_with_a_killed_demo(tmp_path: Path) -> None:
    """The parent-death signal: SIGKILL the process that owns the Stack, its children go too."""
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from babysitter.demo.stack import Stack\n"
            "s = Stack(Path(sys.argv[1]))\n"
            "p = s.start('sleeper', [sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        time.sleep(0.5)  # let the guard exec the sleeper
        assert _alive(child)
        owner.kill()
        owner.wait(timeout=10)
        assert _wait_dead([child]) == [], "orphan left behind"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_find_binaries_checks_given_paths(tmp_path: Path) -> None:
    missing = find_binaries(str(tmp_path / "nope" / "prometheus"), str(tmp_path / "alertmanager"))
    assert missing.prometheus is None and missing.alertmanager is None
    assert missing.missing() == ["prometheus", "alertmanager"]
    not_exec = tmp_path / "prometheus"
    not_exec.write_text("")
    assert find_binaries(str(not_exec), None).prometheus is None


PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


@pytest.mark.prometheus
def test_configs_pass_promtool_and_amtool(tmp_path: Path) -> None:
    """The demo's Prometheus config (with the fast-profile rules) is valid."""
    from babysitter.generate.writer import ALERT_RULES, RECORDING_RULES, render

    if not Path(PROMTOOL).exists():
        pytest.skip(f"{PROMTOOL} not installed (apt-get install prometheus)")
    files = render(demo_generate_config())
    rules = []
    for rel in (RECORDING_RULES, ALERT_RULES):
        path = tmp_path / Path(rel).name
        path.write_text(files[rel])
        rules.append(path)
    prom = write_json(
        tmp_path / "prometheus.yml",
        prometheus_config(
            agent="127.0.0.1:1234", rule_files=rules, alertmanager="127.0.0.1:9", cluster="demo"
        ),
    )
    out = subprocess.run([PROMTOOL, "check", "config", str(prom)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
    alerts = (tmp_path / Path(ALERT_RULES).name).read_text()
    assert "CheckpointSaveSlow" in alerts and "> 1\n" in alerts, "the demo's slow-save threshold is 1 s"
    # The Alertmanager configuration (the shipped routing): tests/test_demo_routing.py.


def test_a_stopped_trainer_is_one_failed_endpoint_within_the_scrape_timeout(tmp_path: Path) -> None:
    """The demo's node agent with a registered trainer that never answers (as a SIGSTOPped process:
    the kernel accepts the connection, nobody reads it). Its fetch must fail alone, inside the
    collector's deadline, so the trainers collector still succeeds and reports the endpoint down:
    what TrainingStalled reads for a frozen run. With the collector deadline below the fetch's (the
    demo had 0.8 s against 2 s) the whole collector failed and the freeze never paged."""
    from babysitter import registration
    from babysitter.catalog import node as N
    from babysitter.demo.runner import COLLECTOR_TIMEOUT, TRAINER_TIMEOUT, node_agent_argv
    from babysitter.demo.stack import SCRAPE_TIMEOUT
    from node_helpers import parse_exposition, read_port_file

    assert TRAINER_TIMEOUT < COLLECTOR_TIMEOUT < SCRAPE_TIMEOUT
    registry = tmp_path / "registry"
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(8)
        pid = os.getpid()
        registration.register(
            registry,
            registration.Endpoint(
                pid,
                registration.process_start_time(pid),
                f"http://127.0.0.1:{frozen.getsockname()[1]}/metrics",
                "demo",
                0,
                0,
            ),
        )
        scenario = write_json(tmp_path / "scenario.json", {"events": []})
        argv = node_agent_argv(
            port_file=tmp_path / "addr",
            gpus=1,
            gpu_model="H100",
            scenario=scenario,
            kernel_log=tmp_path / "kern.log",
            registry=registry,
            run_dir=tmp_path / "run",
            jobs_dir=tmp_path / "jobs",
        )
        (tmp_path / "run").mkdir()
        (tmp_path / "jobs").mkdir()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            address = read_port_file(tmp_path / "addr")
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                s = parse_exposition(response.read().decode())
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
    assert s.value(N.COLLECTOR_SUCCESS.name, collector="trainers") == 1, out.decode()
    assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="demo", rank="0") == 0
    assert s.value(N.TRAINER_SCRAPE_ERRORS.name, run="demo", rank="0", reason="timeout") == 1


def test_keep_points_at_dashboards_for_the_demos_profile(tmp_path: Path) -> None:
    """``demo --keep`` names dashboards generated with the rules the demo's Prometheus records (the fast
    profile): every recorded series a panel reads is one the demo records, none is production's rate5m."""
    import io
    import re

    from rich.console import Console

    from babysitter.demo.runner import DemoOptions, _Demo
    from babysitter.demo.scenario import default_scenario
    from babysitter.generate.writer import RECORDING_RULES, render

    files = render(demo_generate_config())
    out = io.StringIO()
    demo = _Demo(DemoOptions(default_scenario(), workdir=tmp_path), Console(file=out, width=200))
    try:
        demo.agent_address = "127.0.0.1:1"
        demo.prometheus_url = "http://127.0.0.1:2"
        demo.write_dashboards(files)
        demo.keep_message()
    finally:
        demo.stack.close()
    message = out.getvalue()
    assert f"Import each JSON file of {tmp_path / 'dashboards'}" in message, message
    recorded = set(re.findall(r"record: '([^']+)'", files[RECORDING_RULES]))
    dashboards = sorted((tmp_path / "dashboards").glob("*.json"))
    assert len(dashboards) == 4
    used = {name for d in dashboards for name in re.findall(r"\b[a-z_]+:[a-z_]+:[a-z0-9_]+\b", d.read_text())}
    assert used and used <= recorded, used - recorded
    assert not any("5m" in name for name in used), "production's windows: empty panels in the demo"
