"""The shipped timings add up to the paging budget benchmarks/bench_paging.py measures.

Not a timing test: it reads the committed rule files, the scrape configs and the Alertmanager example
and checks the worst case of each delay on the path fault -> scrape -> rule evaluation -> ``for:`` ->
Alertmanager group_wait -> pager against the goals of issue 34 (a GPU that failed hard within 30 s, a
hang of a run whose steps take under 10 s within 2 min; before, issue 16's 60 s and 5 min). The
campaign (benchmarks/results/campaign.md) and benchmarks/bench_paging.py measure what really happens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.generate import GenerateConfig
from babysitter.generate.config import parse_duration
from babysitter.node.config import AgentConfig
from gen_helpers import REPO

CFG = GenerateConfig()
#: Prometheus's defaults when a config says nothing.
DEFAULT_SCRAPE = 60
DEFAULT_EVALUATION = 60


def _groups() -> list[dict[str, Any]]:
    data = yaml.safe_load((REPO / "alerts/babysitter-alerts.yaml").read_text())
    return list(data["groups"])


def _rule(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    for group in _groups():
        for rule in group["rules"]:
            if rule["alert"] == name:
                return group, rule
    raise AssertionError(f"no alert {name} in alerts/babysitter-alerts.yaml")


def _scrape_intervals(key: str = "scrape_interval", fallback: int = DEFAULT_SCRAPE) -> list[tuple[str, int]]:
    """Every node-agent job of every shipped Prometheus config with its effective ``key`` setting."""
    found = []
    for path in sorted((REPO / "exporters").rglob("*.yml")):
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or not data.get("scrape_configs"):
            continue
        default = (data.get("global") or {}).get(key)
        for job in data["scrape_configs"]:
            if str(job.get("job_name", "")).startswith("babysitter-node"):
                interval = job.get(key, default)
                seconds = parse_duration(interval) if interval else fallback
                found.append((f"{path.relative_to(REPO)}:{job['job_name']}", seconds))
    return found


def _route_for(labels: dict[str, str]) -> dict[str, Any]:
    """The settings of the first receiver an alert with ``labels`` reaches, with inherited timings
    (Alertmanager's routing tree: the deepest matching child, settings inherited from its parents)."""
    config = yaml.safe_load((REPO / "exporters/alertmanager.yml").read_text())

    def matches(route: dict[str, Any]) -> bool:
        import re

        for matcher in route.get("matchers", []):
            name, op, value = re.match(r'^(\w+)(=~|=)"(.*)"$', matcher).groups()  # type: ignore[union-attr]
            got = labels.get(name, "")
            if (op == "=" and got != value) or (op == "=~" and not re.fullmatch(value, got)):
                return False
        return True

    def walk(route: dict[str, Any], inherited: dict[str, Any]) -> dict[str, Any]:
        keys = ("receiver", "group_wait", "group_interval", "repeat_interval", "group_by")
        settings = {**inherited, **{k: route[k] for k in keys if k in route}}
        for child in route.get("routes", []):
            if matches(child):
                return walk(child, settings)
        return settings

    defaults = {"group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"}
    return walk(config["route"], defaults)


def test_every_group_with_a_paging_alert_sets_its_evaluation_interval() -> None:
    """Without ``interval`` a group runs at the server's evaluation_interval, 1 m by default, and the
    shipped scrape config sets none: the page would wait up to a minute for evaluation alone."""
    for group in _groups():
        severities = {rule["labels"]["severity"] for rule in group["rules"]}
        if "critical" in severities:
            assert "interval" in group, group["name"]
            assert parse_duration(group["interval"]) <= 15, group["name"]


def test_node_agent_scrapes_wait_longer_than_the_agents_collector_deadline() -> None:
    """The agent answers a scrape once its slowest collector is done or past ``--collector-timeout``
    (10 s): a scrape timeout at or below that drops the whole host (``up`` 0, NodeAgentDown, every
    GPU series gone) when one collector hangs, instead of the agent reporting that collector failed.
    The shipped configs had 10 s."""
    timeouts = _scrape_intervals("scrape_timeout", 10)  # Prometheus' default scrape timeout: 10 s
    assert timeouts
    deadline = AgentConfig().collector_timeout
    assert all(seconds > deadline for _, seconds in timeouts), (deadline, timeouts)


def test_node_agents_are_scraped_every_15s_at_most() -> None:
    intervals = _scrape_intervals()
    assert intervals, "no babysitter-node scrape job found under exporters/"
    assert all(seconds <= 15 for _, seconds in intervals), intervals


@pytest.mark.parametrize(
    ("alertname", "labels", "budget"),
    [
        ("GpuXidCritical", {"severity": "critical", "component": "gpu"}, 30),
        ("GpuEccUncorrectable", {"severity": "critical", "component": "gpu"}, 30),
        ("GpuRowRemapFailed", {"severity": "critical", "component": "gpu"}, 30),
        ("GpuDown", {"severity": "critical", "component": "gpu"}, 300),
        ("CheckpointMissing", {"severity": "critical", "component": "checkpoint"}, 300),
        ("TrainingStalled", {"severity": "critical", "component": "training"}, 120),
        ("TrainingStalled", {"severity": "critical", "component": "training", "team": "training"}, 120),
    ],
)
def test_worst_case_fault_to_page_fits_the_goal(alertname: str, labels: dict[str, str], budget: int) -> None:
    """Worst case: the fault lands just after a scrape, the sample just after an evaluation, then
    ``for:`` (plus the stall threshold for a stall, the sentinel's pass for a deleted checkpoint), then
    the pager route's group_wait. Evaluation of the recording rules TrainingStalled reads is not on the
    path: its stall clock comes from the scrape, and its last step and culprit are recorded as often as
    it is evaluated (test below)."""
    group, rule = _rule(alertname)
    route = _route_for({**labels, "alertname": alertname})
    assert route["receiver"] == ("pager-training" if labels.get("team") == "training" else "pager")
    scrape = max(seconds for _, seconds in _scrape_intervals())
    evaluation = parse_duration(group.get("interval", f"{DEFAULT_EVALUATION}s"))
    hold = parse_duration(rule.get("for", "0s"))
    # Before the scrape can see it: the stall threshold of a run whose steps take 10 s, or the
    # checkpoint sentinel's next pass.
    detect = {
        "TrainingStalled": max(CFG.stall_min_seconds, CFG.stall_step_factor * 10),
        "CheckpointMissing": AgentConfig().checkpoint_interval,
    }
    worst = scrape + evaluation + detect.get(alertname, 0) + hold + parse_duration(route["group_wait"])
    assert worst < budget, (alertname, scrape, evaluation, detect, hold, route["group_wait"])


def test_the_records_a_page_reads_are_as_fresh_as_the_page() -> None:
    """The stall rules (the run's last step, the hang's culprit) run as often as the paging groups: at
    the server's 1 m a stall page waited for them, or went out before its culprit was named."""
    data = yaml.safe_load((REPO / "alerts/babysitter-rules.yaml").read_text())
    stall = next(g for g in data["groups"] if g["name"] == "babysitter-stall.rules")
    assert parse_duration(stall["interval"]) <= parse_duration(CFG.page_eval_interval)


def test_warnings_keep_the_slower_chat_timing() -> None:
    """Only the pager got faster: warnings still wait 30 s and batch for 5 m in chat."""
    route = _route_for({"severity": "warning", "component": "training", "alertname": "TrainingMfuDrop"})
    assert route["receiver"] == "chat"
    assert (route["group_wait"], route["group_interval"]) == ("30s", "5m")


def test_the_benchmark_reads_the_committed_files() -> None:
    """bench_paging.py must run what ships, not a copy: the paths it loads exist."""
    bench = (REPO / "benchmarks/bench_paging.py").read_text()
    for path in (
        "alerts/babysitter-rules.yaml",
        "alerts/babysitter-alerts.yaml",
        "exporters/alertmanager.yml",
    ):
        assert path in bench and (REPO / path).is_file(), path
    assert Path(REPO / "benchmarks/results/paging.md").is_file()
