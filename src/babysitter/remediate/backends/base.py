"""What a scheduler backend does for the remediator, and the record of each thing it ran.

Every program a backend runs (Slurm's commands, a user's script) goes through :func:`run_argv` or
:func:`query_argv`: an argv list (never a shell), bounded in time, in its own session so that a
timeout ends everything it started (a child that keeps the output pipe open cannot hold the
remediator), output kept to its head and tail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "AlertDoc",
    "Backend",
    "BackendError",
    "Outcome",
    "Step",
    "outcome_of",
    "query_argv",
    "run_argv",
]

#: What a backend gets of the alert (:meth:`Alert.describe`), for hooks and logs.
AlertDoc = Mapping[str, object] | None

#: Output kept from a command, for the audit log (its head and tail).
MAX_OUTPUT = 2000


class BackendError(RuntimeError):
    """A query the remediator needs (nodes, jobs, a node's state) failed."""


@dataclass
class Step:
    """One command or API call of an action: what it was, and (once run) how it went."""

    what: str
    argv: tuple[str, ...] = ()
    ok: bool | None = None
    code: int | None = None
    output: str = ""
    seconds: float = 0.0

    def record(self) -> dict[str, object]:
        """The audit log's view."""
        out: dict[str, object] = {"what": self.what}
        if self.argv:
            out["argv"] = list(self.argv)
        if self.ok is not None:
            out.update(ok=self.ok, code=self.code, output=self.output, seconds=round(self.seconds, 3))
        return out


@dataclass
class Outcome:
    """The result of one action: ``ok`` (all steps succeeded), ``planned`` (dry run) or failed."""

    ok: bool
    steps: list[Step] = field(default_factory=list)
    detail: str = ""
    #: Set when the backend declines for a reason the rails count (``not_ours``).
    refused: str | None = None


class Backend(Protocol):
    """A scheduler the remediator drives. Every method is bounded in time and never uses a shell."""

    name: str

    def node_count(self) -> int:
        """Nodes in the cluster (for the drain cap); BackendError when it cannot tell."""
        ...

    def partitions_of(self, host: str) -> list[str] | None:
        """The host's partitions (Slurm), or None where the scheduler has none."""
        ...

    def jobs_on(self, host: str) -> list[str]:
        """Jobs running on the host now (the scheduler's own view)."""
        ...

    def running(self, jobs: Sequence[str], host: str | None) -> list[str]:
        """Those of ``jobs`` that run now (on ``host``, when given): a job map can be out of date."""
        ...

    def namespace_of(self, job: str) -> str | None:
        """The job's namespace (Kubernetes), or None."""
        ...

    def nodes_of(self, jobs: Sequence[str]) -> list[str] | None:
        """The nodes the jobs hold (Slurm: their node lists; Kubernetes: the nodes of their pods and of
        the other pods of their JobSet or PyTorchJob), None when the backend cannot tell."""
        ...

    def is_drained(self, host: str) -> bool | None:
        """Whether the host is drained (cordoned) now; None when the backend cannot tell."""
        ...

    def drain(self, host: str, reason: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        """Stop new work landing on the host, with a reason the scheduler shows."""
        ...

    def undrain(self, host: str, prefix: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        """Return the host to service, only if its drain reason starts with ``prefix``: the reason
        this remediator gave the drain it undoes (refused ``not_ours`` otherwise)."""
        ...

    def requeue(self, job: str, reason: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        """Stop the job and run its script again (the training resumes from its checkpoint)."""
        ...

    def annotate_host(self, host: str, text: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        """Attach a note to the host without changing anything else."""
        ...

    def annotate_job(self, job: str, text: str, *, dry_run: bool, alert: AlertDoc = None) -> Outcome:
        """Attach a note to the job without changing anything else."""
        ...


def _run(
    argv: Sequence[str], *, timeout: float, stdin: bytes | None, env: Mapping[str, str] | None
) -> subprocess.CompletedProcess[bytes]:
    """``subprocess.run`` in a new session whose whole process group is killed at the timeout."""
    with subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_argv(
    what: str,
    argv: Sequence[str],
    *,
    timeout: float,
    dry_run: bool,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
) -> Step:
    """Run a program with an argv list (no shell, ``stdin`` as its input), bounded in time; a dry run
    only records it."""
    step = Step(what, tuple(argv))
    if dry_run:
        return step
    start = time.monotonic()
    try:
        proc = _run(argv, timeout=timeout, stdin=stdin, env=env)
        step.code = proc.returncode
        step.ok = proc.returncode == 0
        step.output = _bounded((proc.stdout + proc.stderr).decode("utf-8", errors="replace"))
    except subprocess.TimeoutExpired:
        step.ok, step.output = False, f"timed out after {timeout:g} s"
    except OSError as exc:
        step.ok, step.output = False, f"cannot run {argv[0]}: {exc.strerror or exc}"
    step.seconds = time.monotonic() - start
    return step


def outcome_of(steps: list[Step], dry_run: bool) -> Outcome:
    """The outcome of commands run in order: a dry run is planned (ok); else the first failure's output."""
    if dry_run:
        return Outcome(True, steps)
    failed = next((step for step in steps if not step.ok), None)
    return Outcome(failed is None, steps, detail=failed.output if failed else "")


def _bounded(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_OUTPUT:
        return text
    half = MAX_OUTPUT // 2
    return f"{text[:half]} [...] {text[-half:]}"


def query_argv(argv: Sequence[str], *, timeout: float) -> str:
    """Run a read-only query; its stdout, or BackendError with what went wrong."""
    try:
        proc = _run(argv, timeout=timeout, stdin=None, env=None)
    except subprocess.TimeoutExpired:
        raise BackendError(f"{os.path.basename(argv[0])} timed out after {timeout:g} s") from None
    except OSError as exc:
        raise BackendError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", errors="replace").strip()[:500]
        raise BackendError(f"{' '.join(argv[:3])}... exited {proc.returncode}: {err}")
    return proc.stdout.decode("utf-8", errors="replace")
