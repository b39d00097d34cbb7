"""Metrics of ``babysitter probe`` (cluster qualification), exposed through the node agent."""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = ["METRICS"]

METRICS: tuple[MetricSpec, ...] = ()
