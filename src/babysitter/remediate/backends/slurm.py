"""Slurm, driven as its users drive it: ``scontrol``, ``sinfo``, ``squeue``, ``scancel``, ``sbatch``.

Drain: ``scontrol update NodeName=H State=DRAIN Reason=...``; undrain: ``State=RESUME``, only when the
node's reason is still ours. Requeue: ``scontrol requeue JOB`` (the job keeps its id and runs its
script again; its training resumes from the last complete checkpoint), or with ``requeue: resubmit``
for jobs that cannot be requeued: the job's own batch script is saved (``scontrol write batch_script``),
the job cancelled and the script submitted again with the original partition, name, node count,
working directory and output files. Annotate: the node's (or job's) ``Comment``.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from babysitter.remediate.backends.base import (
    AlertDoc,
    BackendError,
    Outcome,
    Step,
    outcome_of,
    query_argv,
    run_argv,
)
from babysitter.remediate.policy import SlurmOptions

__all__ = ["SlurmBackend"]

_FIELD = re.compile(r"(?:^|\s)([A-Za-z/:]+)=(\S*)")


class SlurmBackend:
    """The Slurm backend; ``options.bin_dir`` pins where the commands live (else PATH)."""

    name = "slurm"

    def __init__(self, options: SlurmOptions) -> None:
        self.options = options

    def _cmd(self, name: str) -> str:
        return os.path.join(self.options.bin_dir, name) if self.options.bin_dir else name

    def _query(self, *argv: str) -> str:
        return query_argv([self._cmd(argv[0]), *argv[1:]], timeout=self.options.timeout)

    # ------------------------------------------------------------------ queries

    def node_count(self) -> int:
        names = {line.strip() for line in self._query("sinfo", "-h", "-N", "-o", "%N").splitlines()}
        names.discard("")
        if not names:
            raise BackendError("sinfo lists no nodes")
        return len(names)

    def partitions_of(self, host: str) -> list[str] | None:
        out = self._query("sinfo", "-h", "-N", "-n", host, "-o", "%P")
        return sorted({line.strip().rstrip("*") for line in out.splitlines() if line.strip()})

    def drain_reason(self, host: str) -> tuple[str, str] | None:
        """``(state, reason)`` of the node, None when sinfo does not know it."""
        out = self._query("sinfo", "-h", "-N", "-n", host, "-o", "%T|%E").splitlines()
        if not out or "|" not in out[0]:
            return None
        state, _, reason = out[0].partition("|")
        return state.strip(), reason.strip()

    def is_drained(self, host: str) -> bool | None:
        found = self.drain_reason(host)
        return None if found is None else "drain" in found[0]

    def jobs_on(self, host: str) -> list[str]:
        out = self._query("squeue", "-h", "-t", "RUNNING", "-w", host, "-o", "%i")
        return [line.strip() for line in out.splitlines() if line.strip()]

    def running(self, jobs: Sequence[str], host: str | None) -> list[str]:
        argv = ["squeue", "-h", "-t", "RUNNING", "-o", "%i"]
        if host is not None:
            argv[4:4] = ["-w", host]
        live = {line.strip() for line in self._query(*argv).splitlines()}
        return [job for job in jobs if job in live]

    def namespace_of(self, job: str) -> str | None:
        return None

    def nodes_of(self, jobs: Sequence[str]) -> list[str] | None:
        if not jobs:
            return []
        out = self._query("squeue", "-h", "-j", ",".join(jobs), "-o", "%N")
        lists = [line.strip() for line in out.splitlines() if line.strip() not in ("", "(null)")]
        if not lists:
            return []  # pending, or ended: it holds no node
        # One argv element, never a shell: scontrol expands n[1-4] itself.
        return sorted(set(self._query("scontrol", "show", "hostnames", ",".join(lists)).split()))

    # ------------------------------------------------------------------ actions

    def drain(self, host: str, reason: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        step = self._run(
            "drain",
            "scontrol",
            "update",
            f"NodeName={host}",
            "State=DRAIN",
            f"Reason={reason}",
            dry_run=dry_run,
        )
        return outcome_of([step], dry_run)

    def undrain(self, host: str, prefix: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        try:
            found = self.drain_reason(host)
        except BackendError as exc:
            if not dry_run:
                return Outcome(False, detail=str(exc))
            found = None
        if found is not None and not found[1].startswith(prefix.strip()):
            return Outcome(
                False, detail=f"{host} is {found[0]} with reason {found[1]!r}: not ours", refused="not_ours"
            )
        step = self._run("undrain", "scontrol", "update", f"NodeName={host}", "State=RESUME", dry_run=dry_run)
        return outcome_of([step], dry_run)

    def requeue(self, job: str, reason: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        if self.options.requeue == "resubmit":
            return self._resubmit(job, dry_run=dry_run)
        step = self._run("requeue", "scontrol", "requeue", job, dry_run=dry_run)
        return outcome_of([step], dry_run)

    def annotate_host(self, host: str, text: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        return self._comment(f"NodeName={host}", text, dry_run=dry_run)

    def annotate_job(self, job: str, text: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        return self._comment(f"JobId={job}", text, dry_run=dry_run)

    def _comment(self, target: str, text: str, *, dry_run: bool) -> Outcome:
        step = self._run("annotate", "scontrol", "update", target, f"Comment={text}", dry_run=dry_run)
        return outcome_of([step], dry_run)

    def _run(self, what: str, *argv: str, dry_run: bool) -> Step:
        return run_argv(what, [self._cmd(argv[0]), *argv[1:]], timeout=self.options.timeout, dry_run=dry_run)

    def _resubmit(self, job: str, *, dry_run: bool) -> Outcome:
        """scancel + sbatch of the job's own script, with its partition, name, size and files."""
        steps: list[Step] = []
        try:
            fields = dict(_FIELD.findall(self._query("scontrol", "-o", "show", "job", job)))
        except BackendError as exc:
            return Outcome(False, detail=f"cannot read job {job}: {exc}")
        with tempfile.TemporaryDirectory(prefix="babysitter-resubmit-") as tmp:
            script = Path(tmp) / f"job-{job}.sh"
            save = self._run(
                "save batch script", "scontrol", "write", "batch_script", job, str(script), dry_run=dry_run
            )
            steps.append(save)
            if not dry_run and not save.ok:
                return Outcome(False, steps, detail="cannot save the job's batch script")
            argv = ["sbatch", "--parsable"]
            for flag, key in (
                ("--partition", "Partition"),
                ("--job-name", "JobName"),
                ("--nodes", "NumNodes"),
                ("--chdir", "WorkDir"),
                ("--output", "StdOut"),
                ("--error", "StdErr"),
            ):
                value = fields.get(key)
                if value and value not in ("(null)", "N/A"):
                    argv += [f"{flag}={value}"]
            argv += ["--export=NONE", str(script)]
            steps.append(self._run("cancel", "scancel", job, dry_run=dry_run))
            if not dry_run and not steps[-1].ok:
                return Outcome(False, steps, detail=f"scancel {job} failed; nothing resubmitted")
            steps.append(self._run("resubmit", *argv, dry_run=dry_run))
        return outcome_of(steps, dry_run)
