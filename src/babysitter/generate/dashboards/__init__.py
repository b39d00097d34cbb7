"""The generated Grafana dashboards, one module per dashboard."""

from __future__ import annotations

from babysitter.generate.config import GenerateConfig
from babysitter.generate.dashboards import node_health, run_overview, scorecard, stragglers
from babysitter.generate.dashboards._builder import Dashboard

__all__ = ["Dashboard", "dashboards"]


def dashboards(cfg: GenerateConfig) -> list[Dashboard]:
    """Every dashboard for ``cfg``."""
    return [module.dashboard(cfg) for module in (run_overview, stragglers, node_health, scorecard)]
