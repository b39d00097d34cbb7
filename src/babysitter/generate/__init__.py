"""Monitoring as code: Grafana dashboards, Prometheus recording and alert rules with promtool tests,
and the metric reference, all generated from the one catalog.

The definitions live here (``config``, ``promql``, ``rules``, ``alerts/``, ``dashboards/``,
``metrics_doc``) and read only the catalog. ``writer`` renders every file ``babysitter generate``
writes, including the two-tier configurations of ``distributed``, which keep what the scorecard and
``babysitter top`` read as well: those two modules sit above the readers, so the package's ``__init__``
does not import them.
"""

from __future__ import annotations

from babysitter.generate.config import GenerateConfig, fast, profile

__all__ = ["GenerateConfig", "fast", "profile"]
