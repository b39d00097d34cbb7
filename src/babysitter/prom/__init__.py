"""The one client of Prometheus' HTTP API that babysitter's readers share: ``babysitter top``,
``babysitter scorecard`` and the remediator's job map (PromQL text itself is built by
:mod:`babysitter.generate.promql`, from the catalog)."""

from __future__ import annotations

from babysitter.prom.client import DEFAULT_MAX_BYTES, Deadline, PromClient, PromError, Sample, fetch, finite

__all__ = ["DEFAULT_MAX_BYTES", "Deadline", "PromClient", "PromError", "Sample", "fetch", "finite"]
