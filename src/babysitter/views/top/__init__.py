"""``babysitter top``: a live terminal view of runs and nodes, from Prometheus or straight from ``/metrics``.

``sources`` make a :class:`~babysitter.views.top.frame.Frame` (runs, nodes, alerts, errors) from
Prometheus or from ``/metrics`` endpoints; ``screen`` turns frames into rich tables and refreshes them.
"""

from __future__ import annotations

from babysitter.views.top.frame import AlertRow, Frame, NodeRow, RunRow, Source
from babysitter.views.top.screen import render, run_top
from babysitter.views.top.sources import PROMETHEUS_METRICS, MetricsSource, PrometheusSource

__all__ = [
    "PROMETHEUS_METRICS",
    "AlertRow",
    "Frame",
    "MetricsSource",
    "NodeRow",
    "PrometheusSource",
    "RunRow",
    "Source",
    "render",
    "run_top",
]
