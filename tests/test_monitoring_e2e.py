"""The watcher watched, end to end: a real Prometheus and Alertmanager, the generated fast-profile rules,
the shipped routing (its receivers pointed at a webhook here) and the shipped self-scrape jobs
(exporters/prometheus-scrape.yml's ``prometheus`` and ``alertmanager``, only their targets and interval
changed).

What goes wrong on purpose, all at once:

* the Watchdog heartbeat must reach the ``deadmansswitch`` receiver and nothing else;
* a rule group that fails at every evaluation (a many-to-many match, as after a label change): a
  RuleEvaluationFailing page naming that group;
* a second, dead Alertmanager in Prometheus's list: every notification to it fails, AlertDeliveryFailing
  (through the live one);
* the pager's webhook points at a closed port: Alertmanager's webhook notifications fail,
  AlertmanagerNotificationsFailing, which reaches chat (critical goes to both: one failing integration
  leaves the other);
* a node agent killed (SIGKILL): NodeAgentDown pages naming its instance;
* a configuration reload that Prometheus refuses: MonitoringConfigReloadFailed in chat, and Prometheus
  keeps running the old configuration.

Before this change none of these alerts existed and the shipped scrape configs scraped neither server.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.generate import fast
from babysitter.generate.writer import render, write
from gen_helpers import REPO, AlertmanagerServer, WebhookReceiver
from node_helpers import read_port_file
from promkit import PrometheusServer, free_port

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

BROKEN_GROUP = "broken.rules"


def _routing(hook: str, dead: str) -> str:
    """The shipped routing, every receiver a webhook here except the pager's, which goes nowhere; short
    group waits (the Watchdog route's repeat interval too, so a second heartbeat comes in time)."""
    config = yaml.safe_load((REPO / "exporters/alertmanager.yml").read_text())
    routes = [config["route"]]
    while routes:
        route = routes.pop()
        route.update(group_wait="1s", group_interval="2s", repeat_interval="1h")
        routes += route.get("routes", [])
    config["route"]["routes"][0]["repeat_interval"] = "5s"
    for item in config["receivers"]:
        url = f"{dead}/{item['name']}" if item["name"] == "pager" else f"{hook}/{item['name']}"
        item["webhook_configs"] = [{"url": url, "send_resolved": True}]
    return str(yaml.safe_dump(config))


def _shipped_self_jobs(prometheus: str, alertmanager: str) -> list[dict[str, Any]]:
    shipped = yaml.safe_load((REPO / "exporters/prometheus-scrape.yml").read_text())["scrape_configs"]
    jobs = {job["job_name"]: job for job in shipped}
    out = []
    for name, target in (("prometheus", prometheus), ("alertmanager", alertmanager)):
        job = jobs[name]
        job["static_configs"][0]["targets"] = [target]
        job.update(scrape_interval="1s", scrape_timeout="1s")
        out.append(job)
    return out


def _wait(what: Any, timeout: float, message: Any) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(message())
        time.sleep(0.5)


def test_the_monitoring_pages_about_itself(tmp_path: Path) -> None:
    cfg = fast()
    write(tmp_path / "gen", render(cfg))
    broken = tmp_path / "broken.yaml"
    # Two `up` series on each side and nothing to match them by: an error at every evaluation.
    broken.write_text(
        json.dumps(
            {"groups": [{"name": BROKEN_GROUP, "rules": [{"record": "x:up:sum", "expr": "up + on () up"}]}]}
        )
    )
    rules = [
        tmp_path / "gen/alerts/babysitter-rules.yaml",
        tmp_path / "gen/alerts/babysitter-alerts.yaml",
        broken,
    ]
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens: the pager integration fails
    argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "1", "--port", "0"]
    argv += ["--port-file", str(tmp_path / "addr"), "--registry-dir", str(tmp_path / "reg")]
    argv += ["--no-collector.xid"]
    with (tmp_path / "agent.log").open("wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        with WebhookReceiver() as hook, AlertmanagerServer(tmp_path, _routing(hook.url, dead)) as am:
            address = read_port_file(tmp_path / "addr", timeout=60)
            node = {
                "job_name": "babysitter-node",
                "static_configs": [{"targets": [address], "labels": {"cluster": "c1"}}],
            }
            port = free_port()
            prom = PrometheusServer(
                tmp_path,
                rule_files=rules,
                alertmanager=am.address,
                extra_scrape_configs=[node, *_shipped_self_jobs(f"127.0.0.1:{port}", am.address)],
                # Firing alerts are sent again every 2 s (default 1 m): one sent before Prometheus had
                # found its Alertmanagers (its first evaluation, the Watchdog's) arrives in time here.
                extra_flags=["--rules.alert.resend-delay=2s"],
            )
            prom.port, prom.url = port, f"http://127.0.0.1:{port}"
            config = json.loads(prom.config_path.read_text())
            # A second Alertmanager that is not there: every notification to it fails.
            config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"].append(dead.split("//")[1])
            prom.config_path.write_text(json.dumps(config))
            with prom:
                heartbeat = _wait(
                    lambda: hook.alerts("/deadmansswitch"), 30, lambda: f"no heartbeat: {hook.received}"
                )
                assert {a["labels"]["alertname"] for a in heartbeat} == {"Watchdog"}
                assert heartbeat[0]["labels"]["severity"] == "none"
                agent.send_signal(signal.SIGKILL)
                agent.wait(timeout=10)
                killed = time.monotonic()

                def chat(name: str) -> list[dict[str, Any]]:
                    return [a for a in hook.alerts("/chat") if a["labels"]["alertname"] == name]

                def names() -> str:
                    return str(sorted({a["labels"]["alertname"] for a in hook.alerts("/chat")}))

                (rules_failing, *_) = _wait(lambda: chat("RuleEvaluationFailing"), 60, names)
                assert rules_failing["labels"]["rule_group"].endswith(f";{BROKEN_GROUP}"), rules_failing
                assert rules_failing["labels"]["instance"] == f"127.0.0.1:{port}"
                (delivery, *_) = _wait(lambda: chat("AlertDeliveryFailing"), 60, names)
                assert delivery["labels"]["instance"] == f"127.0.0.1:{port}"
                (integration, *_) = _wait(lambda: chat("AlertmanagerNotificationsFailing"), 60, names)
                assert (integration["labels"]["integration"], integration["labels"]["instance"]) == (
                    "webhook",
                    am.address,
                )
                (down, *_) = _wait(lambda: chat("NodeAgentDown"), 60, names)
                assert down["labels"]["instance"] == address
                assert time.monotonic() - killed >= 10 - 2  # fast profile: target_down_for 10s
                # Only the critical ones went to the pager route, and its webhook is dead: none arrived.
                assert hook.alerts("/pager") == []
                # The heartbeat kept coming (repeat 5 s here), and only to the switch.
                assert len(hook.alerts("/deadmansswitch")) >= 2
                assert not chat("Watchdog")

                # A reload Prometheus refuses: it keeps the old config, and says so in chat.
                prom.config_path.write_text("scrape_configs: [{job_name: x, scrape_interval: nonsense}]\n")
                request = urllib.request.Request(f"{prom.url}/-/reload", method="POST")  # noqa: S310
                with pytest.raises(urllib.error.HTTPError, match="500"):
                    urllib.request.urlopen(request, timeout=10)  # noqa: S310 - loopback
                (reload_failed, *_) = _wait(lambda: chat("MonitoringConfigReloadFailed"), 60, names)
                assert (reload_failed["labels"]["job"], reload_failed["labels"]["severity"]) == (
                    "prometheus",
                    "warning",
                )
                assert prom.query("up{job='alertmanager'}")  # still scraping with the old config
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)


def test_vmalert_exports_what_the_rules_read_on_the_victoriametrics_tier(tmp_path: Path) -> None:
    """vmalert (the installed 1.79.5) exposes the series the monitoring alerts read for it, under the
    names they use, and counts a datasource that does not answer as failed rule evaluations and alerts
    it cannot send as send errors (its own /metrics: the VictoriaMetrics tier must scrape it)."""
    from babysitter.generate.alerts import monitoring as M
    from vmkit import VMALERT, require_victoriametrics

    require_victoriametrics()
    rules = tmp_path / "r.yaml"
    rules.write_text(
        json.dumps(
            {"groups": [{"name": "g", "interval": "1s", "rules": [{"alert": "A", "expr": "vector(1)"}]}]}
        )
    )
    nowhere, port = f"http://127.0.0.1:{free_port()}", free_port()
    argv = [VMALERT, f"-rule={rules}", f"-datasource.url={nowhere}", f"-notifier.url={nowhere}"]
    argv += [f"-httpListenAddr=127.0.0.1:{port}", "-evaluationInterval=1s"]
    with (tmp_path / "vmalert.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:

        def failing() -> dict[str, float]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    text = response.read().decode()
            except OSError:
                return {}
            values = {}
            for line in text.splitlines():
                name = line.split("{")[0].split(" ")[0]
                if name in M.FOREIGN_SERIES:
                    values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            return values if values.get(M.VM_EXECUTION_ERRORS, 0) > 0 else {}

        values = _wait(failing, 30, lambda: (tmp_path / "vmalert.log").read_text()[-2000:])
        assert values[M.VM_RELOAD_OK] == 1.0
        assert M.VM_SEND_ERRORS in values  # the counter is there (nothing fired to send: no data)
    finally:
        proc.kill()
        proc.wait(timeout=10)
