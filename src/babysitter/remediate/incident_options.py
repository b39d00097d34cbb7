"""The remediation policy's ``incidents:`` section: when and how ``babysitter remediate`` gathers a bundle.

.. code-block:: yaml

    incidents:
      enabled: true        # default: gather before every action, and for the alerts below
      wait: 10s            # how long the ranks have to answer; the remediator waits this long at most
      max_incidents: 32    # bundles kept per run directory (the oldest go)
      max_mb: 64           # size of one bundle
      alerts: [TrainingStalled, TrainingProcessExited, GpuXidCritical, GpuDown]
      dir: /var/lib/babysitter/incidents   # a host's incident that no run directory takes

``alerts`` are anchored regexes of alert names that gather a bundle without a rule acting on them; an
alert a rule acts on always gets one first (:mod:`babysitter.remediate.incidents`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.incident.gather import Limits, MiB

__all__ = ["DEFAULT_ALERTS", "IncidentOptions", "parse_incidents"]

#: Alerts that gather a bundle even when no rule acts on them: a stall, a dead rank, a hard GPU fault.
DEFAULT_ALERTS = ("TrainingStalled", "TrainingProcessExited", "GpuXidCritical", "GpuDown")
_REMEMBERED = 4096
_MAX_RUNS = 8


@dataclass(frozen=True)
class IncidentOptions:
    """A checked ``incidents:`` section."""

    enabled: bool = True
    limits: Limits = field(default_factory=Limits)
    alerts: tuple[re.Pattern[str], ...] = tuple(re.compile(re.escape(name)) for name in DEFAULT_ALERTS)
    dir: Path | None = None

    def wants(self, alertname: str) -> bool:
        """Whether an alert of this name gathers a bundle without a rule."""
        return any(p.fullmatch(alertname) for p in self.alerts)


def parse_incidents(section: Any, *, error: type[Exception], base: Path | None = None) -> IncidentOptions:
    """The section from the policy's reader of it (``policy._Reader``, which raises ``error`` for a bad
    key); ``error`` names what else is wrong."""
    if not section.data:
        return IncidentOptions()
    enabled = section.boolean("enabled", True)
    wait = section.duration("wait", "10s")
    if wait > 300:
        raise error("incidents.wait: at most 5m (the remediator acts only once the bundle is in)")
    count = section.integer("max_incidents", 32, minimum=1) or 32
    size = section.integer("max_mb", 64, minimum=5) or 64
    patterns = section.patterns("alerts") if "alerts" in section.data else IncidentOptions().alerts
    folder = section.string("dir")
    path = None
    if folder is not None:
        path = Path(folder)
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
    section.done(("enabled", "wait", "max_incidents", "max_mb", "alerts", "dir"))
    try:
        limits = Limits(wait=wait, max_incidents=count, max_bytes=size * MiB)
    except ValueError as exc:
        raise error(f"incidents: {exc}") from None
    return IncidentOptions(enabled=bool(enabled), limits=limits, alerts=patterns, dir=path)
