"""The demo's remediator: ``babysitter remediate --dry-run`` as an Alertmanager receiver, and its audit log
turned into lines on screen.

The demo has no scheduler, so the remediator runs in dry run with the Slurm backend: it decides, plans
the exact commands it would run (``scontrol update NodeName=... State=DRAIN``, ``scontrol requeue``)
and audits them, and runs none. Its ``PATH`` holds no Slurm command either, so even the read-only
check that the job still runs cannot reach a real cluster from a login node: that check fails and the
requeue is planned as unconfirmed, which the audit line says. The job comes from the node agent's job
map, as on a cluster: the demo writes the per-GPU job files a Slurm prolog would (:data:`DEMO_JOB`).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from babysitter.demo.stack import Stack, write_json

__all__ = ["DEMO_JOB", "AuditTail", "describe", "remediate_policy", "start_dry_run", "write_job_map"]

#: The Slurm job id the demo's training stands for (written into the node agent's job map).
DEMO_JOB = "4242"
#: What of an audit record the demo prints (the full record stays in the file).
_SHOWN = ("event", "action", "result", "host", "job", "reason", "rule", "dry_run", "commands", "detail")
_MAX_READ = 256 * 1024


def remediate_policy(*, audit_log: Path, prometheus_url: str, cluster: str) -> dict[str, Any]:
    """A dry-run policy: a critical Xid drains the host and requeues its job (as the example policy)."""
    return {
        "version": 1,
        "backend": "slurm",
        "dry_run": True,
        "cluster": cluster,
        "audit_log": str(audit_log),
        # The job map only: a dry run here has no scheduler to ask.
        "jobs": {"prometheus_url": prometheus_url, "timeout": "5s", "ask_scheduler": False},
        "rails": {
            "rate_limit": {"actions": 10, "window": "10m"},
            # The demo's cluster is its one node: the cap lets exactly that one be drained.
            "drain_cap": {"fraction": 0.5, "window": "1h", "min_nodes": 1, "cluster_nodes": 1},
        },
        "rules": [
            {
                "name": "xid-drain-requeue",
                "match": {"alertname": "GpuXidCritical", "action": "reboot|drain|reset_gpu"},
                "actions": ["drain", "requeue"],
                "reason": "Xid {xid} on GPU {gpu}",
            }
        ],
    }


def start_dry_run(
    stack: Stack, folder: Path, policy: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start ``babysitter remediate --dry-run`` on ``policy`` as ``stack``'s "remediate", on a loopback
    port of its choosing, with a fresh bearer token (0600) and a ``PATH`` without any scheduler command
    (so not even a read-only check reaches a real cluster from this machine).

    Returns the process, the token file and the file its address will be written to."""
    no_scheduler = folder / "no-scheduler-bin"
    no_scheduler.mkdir(parents=True, exist_ok=True)
    token = folder / "token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    path = write_json(folder / "policy.json", policy)
    port_file = folder / "remediate.addr"
    proc = stack.start(
        "remediate",
        [
            sys.executable, "-m", "babysitter", "remediate", "--dry-run",
            "--policy", str(path),
            "--listen-address", "127.0.0.1:0",
            "--port-file", str(port_file),
            "--token-file", str(token),
        ],
        env={**os.environ, "PATH": str(no_scheduler)},
    )  # fmt: skip
    return proc, token, port_file


def write_job_map(directory: Path, gpus: int, job: str = DEMO_JOB) -> None:
    """One file per GPU holding the job id, as a Slurm prolog writes them (``exporters/slurm.md``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for gpu in range(gpus):
        (directory / str(gpu)).write_text(job + "\n")


class AuditTail:
    """The records appended to the audit log since the last call (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def new_records(self) -> list[dict[str, Any]]:
        """Complete new lines as records; a line that is not a JSON object is skipped."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read(_MAX_READ)
        except OSError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        out = []
        for raw in lines:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out


def _command(step: object) -> str:
    if not isinstance(step, dict):
        return "?"
    argv = step.get("argv")
    if isinstance(argv, list) and argv:
        return " ".join(_quote(os.path.basename(str(a)) if i == 0 else str(a)) for i, a in enumerate(argv))
    return str(step.get("what", "?"))


def _quote(arg: str) -> str:
    return f'"{arg}"' if " " in arg else arg


def describe(record: dict[str, Any]) -> tuple[str, str] | None:
    """``(what it did or would do, the audit line)`` for an action or refusal record; None otherwise."""
    event = record.get("event")
    if event not in ("action", "refused"):
        return None
    alert = record.get("alert") if isinstance(record.get("alert"), dict) else {}
    name = alert.get("name", "?") if isinstance(alert, dict) else "?"
    action = record.get("action", "?")
    target = " ".join(f"{k} {record[k]}" for k in ("host", "job") if record.get(k))
    if event == "refused":
        head = (
            f"REMEDIATE refused {action} {target} for {name}: {record.get('reason')} ({record.get('detail')})"
        )
    else:
        result = record.get("result")
        dry = result == "dry_run"
        commands = "; ".join(_command(step) for step in record.get("commands") or [])
        head = f"REMEDIATE {'(dry run) ' if dry else ''}{action} {target} for {name}: "
        head += f"{'would run' if dry else result} {commands}"
    shown = {key: record[key] for key in _SHOWN if record.get(key) not in (None, "", [])}
    return head.replace("  ", " "), json.dumps(shown, separators=(",", ":"))
