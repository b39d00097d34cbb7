"""Alert rules, each with the promtool test cases that prove it fires and that it stays quiet.

Every alert carries ``severity`` (``critical`` pages, ``warning`` goes to chat), ``component``
(``training``, ``checkpoint``, ``storage``, ``gpu``, ``node``, ``fabric``, ``host``: what Alertmanager
groups and inhibits by),
a summary, a description that quotes the value and the labels, and a ``runbook_url`` from the config's
one pattern. Each alert's test runs promtool against the generated recording and alert rules together:
quiet cases (before ``for:`` or below the threshold, often next to a healthy twin series) and a firing
case with its exact labels and rendered annotations.

One module per domain, like the catalog: ``training``, ``slowdown`` (fail-slow time),
``checkpoint``, ``integrity`` (silent corruption), ``node`` (storage probe, collectors, the agent and
the trainers it fetches), ``gpu``, ``remediation``, ``fabric`` (InfiniBand/RoCE ports, PCIe links and
AER), ``host`` (EDAC, CPU thermal, kernel-log trouble) and ``monitoring`` (the watchdog of a dead
man's switch, the rule engine and Alertmanager failing); ``_common`` holds the types and the fixtures
their tests share. ``_GROUPS`` fixes the order of the rule file.
"""

from __future__ import annotations

from collections.abc import Callable

from babysitter.generate.alerts._common import Alert, AlertTest
from babysitter.generate.alerts.checkpoint import checkpoint_alerts
from babysitter.generate.alerts.claims import claim_alerts
from babysitter.generate.alerts.fabric import fabric_alerts, fabric_fatal_alerts
from babysitter.generate.alerts.gpu import gpu_fatal_alerts, gpu_other_alerts
from babysitter.generate.alerts.host import host_alerts
from babysitter.generate.alerts.integrity import integrity_alerts
from babysitter.generate.alerts.monitoring import monitoring_alerts
from babysitter.generate.alerts.node import node_alerts, trainer_fetch_alerts
from babysitter.generate.alerts.remediation import remediation_alerts
from babysitter.generate.alerts.slowdown import slowdown_alerts
from babysitter.generate.alerts.training import training_alerts
from babysitter.generate.config import GenerateConfig
from babysitter.generate.rules import Records

__all__ = ["Alert", "AlertTest", "alert_groups", "alerts", "test_file"]

#: Rule groups in file order, each with the function that makes its alerts.
_GROUPS: tuple[tuple[str, Callable[[GenerateConfig, Records], list[Alert]]], ...] = (
    ("babysitter-training.alerts", training_alerts),
    ("babysitter-slowdown.alerts", slowdown_alerts),
    ("babysitter-checkpoint.alerts", checkpoint_alerts),
    ("babysitter-integrity.alerts", integrity_alerts),
    ("babysitter-node.alerts", node_alerts),
    ("babysitter-trainers.alerts", trainer_fetch_alerts),
    ("babysitter-claims.alerts", claim_alerts),
    ("babysitter-gpu-fatal.alerts", gpu_fatal_alerts),
    ("babysitter-gpu.alerts", gpu_other_alerts),
    ("babysitter-remediation.alerts", remediation_alerts),
    ("babysitter-fabric-fatal.alerts", fabric_fatal_alerts),
    ("babysitter-fabric.alerts", fabric_alerts),
    ("babysitter-host.alerts", host_alerts),
    ("babysitter-monitoring.alerts", monitoring_alerts),
)


#: Groups evaluated every ``fatal_eval_interval``: a GPU that failed hard, or the PCIe link under it,
#: pages within 30 s.
_FAST_GROUPS = frozenset({"babysitter-gpu-fatal.alerts", "babysitter-fabric-fatal.alerts"})


def alerts(cfg: GenerateConfig) -> list[Alert]:
    """Every alert for ``cfg``, in file order."""
    r = Records(cfg)
    found = [alert for _, make in _GROUPS for alert in make(cfg, r)]
    names = [alert.name for alert in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"duplicate alert names: {names}")
    return found


def alert_groups(cfg: GenerateConfig) -> list[dict[str, object]]:
    """The ``groups`` of the alert rule file. A group with a paging (critical) alert is evaluated every
    ``page_eval_interval``: Prometheus's default of 1 m alone would eat most of a minute's budget; the
    hard GPU faults' group every ``fatal_eval_interval``."""
    r = Records(cfg)
    groups: list[dict[str, object]] = []
    for name, make in _GROUPS:
        found = make(cfg, r)
        group: dict[str, object] = {"name": name}
        if name in _FAST_GROUPS:
            group["interval"] = cfg.fatal_eval_interval
        elif any(alert.severity == "critical" for alert in found):
            group["interval"] = cfg.page_eval_interval
        group["rules"] = [alert.rule(cfg) for alert in found]
        groups.append(group)
    return groups


def test_file(alert: Alert, cfg: GenerateConfig, rule_files: list[str]) -> dict[str, object]:
    """The promtool test file of one alert; ValueError when the alert has no test."""
    if alert.test is None:
        raise ValueError(f"alert {alert.name} has no test")
    t = alert.test
    cases: list[dict[str, object]] = [
        {"eval_time": at, "alertname": alert.name, "exp_alerts": []} for at, _why in t.quiet
    ]
    expected = []
    extra = t.fire_annotations or tuple({} for _ in t.fire_labels)
    for labels, (summary, description), more in zip(t.fire_labels, t.fire_text, extra, strict=True):
        expected.append(
            {
                "exp_labels": {**labels, "component": alert.component, "severity": alert.severity},
                "exp_annotations": {
                    "description": description,
                    "runbook_url": cfg.runbook_url(alert.name),
                    "summary": summary,
                    **more,
                },
            }
        )
    cases.append({"eval_time": t.fire_at, "alertname": alert.name, "exp_alerts": expected})
    return {
        "rule_files": rule_files,
        "evaluation_interval": t.evaluation_interval,
        "tests": [
            {
                "interval": t.interval,
                "input_series": [{"series": s, "values": v} for s, v in t.series],
                "alert_rule_test": cases,
            }
        ],
    }
