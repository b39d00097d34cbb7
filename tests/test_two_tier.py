"""Two tiers end to end: per-rack Prometheus agents remote-write to a central Prometheus that
evaluates the generated rules and pages through a real Alertmanager, next to a single Prometheus that
scrapes the same hosts directly.

Two racks, each one host (``node-agent --simulate 2``) with one rank of a real CPU training run on
it; rack a's host loses a GPU to Xid 79. Both tiers must page the same alerts and compute the same
MFU and goodput. Then rack b's agent Prometheus is killed: remote write sends no staleness marker,
so only RackMetricsMissing can say so, and it must be the only new page.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.catalog import goodput as G
from babysitter.catalog import train as T
from babysitter.generate import fast
from babysitter.generate.config import parse_duration
from babysitter.generate.rules import Records
from babysitter.generate.writer import render, write
from gen_helpers import CLUSTER, REPO, TESTS_DIR, TRAINER, AlertmanagerServer, WebhookReceiver, agent_job
from node_helpers import read_port_file
from promkit import PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

XID79_AT = 25  # seconds after rack a's node agent starts
RACKS = ("a", "b")
# Labels a tier adds to what it sends, and that therefore differ between the tiers' pages.
_TIER_LABELS = {"tier", "rack"}


def _alertmanager_config(receiver: str) -> str:
    config = yaml.safe_load((REPO / "exporters/alertmanager.yml").read_text())
    routes = [config["route"]]
    while routes:  # every route: the pager route sets its own (production) timings
        route = routes.pop()
        route.update(group_wait="1s", group_interval="2s", repeat_interval="1h")
        routes += route.get("routes", [])
    for item in config["receivers"]:
        item["webhook_configs"] = [{"url": f"{receiver}/{item['name']}", "send_resolved": True}]
    return yaml.safe_dump(config)


def _pages(hook: WebhookReceiver, tier: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Firing pages from one tier: (alertname, labels without the tier's own)."""
    out = set()
    for alert in hook.pages():
        labels = alert["labels"]
        if labels.get("tier") == tier and alert.get("status") == "firing":
            key = tuple(sorted((k, v) for k, v in labels.items() if k not in _TIER_LABELS))
            out.add((labels["alertname"], key))
    return out


def _names(pages: set[tuple[str, tuple[tuple[str, str], ...]]]) -> set[str]:
    return {name for name, _ in pages}


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout} s")


def _value(prom: PrometheusServer, expr: str, at: float) -> float:
    value = prom.query_value(expr, at=at)
    assert value is not None, f"{expr} empty at {at} on {prom.url}; log: {prom.log_tail()}"
    return value


#: Seconds by which the tiers' samples of one moment may differ: the rack agent's 1 s scrape, its 1 s
#: remote-write batches and the central tier's 1 s evaluations against the single one's own 1 s cycle.
SKEW = 4


def _envelope(prom: PrometheusServer, expr: str, at: float, span: float) -> tuple[float, float]:
    """The least and the greatest value ``expr`` had within ``span`` seconds of ``at``."""
    window = f"({expr})[{2 * span:g}s:250ms]"
    low = _value(prom, f"min_over_time({window})", at + span)
    high = _value(prom, f"max_over_time({window})", at + span)
    return low, high


class _Hosts:
    """One simulated host per rack, each serving one rank of the run ``live``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.addresses: dict[str, str] = {}
        self.run_dir = workdir / "run"
        self.run_dir.mkdir()
        self._logs: list[Any] = []

    def _log(self, name: str) -> Any:
        handle = (self.workdir / name).open("wb")
        self._logs.append(handle)
        return handle

    def __enter__(self) -> _Hosts:
        for rank, rack in enumerate(RACKS):
            reg = self.workdir / f"reg-{rack}"
            reg.mkdir()
            events = [{"at": XID79_AT, "gpu": 1, "event": "xid79"}] if rack == "a" else []
            scenario = self.workdir / f"scenario-{rack}.json"
            scenario.write_text(json.dumps({"events": events}))
            argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "2"]
            argv += ["--scenario", str(scenario), "--port", "0", "--port-file", str(self.workdir / rack)]
            argv += ["--registry-dir", str(reg), "--simulate-kernel-log", str(self.workdir / f"kern-{rack}")]
            argv += ["--collector-timeout", "5", "--trainer-timeout", "0.5"]
            self.procs.append(
                subprocess.Popen(argv, stdout=self._log(f"agent-{rack}.log"), stderr=subprocess.STDOUT)
            )
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(len(RACKS))}
            args = [str(TESTS_DIR), str(self.run_dir), str(reg), "0.05", "25", CLUSTER]
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", TRAINER, *args],
                    env=env,
                    stdout=self._log(f"trainer{rank}.log"),
                    stderr=subprocess.STDOUT,
                )
            )
        for rack in RACKS:
            self.addresses[rack] = read_port_file(self.workdir / rack, timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for handle in self._logs:
            handle.close()


def _dirs(tmp_path: Path, *names: str) -> Iterator[Path]:
    for name in names:
        path = tmp_path / name
        path.mkdir()
        yield path


def test_two_tier_pages_and_values_match_a_single_prometheus(tmp_path: Path) -> None:
    """Same pages, same MFU and goodput through the agents as from one Prometheus; a dead rack agent pages."""
    cfg = fast()
    generated = tmp_path / "gen"
    write(generated, render(cfg))
    rules = [generated / "alerts/babysitter-rules.yaml", generated / "alerts/babysitter-alerts.yaml"]
    r = Records(cfg)
    central_dir, single_dir, am_dir, *agent_dirs = _dirs(
        tmp_path, "central", "single", "am", "agent-a", "agent-b"
    )
    with ExitStack() as stack:
        hook = stack.enter_context(WebhookReceiver())
        am = stack.enter_context(AlertmanagerServer(am_dir, _alertmanager_config(hook.url)))
        hosts = stack.enter_context(_Hosts(tmp_path))
        central = stack.enter_context(
            PrometheusServer(
                central_dir,
                rule_files=rules,
                alertmanager=am.address,
                external_labels={"tier": "central"},
                receiver=True,
            )
        )
        # The single Prometheus scrapes both hosts as exporters/prometheus-scrape.yml does: no drops.
        single_job = {
            "job_name": "babysitter-node",
            "static_configs": [{"targets": list(hosts.addresses.values()), "labels": {"cluster": CLUSTER}}],
            "metric_relabel_configs": [{"action": "labeldrop", "regex": "exported_.*"}],
        }
        single = stack.enter_context(
            PrometheusServer(
                single_dir,
                rule_files=rules,
                alertmanager=am.address,
                external_labels={"tier": "single"},
                extra_scrape_configs=[single_job],
            )
        )
        agents = {
            rack: stack.enter_context(
                PrometheusServer(
                    folder,
                    agent=True,
                    extra_scrape_configs=[agent_job(generated, hosts.addresses[rack])],
                    external_labels={"cluster": CLUSTER, "rack": rack},
                    # Small batches, sent at once: the fast profile's windows are seconds long.
                    remote_write=[
                        {
                            "url": f"{central.url}/api/v1/write",
                            "queue_config": {"batch_send_deadline": "1s", "max_samples_per_send": 500},
                        }
                    ],
                )
            )
            for rack, folder in zip(RACKS, agent_dirs, strict=True)
        }

        # Both ranks arrive in both tiers, each through its own rack in the central one.
        for prom in (central, single):
            prom.wait_for(f'count({T.STEPS.name}{{run="live"}} > 20) == 2', timeout=90)
        assert {s["metric"]["rack"] for s in central.query(f'{T.STEPS.name}{{run="live"}}')} == set(RACKS)

        # Xid 79 on rack a: both tiers page the same alerts.
        want = {"GpuXidCritical", "GpuDown"}
        _wait(
            lambda: want <= _names(_pages(hook, "central")) and want <= _names(_pages(hook, "single")),
            XID79_AT + 60,
            "Xid 79 pages from both tiers",
        )
        time.sleep(5)  # anything else one tier pages has had time to arrive too
        central_pages, single_pages = _pages(hook, "central"), _pages(hook, "single")
        assert central_pages == single_pages, central_pages ^ single_pages

        # Same MFU and goodput: run-level recording rules and rank 0's own goodput, read at the same
        # instant (the tiers scraped at different moments, hence a small tolerance).
        _wait(lambda: central.query(r.goodput_window) and single.query(r.goodput_window), 30, "goodput rules")
        time.sleep(SKEW)
        at = time.time() - SKEW - 1
        for expr in (f'{r.mfu}{{run="live"}}', f'{r.tokens_rate}{{run="live"}}'):
            a, b = _value(central, expr, at), _value(single, expr, at)
            assert a > 0 and a == pytest.approx(b, rel=0.15), (expr, a, b)
        for expr in (f'{r.goodput_window}{{run="live"}}', f'max({G.GOODPUT.name}{{run="live"}})'):
            # A young run's goodput climbs by percents a second (its startup is a large share of its
            # wall time), so two tiers that scraped and evaluated a few seconds apart differ by that
            # much: the central value must lie within what the single Prometheus held around it.
            a, (low, high) = _value(central, expr, at), _envelope(single, expr, at, SKEW)
            assert 0 < a <= 1 and low - 0.01 <= a <= high + 0.01, (expr, a, low, high)

        # Rack b's agent Prometheus dies: its rank's series stop reaching the central tier.
        agents["b"].kill()
        killed = time.monotonic()
        missing = _wait(
            lambda: {p for p in _pages(hook, "central") if p[0] == "RackMetricsMissing"},
            60,
            "RackMetricsMissing",
        )
        assert time.monotonic() - killed >= parse_duration(cfg.rack_silent_window) - 1
        racks = {
            alert["labels"].get("rack")
            for alert in hook.pages()
            if alert["labels"]["alertname"] == "RackMetricsMissing"
        }
        assert racks == {"b"}, missing
        time.sleep(5)
        assert _pages(hook, "central") - central_pages == missing
        assert _pages(hook, "single") == single_pages  # the hosts themselves are fine
