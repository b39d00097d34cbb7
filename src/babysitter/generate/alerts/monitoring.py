"""The watcher watched: a heartbeat for a dead man's switch, and the rule engine and Alertmanager failing.

A babysitter that dies quietly is worse than none: every page it would have sent is lost and nobody
knows. These alerts are what the Prometheus and Alertmanager mixins (and kube-prometheus) ship for
that, over the same metrics:

* ``Watchdog`` fires always. Alertmanager routes it to a receiver that is an external dead man's
  switch (exporters/alertmanager.yml): when its notifications stop, Prometheus, Alertmanager, or the
  path from either to the outside is down, and the *external* service pages. Nothing inside the
  monitoring can page about the monitoring being gone.
* ``RuleEvaluationFailing``: rule groups that fail to evaluate (a query error, a many-to-many match, a
  timeout) make their alerts blind (the mixins' ``PrometheusRuleFailures``).
* ``AlertDeliveryFailing``: the rule engine fails to hand alerts to Alertmanager, or drops them (the
  mixins' ``PrometheusErrorSendingAlertsToAnyAlertmanager`` / ``PrometheusNotificationsBacklog``).
* ``AlertmanagerNotificationsFailing``: Alertmanager fails to deliver to a receiver integration (the
  mixins' ``AlertmanagerFailedToSendAlerts``); critical, so it goes to the pager *and* chat: one of
  the two failing still leaves the other.
* ``MonitoringConfigReloadFailed``: a reload was refused; the old configuration keeps running, new
  rules or routes are not in effect.

The series are the servers' own, not babysitter's (so not in the catalog): Prometheus 2.x, Alertmanager
0.2x, and vmalert (the VictoriaMetrics tier) under its own names, both its current ones and 1.79's
(``vmalert_execution_errors_total``, Debian 12's build). Each is read wherever it is scraped; the
shipped scrape configs scrape Prometheus and Alertmanager themselves.
"""

from __future__ import annotations

from babysitter.generate.alerts._common import _V, Alert, AlertTest, _l
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import eq
from babysitter.generate.rules import Records

__all__ = ["FOREIGN_SERIES", "monitoring_alerts"]

#: Prometheus's own series these alerts read.
PROM_RULE_FAILURES = "prometheus_rule_evaluation_failures_total"
PROM_NOTIFY_ERRORS = "prometheus_notifications_errors_total"
PROM_NOTIFY_DROPPED = "prometheus_notifications_dropped_total"
PROM_RELOAD_OK = "prometheus_config_last_reload_successful"
#: Alertmanager's.
AM_NOTIFY_FAILED = "alertmanager_notifications_failed_total"
AM_RELOAD_OK = "alertmanager_config_last_reload_successful"
#: vmalert's: rule errors per rule (current versions), all rules together (1.79), alerts it failed to send.
VM_ALERTING_ERRORS = "vmalert_alerting_rules_errors_total"
VM_RECORDING_ERRORS = "vmalert_recording_rules_errors_total"
VM_EXECUTION_ERRORS = "vmalert_execution_errors_total"
VM_SEND_ERRORS = "vmalert_alerts_send_errors_total"
VM_RELOAD_OK = "vmalert_config_last_reload_successful"
#: Every foreign series name above (runbooks may query them).
FOREIGN_SERIES = (
    PROM_RULE_FAILURES,
    PROM_NOTIFY_ERRORS,
    PROM_NOTIFY_DROPPED,
    PROM_RELOAD_OK,
    AM_NOTIFY_FAILED,
    AM_RELOAD_OK,
    VM_ALERTING_ERRORS,
    VM_RECORDING_ERRORS,
    VM_EXECUTION_ERRORS,
    VM_SEND_ERRORS,
    VM_RELOAD_OK,
)

_PROM = {"cluster": "c1", "instance": "mon1:9090", "job": "prometheus"}
_AM = {"cluster": "c1", "instance": "mon1:9093", "job": "alertmanager"}
_VM = {"cluster": "c1", "instance": "mon2:8880", "job": "vmalert"}


def _sel(name: str, matchers: str) -> str:
    return f"{name}{{{matchers}}}" if matchers.strip() else name


def _grew(selector: str, window: str) -> str:
    """How much each counter grew over ``window``, where it did: only series older than the window.

    Not :func:`babysitter.generate.promql.new_or_increased`, which counts a new series whole: a
    Prometheus that (re)starts drops the alerts its first evaluations make before it has found its
    Alertmanagers and starts its counters there, and that burst is not a failure that goes on (the
    campaign's fast profile paged AlertDeliveryFailing at every start). A reset (a restart) is
    negative here, so it is nothing either; failures that keep coming are positive after ``window``."""
    return f"({selector} - {selector} offset {window}) > 0"


def _series(name: str, labels: dict[str, str]) -> str:
    return f"{name}{{{', '.join(eq(k, v) for k, v in labels.items())}}}"


def monitoring_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """The watchdog and the monitoring stack's own failures (see the module docstring)."""
    del r  # no recording rule: these must work when the recording rules are what fails
    ms, c, w, f = cfg.monitoring_selector, cfg.cluster_label, cfg.monitoring_window, cfg.monitoring_for
    dw = cfg.monitoring_delivery_window
    watchdog = Alert(
        name="Watchdog",
        expr="vector(1)",
        severity="none",
        component="monitoring",
        summary="The alerting pipeline is alive: a heartbeat for the dead man's switch.",
        description=(
            "Always firing, by design: its notification reaches the dead man's switch receiver at every "
            "repeat interval, through the whole path (rules, Alertmanager, network, receiver). An external "
            "service pages when the heartbeats stop: Prometheus, Alertmanager or the path between them is "
            "down. Never silence it; exporters/alertmanager.yml says how to wire the receiver."
        ),
        for_="0s",
        heartbeat=True,
        test=AlertTest(
            series=((_series(PROM_RELOAD_OK, _PROM), "1+0x5"),),
            quiet=(),
            fire_at="1m",
            fire_labels=({},),
            fire_text=(
                (
                    "The alerting pipeline is alive: a heartbeat for the dead man's switch.",
                    "Always firing, by design: its notification reaches the dead man's switch receiver at "
                    "every repeat interval, through the whole path (rules, Alertmanager, network, receiver). "
                    "An external service pages when the heartbeats stop: Prometheus, Alertmanager or the "
                    "path between them is down. Never silence it; exporters/alertmanager.yml says how to "
                    "wire the receiver.",
                ),
            ),
        ),
    )

    def vm_group(name: str) -> str:
        grown = f"sum by ({c}, instance, group) (\n  {_grew(_sel(name, ms), w)}\n)"
        return f'label_replace(\n  {grown},\n  "rule_group", "$1", "group", "(.*)"\n)'

    rule_failures = Alert(
        name="RuleEvaluationFailing",
        expr=(
            f"sum by ({c}, instance, rule_group) (\n  {_grew(_sel(PROM_RULE_FAILURES, ms), w)}\n)"
            f"\nor\nsum by ({c}, instance, rule_group) (\n{vm_group(VM_ALERTING_ERRORS)}\n"
            f"or\n{vm_group(VM_RECORDING_ERRORS)}\n)"
            f"\nor\nsum by ({c}, instance) (\n  {_grew(_sel(VM_EXECUTION_ERRORS, ms), w)}\n)"
        ),
        severity="critical",
        component="monitoring",
        summary=(
            f"Rules of {{{{ with $labels.rule_group }}}}group {{{{ . }}}}{{{{ else }}}}the rule engine"
            f"{{{{ end }}}} fail to evaluate on {_l('instance')}."
        ),
        description=(
            f"The rule engine at {_l('instance')} (cluster {_l(c)}) failed {_V} rule evaluations in the last "
            f"{w}, and has kept failing for {f}. The alerts of a failing group are blind: they neither fire "
            f"nor resolve. Its log names the rule and the error (a query that matches many-to-many, a "
            f"timeout, a series limit)."
        ),
        for_=f,
        test=AlertTest(
            series=(
                # The fabric group fails at every evaluation from 5m on.
                (
                    _series(PROM_RULE_FAILURES, {**_PROM, "rule_group": "alerts.yaml;fabric"}),
                    "0+0x4 1+1x30",
                ),
                # The gpu group failed once (a timeout under load) and never again.
                (_series(PROM_RULE_FAILURES, {**_PROM, "rule_group": "alerts.yaml;gpu"}), "0+0x4 1+0x30"),
                # vmalert's training group fails from 5m on, by its own counter.
                (
                    _series(VM_ALERTING_ERRORS, {**_VM, "alertname": "A", "group": "training", "id": "7"}),
                    "0+0x4 1+1x30",
                ),
            ),
            quiet=(("4m", "nothing failed yet"), ("12m", "failing, before for:")),
            fire_at="20m",
            fire_labels=(
                {"cluster": "c1", "instance": "mon1:9090", "rule_group": "alerts.yaml;fabric"},
                {"cluster": "c1", "instance": "mon2:8880", "rule_group": "training"},
            ),
            fire_text=tuple(
                (
                    f"Rules of group {group} fail to evaluate on {instance}.",
                    f"The rule engine at {instance} (cluster c1) failed 5 rule evaluations in the last 5m, "
                    "and has kept failing for 10m. The alerts of a failing group are blind: they neither "
                    "fire nor resolve. Its log names the rule and the error (a query that matches "
                    "many-to-many, a timeout, a series limit).",
                )
                for instance, group in (("mon1:9090", "alerts.yaml;fabric"), ("mon2:8880", "training"))
            ),
        ),
    )
    delivery = Alert(
        name="AlertDeliveryFailing",
        expr="\nor\n".join(
            f"sum by ({c}, instance) (\n  {_grew(_sel(name, ms), dw)}\n)"
            for name in (PROM_NOTIFY_ERRORS, PROM_NOTIFY_DROPPED, VM_SEND_ERRORS)
        ),
        severity="critical",
        component="monitoring",
        summary=f"The rule engine at {_l('instance')} fails to hand alerts to Alertmanager.",
        description=(
            f"The rule engine at {_l('instance')} (cluster {_l(c)}) failed to send, or dropped, {_V} alert "
            f"notifications in the last {dw}, and has kept failing for {f}. Pages are being lost: this one "
            f"reaches you only through another Alertmanager that still answers, or after the one that "
            f"failed is back. Check that Alertmanager runs and is reachable from the rule engine."
        ),
        for_=f,
        test=AlertTest(
            series=(
                (
                    _series(PROM_NOTIFY_ERRORS, {**_PROM, "alertmanager": "http://mon1:9093/api/v2/alerts"}),
                    "0+0x4 2+2x30",
                ),
                (_series(PROM_NOTIFY_DROPPED, _PROM), "0+0x35"),
                # Another Prometheus lost one notification at 6m, then none.
                (
                    _series(
                        PROM_NOTIFY_ERRORS,
                        {**_PROM, "instance": "mon3:9090", "alertmanager": "http://mon1:9093/api/v2/alerts"},
                    ),
                    "0+0x5 1+0x30",
                ),
            ),
            quiet=(("4m", "every notification sent"), ("12m", "failing, before for:")),
            fire_at="20m",
            fire_labels=({"cluster": "c1", "instance": "mon1:9090"},),
            fire_text=(
                (
                    "The rule engine at mon1:9090 fails to hand alerts to Alertmanager.",
                    "The rule engine at mon1:9090 (cluster c1) failed to send, or dropped, 4 alert "
                    "notifications in the last 2m, and has kept failing for 10m. Pages are being lost: this "
                    "one reaches you only through another Alertmanager that still answers, or after the one "
                    "that failed is back. Check that Alertmanager runs and is reachable from the rule "
                    "engine.",
                ),
            ),
        ),
    )
    am_failing = Alert(
        name="AlertmanagerNotificationsFailing",
        expr=f"sum by ({c}, instance, integration) (\n  {_grew(_sel(AM_NOTIFY_FAILED, ms), dw)}\n)",
        severity="critical",
        component="monitoring",
        summary=f"Alertmanager {_l('instance')} fails to deliver to its {_l('integration')} receivers.",
        description=(
            f"Alertmanager at {_l('instance')} (cluster {_l(c)}) failed {_V} {_l('integration')} "
            f"notifications in the last {dw}, and has kept failing for {f}. Pages to that integration are "
            f"lost; this one goes to every receiver of its route, so one that still works gets it. Its log "
            f"says why (the receiver's URL, credentials, TLS, rate limits)."
        ),
        for_=f,
        test=AlertTest(
            series=(
                (_series(AM_NOTIFY_FAILED, {**_AM, "integration": "webhook"}), "0+0x4 1+1x30"),
                (_series(AM_NOTIFY_FAILED, {**_AM, "integration": "slack"}), "0+0x35"),
                # A newer Alertmanager splits failures by reason: summed per integration.
                (
                    _series(
                        AM_NOTIFY_FAILED,
                        {**_AM, "instance": "mon2:9093", "integration": "pagerduty", "reason": "other"},
                    ),
                    "0+0x5 1+1x29",
                ),
                (
                    _series(
                        AM_NOTIFY_FAILED,
                        {**_AM, "instance": "mon2:9093", "integration": "pagerduty", "reason": "clientError"},
                    ),
                    "0+0x5 1+1x29",
                ),
            ),
            quiet=(("4m", "every notification delivered"), ("12m", "failing, before for:")),
            fire_at="20m",
            fire_labels=(
                {"cluster": "c1", "instance": "mon1:9093", "integration": "webhook"},
                {"cluster": "c1", "instance": "mon2:9093", "integration": "pagerduty"},
            ),
            fire_text=tuple(
                (
                    f"Alertmanager {instance} fails to deliver to its {integration} receivers.",
                    f"Alertmanager at {instance} (cluster c1) failed {count} {integration} notifications in "
                    "the last 2m, and has kept failing for 10m. Pages to that integration are lost; this one "
                    "goes to every receiver of its route, so one that still works gets it. Its log says why "
                    "(the receiver's URL, credentials, TLS, rate limits).",
                )
                for instance, integration, count in (
                    ("mon1:9093", "webhook", 2),
                    ("mon2:9093", "pagerduty", 4),
                )
            ),
        ),
    )
    reloaded = " or ".join(_sel(name, ms) for name in (PROM_RELOAD_OK, AM_RELOAD_OK, VM_RELOAD_OK))
    reload_failed = Alert(
        name="MonitoringConfigReloadFailed",
        expr=f"max by ({c}, instance, job) (\n  {reloaded}\n) == 0",
        severity="warning",
        component="monitoring",
        summary=f"{_l('job')} at {_l('instance')} refused its new configuration.",
        description=(
            f"The last configuration reload of {_l('job')} at {_l('instance')} (cluster {_l(c)}) failed "
            f"{f} ago or longer: it keeps running the old rules or routes, and the next restart fails to "
            f"start it at all. Check the file (promtool check config / check rules, amtool check-config)."
        ),
        for_=f,
        test=AlertTest(
            series=(
                (_series(PROM_RELOAD_OK, _PROM), "1+0x5 0+0x20"),
                (_series(AM_RELOAD_OK, _AM), "1+0x25"),
                (_series(VM_RELOAD_OK, _VM), "1+0x5 0+0x3 1+0x16"),
            ),
            quiet=(("5m", "every reload succeeded"), ("12m", "failed, before for:")),
            fire_at="20m",
            fire_labels=({"cluster": "c1", "instance": "mon1:9090", "job": "prometheus"},),
            fire_text=(
                (
                    "prometheus at mon1:9090 refused its new configuration.",
                    "The last configuration reload of prometheus at mon1:9090 (cluster c1) failed 10m ago or "
                    "longer: it keeps running the old rules or routes, and the next restart fails to start "
                    "it at all. Check the file (promtool check config / check rules, amtool check-config).",
                ),
            ),
        ),
    )
    return [watchdog, rule_failures, delivery, am_failing, reload_failed]
