"""Monitoring as code: Grafana dashboards, Prometheus recording and alert rules with promtool tests,
and the metric reference, all generated from the one catalog (``babysitter generate``)."""

from __future__ import annotations

from babysitter.generate.config import GenerateConfig, fast, profile
from babysitter.generate.writer import ALERT_RULES, RECORDING_RULES, Stale, check, render, write

__all__ = [
    "ALERT_RULES",
    "RECORDING_RULES",
    "GenerateConfig",
    "Stale",
    "check",
    "fast",
    "profile",
    "render",
    "write",
]
