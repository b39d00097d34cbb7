"""Remediations written next to the run's goodput ledger, so the report can say why a restart happened.

The tracker of a live run holds the ledger's single-writer lock, and a remediation happens while the
run is still alive more often than not (a drained host's job is requeued while it still steps), so
the remediator never writes the ledger itself: it appends one JSON line per remediation to
``remediations.jsonl`` in the run directory (``O_APPEND``, one ``write`` per line, fsynced), which
:mod:`babysitter.ledger.remediations` reads back for ``babysitter report`` (the restart's cause, time
to detect, time to recover). Each line also names the checkpoint the requeued job should resume from:
the newest one that verifies (:func:`babysitter.checkpoints.resume_point`: its manifest is there, its
files have their sizes, the node agent's sentinel found no digest mismatch), not merely the newest the
ledger lists, and the newer ones it skipped and why.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from babysitter import jsonout
from babysitter.checkpoints import checkpoint_statuses, resume_point
from babysitter.ledger.remediations import NOTE_VERSION, NOTES_FILE, note_text
from babysitter.remediate.engine import Remediation

__all__ = ["NOTES_FILE", "RunNotes"]

log = logging.getLogger(__name__)
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RunNotes:
    """Writes remediations into ``template.format(run=...)`` directories that exist."""

    def __init__(self, template: str) -> None:
        self.template = template

    def run_dir(self, run: str) -> Path | None:
        """The run's directory; None when the name could escape the template or the directory is absent."""
        if not _RUN.fullmatch(run) or ".." in run:
            return None
        path = Path(self.template.replace("{run}", run))
        return path if path.is_dir() else None

    def record(self, remediation: Remediation) -> None:
        """Append the remediation to each of its runs' directories (dry runs are not written)."""
        if remediation.dry_run:
            return
        for run in remediation.runs:
            folder = self.run_dir(run)
            if folder is None:
                log.warning("babysitter remediate: no run directory for run %r (%s)", run, self.template)
                continue
            line = note(remediation, run, folder)
            fd = os.open(folder / NOTES_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, (jsonout.dumps(line, separators=(",", ":"), sort_keys=True) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)


def note(remediation: Remediation, run: str, folder: Path) -> dict[str, object]:
    """The line written for one run: what happened, the alert, and the checkpoint the job resumes from."""
    alert = remediation.alert
    labels = alert.labels
    line: dict[str, object] = {
        "v": NOTE_VERSION,
        "t": round(remediation.t, 6),
        "run": run,
        "action": remediation.action,
        "job": remediation.job,
        "host": remediation.host,
        "drained": remediation.drained,
        "alert": note_text(alert.name),
        "cause": note_text(cause(remediation)),
        "labels": {k: note_text(labels[k])[:64] for k in ("xid", "gpu", "instance", "reason") if k in labels},
    }
    if alert.starts_at > 0:
        line["alert_start"] = round(alert.starts_at, 6)
    try:
        statuses = checkpoint_statuses(folder)
    except OSError as exc:
        log.warning("babysitter remediate: cannot read the ledger of %s: %s", run, exc)
        statuses = []
    resume = resume_point(statuses)
    if resume is not None:
        line["resume_step"] = resume.step
        line["resume_path"] = resume.path  # at most the ledger's 1024 characters
        line["resume_verified"] = resume.verified
    newer = [s for s in statuses if resume is None or s.time > resume.time]
    if newer:  # the newer checkpoints a resume must not use, and why
        line["resume_skipped"] = [
            {"step": s.step, "status": s.status, "reason": s.reason, "file": note_text(s.file)[:200]}
            for s in newer[-3:]
        ]
    return line


def cause(remediation: Remediation) -> str:
    """The restart's cause in words: ``remediated: drained host n1 after Xid 79, requeued job 12``."""
    labels = remediation.alert.labels
    why = f"Xid {labels['xid']}" if labels.get("xid") else remediation.alert.name
    parts = []
    if remediation.drained:
        parts.append(f"drained host {remediation.drained} after {why}")
        why = ""
    parts.append(f"requeued job {remediation.job}" + (f" after {why}" if why else ""))
    return "remediated: " + ", ".join(parts)
