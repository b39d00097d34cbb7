"""Goodput metrics the tracker exports from the run ledger (continued across restarts).

Labels: the tracker's ``run`` and ``rank`` (only rank 0 exports these) plus the user's constant labels.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = ["BADPUT_CAUSES", "BADPUT_SECONDS", "GOODPUT", "METRICS", "PRODUCTIVE_SECONDS", "RESTARTS"]

#: The ledger's vocabulary for time that did not become kept progress (see DESIGN.md).
BADPUT_CAUSES = (
    "startup",
    "checkpoint_load",
    "checkpoint_save",
    "data_stall",
    "lost_progress",
    "downtime",
    "eval",
    "hang",
    "other",
)

GOODPUT = MetricSpec(
    "train_goodput_ratio",
    "gauge",
    "ratio",
    "Productive step time over wall time since the run first started, across restarts.",
)
PRODUCTIVE_SECONDS = MetricSpec(
    "train_productive_seconds_total",
    "counter",
    "seconds",
    "Step time that became kept progress, since the run first started (continued across restarts).",
)
BADPUT_SECONDS = MetricSpec(
    "train_badput_seconds_total",
    "counter",
    "seconds",
    "Wall time that did not become kept progress, by cause, since the run first started.",
    labels=("cause",),
)
RESTARTS = MetricSpec(
    "train_restarts_total", "counter", "", "Incarnations of this run after the first (restarts)."
)

METRICS: tuple[MetricSpec, ...] = (GOODPUT, PRODUCTIVE_SECONDS, BADPUT_SECONDS, RESTARTS)
