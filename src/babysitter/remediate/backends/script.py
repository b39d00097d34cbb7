"""A user's program as the backend: a documented hook, never a shell string built from alert fields.

For each action the remediator runs ``PATH ACTION`` (``drain``, ``undrain``, ``requeue``, ``annotate``)
directly (no shell), with a JSON document on stdin::

    {"action": "drain", "host": "gpu-17", "job": null, "reason": "babysitter: Xid 79 on GPU 3",
     "dry_run": false, "alert": {"name": "GpuXidCritical", "labels": {...}, "starts_at": ..., ...}}

Exit status 0 is success; anything else (or running past the timeout, which kills the program and
everything it started) is a failed action, with the program's output in the audit log. Dry runs do
not run the program. The program cannot answer queries, so the policy must give
``rails.drain_cap.cluster_nodes``, and requeue needs the job from the alert's labels or the node
agent's job map.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from babysitter.remediate.backends.base import AlertDoc, BackendError, Outcome, outcome_of, run_argv
from babysitter.remediate.policy import ScriptOptions

__all__ = ["ScriptBackend"]


class ScriptBackend:
    """Runs the policy's program for each action."""

    name = "script"

    def __init__(self, options: ScriptOptions) -> None:
        self.options = options

    def node_count(self) -> int:
        raise BackendError("the script backend cannot count nodes: set rails.drain_cap.cluster_nodes")

    def partitions_of(self, host: str) -> list[str] | None:
        return None

    def is_drained(self, host: str) -> bool | None:
        return None

    def jobs_on(self, host: str) -> list[str]:
        return []

    def running(self, jobs: Sequence[str], host: str | None) -> list[str]:
        return list(jobs)  # nothing to ask: the job map's word is taken

    def namespace_of(self, job: str) -> str | None:
        return None

    def nodes_of(self, jobs: Sequence[str]) -> list[str] | None:
        return None  # a hook cannot be asked

    def _hook(
        self, action: str, *, host: str | None, job: str | None, reason: str, dry_run: bool, alert: AlertDoc
    ) -> Outcome:
        doc = {
            "action": action,
            "host": host,
            "job": job,
            "reason": reason,
            "dry_run": dry_run,
            "alert": alert,
        }
        step = run_argv(
            f"{self.options.path} {action}",
            (self.options.path, action),
            timeout=self.options.timeout,
            dry_run=dry_run,
            stdin=json.dumps(doc).encode(),
        )
        return outcome_of([step], dry_run)

    def drain(self, host: str, reason: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        return self._hook("drain", host=host, job=None, reason=reason, dry_run=dry_run, alert=alert)

    def undrain(self, host: str, prefix: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        return self._hook("undrain", host=host, job=None, reason=prefix, dry_run=dry_run, alert=alert)

    def requeue(self, job: str, reason: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        return self._hook("requeue", host=None, job=job, reason=reason, dry_run=dry_run, alert=alert)

    def annotate_host(self, host: str, text: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        return self._hook("annotate", host=host, job=None, reason=text, dry_run=dry_run, alert=alert)

    def annotate_job(self, job: str, text: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        return self._hook("annotate", host=None, job=job, reason=text, dry_run=dry_run, alert=alert)
