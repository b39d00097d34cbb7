"""A user's program as the backend: a documented hook, never a shell string built from alert fields.

For each action the remediator runs ``PATH ACTION`` (``drain``, ``undrain``, ``requeue``, ``annotate``)
directly (no shell), with a JSON document on stdin::

    {"action": "drain", "host": "gpu-17", "job": null, "reason": "babysitter: Xid 79 on GPU 3",
     "dry_run": false, "alert": {"name": "GpuXidCritical", "labels": {...}, "starts_at": ..., ...}}

Exit status 0 is success; anything else (or running past the timeout) is a failed action, with the
program's output in the audit log. Dry runs do not run the program. The program cannot answer
queries, so the policy must give ``rails.drain_cap.cluster_nodes``, and requeue needs the job from
the alert's labels or the node agent's job map.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping, Sequence

from babysitter.remediate.backends.base import MAX_OUTPUT, BackendError, Outcome, Step
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

    def _hook(
        self,
        action: str,
        *,
        host: str | None,
        job: str | None,
        reason: str,
        dry_run: bool,
        alert: Mapping[str, object] | None,
    ) -> Outcome:
        argv = (self.options.path, action)
        step = Step(f"{self.options.path} {action}", argv)
        if dry_run:
            return Outcome(True, [step])
        doc = {
            "action": action,
            "host": host,
            "job": job,
            "reason": reason,
            "dry_run": dry_run,
            "alert": alert,
        }
        start = time.monotonic()
        try:
            proc = subprocess.run(
                list(argv),
                input=json.dumps(doc).encode(),
                capture_output=True,
                timeout=self.options.timeout,
                check=False,
            )
            step.ok, step.code = proc.returncode == 0, proc.returncode
            step.output = (proc.stdout + proc.stderr).decode("utf-8", errors="replace").strip()[-MAX_OUTPUT:]
        except subprocess.TimeoutExpired:
            step.ok, step.output = False, f"timed out after {self.options.timeout:g} s"
        except OSError as exc:
            step.ok, step.output = False, f"cannot run {self.options.path}: {exc.strerror or exc}"
        step.seconds = time.monotonic() - start
        return Outcome(bool(step.ok), [step], detail="" if step.ok else step.output)

    def drain(
        self, host: str, reason: str, *, dry_run: bool, alert: Mapping[str, object] | None = None
    ) -> Outcome:
        return self._hook("drain", host=host, job=None, reason=reason, dry_run=dry_run, alert=alert)

    def undrain(
        self, host: str, prefix: str, *, dry_run: bool, alert: Mapping[str, object] | None = None
    ) -> Outcome:
        return self._hook("undrain", host=host, job=None, reason=prefix, dry_run=dry_run, alert=alert)

    def requeue(
        self, job: str, reason: str, *, dry_run: bool, alert: Mapping[str, object] | None = None
    ) -> Outcome:
        return self._hook("requeue", host=None, job=job, reason=reason, dry_run=dry_run, alert=alert)

    def annotate(
        self,
        host: str | None,
        job: str | None,
        text: str,
        *,
        dry_run: bool,
        alert: Mapping[str, object] | None = None,
    ) -> Outcome:
        return self._hook("annotate", host=host, job=job, reason=text, dry_run=dry_run, alert=alert)
