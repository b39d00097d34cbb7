"""The demo routes alerts as production does: exporters/alertmanager.yml's severity routes and
inhibitions, run by a real Alertmanager, its receivers pointed at the demo's webhook. A critical goes
to the pager and chat, a warning to chat only, an alert inhibited by TrainingStalled nowhere, and GPU
alerts also to the remediator."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from babysitter.demo.pager import Page, PagerServer
from babysitter.demo.routing import (
    REMEDIATE_RECEIVER,
    RoutingError,
    demo_alertmanager_config,
    load_routing,
    shipped_routing,
)
from babysitter.demo.stack import Stack, write_json
from promkit import ALERTMANAGER, require_binary

AMTOOL = "/usr/bin/amtool"


def _alert(name: str, severity: str, component: str, **labels: str) -> dict[str, object]:
    return {
        "labels": {
            "alertname": name,
            "severity": severity,
            "component": component,
            "cluster": "demo",
            **labels,
        },
        "annotations": {"summary": name},
    }


def _config(pager: PagerServer) -> dict[str, object]:
    path = shipped_routing()
    assert path is not None, "the package's data/alertmanager.yml (exporters/alertmanager.yml links to it)"
    return demo_alertmanager_config(load_routing(path), pager.url_for, pager.url_for(REMEDIATE_RECEIVER))


def test_shipped_routing_with_the_demos_receivers(tmp_path: Path) -> None:
    pager = PagerServer(lambda page: None).start()
    try:
        config = _config(pager)
    finally:
        pager.close()
    route = config["route"]
    assert isinstance(route, dict)
    assert (route["group_wait"], route["group_interval"]) == ("1s", "2s")
    assert route["routes"][0]["receiver"] == REMEDIATE_RECEIVER
    shipped = ["deadmansswitch", "pager", "chat", "chat"]
    assert [r["receiver"] for r in route["routes"][1:]] == shipped, "shipped order kept"
    assert config["inhibit_rules"] == load_routing(shipped_routing() or Path()).get("inhibit_rules")
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in config["receivers"]}  # type: ignore[attr-defined]
    assert set(urls) == {"deadmansswitch", "pager", "pager-training", "chat", REMEDIATE_RECEIVER}
    assert all(url.startswith(f"http://127.0.0.1:{pager.port}/") for url in urls.values())
    if Path(AMTOOL).exists():
        out = subprocess.run(
            [AMTOOL, "check-config", str(write_json(tmp_path / "am.yml", config))],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr


def test_bad_routing_is_a_setup_error(tmp_path: Path) -> None:
    bad = tmp_path / "am.yml"
    bad.write_text("receivers: []\n")
    with pytest.raises(RoutingError, match="no 'route'"):
        load_routing(bad)
    bad.write_text("route: {receiver: x}\nreceivers: [{url: y}]\n")
    with pytest.raises(RoutingError, match="named receivers"):
        load_routing(bad)
    with pytest.raises(RoutingError, match=r"missing\.yml"):
        load_routing(tmp_path / "missing.yml")


@pytest.mark.prometheus
def test_real_alertmanager_routes_by_severity_and_inhibits(tmp_path: Path) -> None:
    require_binary(ALERTMANAGER, "alertmanager")
    got: list[Page] = []
    pager = PagerServer(got.append).start()
    stack = Stack(tmp_path)
    try:
        config = write_json(tmp_path / "alertmanager.yml", _config(pager))
        port = stack.start_server(
            "alertmanager",
            lambda port: [
                ALERTMANAGER,
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            timeout=30,
        )
        alerts = [
            _alert("TrainingStalled", "critical", "training", run="demo"),
            # The same page for a run whose likely cause is the training team's: their pager.
            _alert("TrainingStalled", "critical", "training", run="demo2", team="training"),
            # Warnings: the overdue checkpoint and the low goodput are explained by the stall (inhibited);
            # another run's low goodput is not.
            _alert("CheckpointOverdue", "warning", "checkpoint", run="demo"),
            _alert("TrainingGoodputLow", "warning", "training", run="demo"),
            _alert("TrainingGoodputLow", "warning", "training", run="demo3"),
            _alert("GpuXidCritical", "critical", "gpu", instance="n1:9400", gpu="3", xid="79"),
        ]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            assert response.status == 200
        want = {
            ("TrainingStalled", "pager"),
            ("TrainingStalled", "pager-training"),
            ("TrainingStalled", "chat"),
            ("TrainingGoodputLow", "chat"),
            ("GpuXidCritical", "pager"),
            ("GpuXidCritical", "chat"),
            ("GpuXidCritical", REMEDIATE_RECEIVER),
        }
        deadline = time.monotonic() + 30
        while not want <= {(p.name, p.receiver) for p in pager.snapshot()}:
            assert time.monotonic() < deadline, [(p.name, p.receiver) for p in pager.snapshot()]
            time.sleep(0.2)
        time.sleep(3)  # longer than the demo's group wait and interval: the inhibited one stays away
        assert {(p.name, p.receiver) for p in pager.snapshot()} == want
    finally:
        stack.close()
        pager.close()


def test_cli_refuses_a_bad_routing_file_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from babysitter.cli import main

    bad = tmp_path / "am.yml"
    bad.write_text("receivers: []\n")
    assert main(["demo", "--alertmanager-config", str(bad), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "--alertmanager-config" in err and "no 'route'" in err, err
    assert not (tmp_path / "w").exists(), "nothing started"
