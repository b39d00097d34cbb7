"""What ``babysitter remediate`` did with the alerts it received: actions, refusals, its drain budget.

Labels are closed sets (the action and result vocabularies below), never alert label values, so a
storm of alerts about a thousand hosts adds no series.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "ACTIONS",
    "ACTION_RESULTS",
    "DRAINED_NODES",
    "DRAIN_CAP_NODES",
    "METRICS",
    "NOTIFICATIONS",
    "NOTIFICATION_RESULTS",
    "REFUSALS",
    "REFUSAL_REASONS",
    "REMEDIATION_ACTIONS",
]

#: The actions a policy can name (``undrain`` only follows a resolved alert, when the rule says so).
REMEDIATION_ACTIONS = ("drain", "undrain", "requeue", "annotate")
#: ``result`` values: done, the scheduler said no, what a dry run would have done, or refused by a rail.
ACTION_RESULTS = ("ok", "failed", "dry_run", "refused")
#: ``reason`` values of refusals.
REFUSAL_REASONS = (
    "rate_limit",
    "drain_cap",
    "not_allowed",
    "missing_labels",
    "no_target",
    "not_ours",
    "not_in_run",
)
NOTIFICATION_RESULTS = ("accepted", "rejected", "unauthorized", "busy")

ACTIONS = MetricSpec(
    "remediation_actions_total",
    "counter",
    "",
    "Remediation actions by action (drain, undrain, requeue, annotate) and result: ok, failed (the "
    "scheduler command or API call failed), dry_run (planned, not run), refused (a safety rail said no).",
    labels=("action", "result"),
    source="remediate",
)
REFUSALS = MetricSpec(
    "remediation_refused_total",
    "counter",
    "",
    "Actions a safety rail refused, by action and reason: rate_limit, drain_cap (too many nodes drained "
    "in the window), not_allowed (host, partition or namespace off the allow-list), missing_labels (the "
    "alert lacks a label the action needs), no_target (no job found to requeue), not_ours (an undrain of "
    "a node someone else drained), not_in_run (a stall's culprit host that does not hold the run's ranks, "
    "or that cannot be checked).",
    labels=("action", "reason"),
    source="remediate",
)
NOTIFICATIONS = MetricSpec(
    "remediation_notifications_total",
    "counter",
    "",
    "Alertmanager webhook requests by result: accepted, rejected (malformed or too large), "
    "unauthorized (bad token or client certificate), busy (queue full; Alertmanager retries).",
    labels=("result",),
    source="remediate",
)
DRAINED_NODES = MetricSpec(
    "remediation_drained_nodes",
    "gauge",
    "",
    "Distinct nodes this remediator drained within its drain window (dry runs included: the cap is "
    "rehearsed too).",
    source="remediate",
)
DRAIN_CAP_NODES = MetricSpec(
    "remediation_drain_cap_nodes",
    "gauge",
    "",
    "How many nodes the drain cap allows within the window (max fraction x the cluster's nodes).",
    source="remediate",
)

METRICS: tuple[MetricSpec, ...] = (ACTIONS, REFUSALS, NOTIFICATIONS, DRAINED_NODES, DRAIN_CAP_NODES)
