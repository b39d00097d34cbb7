"""``babysitter remediate``: Alertmanager alerts become scheduler actions, within safety rails.

:mod:`.policy` (the file, checked at start), :mod:`.alerts` (the webhook payload), :mod:`.targets`
(labels to scheduler arguments), :mod:`.jobmap` (host/run to jobs through Prometheus), :mod:`.rails`
(rate limit, drain cap, idempotency), :mod:`.audit` (append-only log, replayed at start),
:mod:`.engine` (the decisions), :mod:`.backends` (Slurm, Kubernetes, a script), :mod:`.server`
(the webhook receiver). Guide: ``docs/remediate.md``.
"""

from __future__ import annotations

from babysitter.remediate.alerts import Alert, Notification, PayloadError, parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import REASON_PREFIX, Remediation, Remediator
from babysitter.remediate.policy import Policy, PolicyError, load_policy, parse_policy

__all__ = [
    "REASON_PREFIX",
    "Alert",
    "AuditLog",
    "Notification",
    "PayloadError",
    "Policy",
    "PolicyError",
    "Remediation",
    "Remediator",
    "load_policy",
    "parse_notification",
    "parse_policy",
]
