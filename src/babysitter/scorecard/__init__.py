"""``babysitter scorecard``: clusters (or providers) side by side, from Prometheus.

MFU for the same model config, goodput, interruptions and Xid errors per 1000 GPU-hours, checkpoint
bandwidth and storage latency, plus the probe's results when present; clusters ranked by effective
MFU (MFU x goodput). ``queries`` builds the PromQL, ``compute`` asks Prometheus through
:class:`babysitter.prom.PromClient` and ranks; :mod:`babysitter.views.scorecard` draws the result.
"""

from __future__ import annotations

from babysitter.scorecard.compute import METRICS, ClusterScore, MetricInfo, Scorecard, build_scorecard
from babysitter.scorecard.queries import QuerySet, duration_seconds

__all__ = [
    "METRICS",
    "ClusterScore",
    "MetricInfo",
    "QuerySet",
    "Scorecard",
    "build_scorecard",
    "duration_seconds",
]
