"""Node agent metrics about checkpoint storage: the storage probe and the checkpoint sentinel.

Probe series carry ``path`` (a configured checkpoint directory, so the set is bounded by the agent's
configuration); sentinel series carry ``run`` (the run's name from its ledger): a fixed number per
run, whatever ``keep_last`` is (the missing checkpoints are a count and the newest missing step a
value, not a series per step).
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "CHECKPOINT_CHECK_FAILING",
    "CHECKPOINT_CORRUPT",
    "CHECKPOINT_CORRUPT_STEP",
    "CHECKPOINT_LEDGER_UP",
    "CHECKPOINT_MISSING",
    "CHECKPOINT_MISSING_STEP",
    "CHECKPOINT_NEWEST_VERIFIED_AGE",
    "CHECKPOINT_UNCHECKED",
    "CHECKPOINT_VERIFY_BUDGET",
    "CHECKPOINT_VERIFY_READ",
    "CHECK_FAILURE_REASONS",
    "CORRUPT_REASONS",
    "METRICS",
    "PROBE_ERROR_REASONS",
    "STORAGE_FREE",
    "STORAGE_PROBE_ERRORS",
    "STORAGE_PROBE_FSYNC",
    "STORAGE_PROBE_READ",
    "STORAGE_PROBE_RUNNING",
    "STORAGE_PROBE_UP",
    "STORAGE_PROBE_WRITE",
    "STORAGE_SIZE",
]

#: Values of ``storage_probe_errors_total{reason}``: what an operator does differs for each.
PROBE_ERROR_REASONS = (
    "missing",  # the directory does not exist (or is not a directory): unmounted, deleted, typo
    "permission",  # EACCES/EPERM: the agent's user cannot write there
    "read_only",  # EROFS: the file system is mounted (or fell back to) read-only
    "no_space",  # ENOSPC/EDQUOT: full, or over quota
    "io",  # EIO: the storage returned an I/O error
    "stale",  # ESTALE: an NFS handle went stale (server restart, export changed)
    "corrupt",  # the bytes read back differ from the bytes written
    "other",
)


def _probe(name: str, kind: str, unit: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, unit, help_, labels=("path", *labels), source="node")  # type: ignore[arg-type]


STORAGE_PROBE_WRITE = _probe(
    "storage_probe_write_seconds",
    "gauge",
    "seconds",
    "Time of the last probe's create and write in a checkpoint directory.",
)
STORAGE_PROBE_FSYNC = _probe(
    "storage_probe_fsync_seconds",
    "gauge",
    "seconds",
    "Time of the last probe's fsync in a checkpoint directory (data reaching stable storage).",
)
STORAGE_PROBE_READ = _probe(
    "storage_probe_read_seconds",
    "gauge",
    "seconds",
    "Time of the last probe's read-back in a checkpoint directory, with its cached pages dropped first.",
)
STORAGE_PROBE_UP = _probe(
    "storage_probe_up",
    "gauge",
    "",
    "1 when the last probe of a checkpoint directory wrote, synced, read back and deleted its file.",
)
STORAGE_PROBE_ERRORS = _probe(
    "storage_probe_errors_total",
    "counter",
    "",
    "Failed probes of a checkpoint directory, by reason (missing, permission, read_only, no_space, io, "
    "stale, corrupt, other); a reason's series appears with its first failure.",
    labels=("reason",),
)
STORAGE_PROBE_RUNNING = _probe(
    "storage_probe_running_seconds",
    "gauge",
    "seconds",
    "How long the probe now in progress has been running; 0 when idle. Grows without bound on a hung "
    "file system.",
)
STORAGE_FREE = _probe(
    "storage_free_bytes",
    "gauge",
    "bytes",
    "Bytes available to unprivileged users on the file system of a checkpoint directory.",
)
STORAGE_SIZE = _probe(
    "storage_size_bytes",
    "gauge",
    "bytes",
    "Size of the file system of a checkpoint directory.",
)
CHECKPOINT_MISSING = MetricSpec(
    "checkpoint_missing",
    "gauge",
    "",
    "How many of the run's last K checkpoints the ledger says completed are missing or smaller than "
    "recorded (0 when all are there).",
    labels=("run",),
    source="node",
)
CHECKPOINT_MISSING_STEP = MetricSpec(
    "checkpoint_missing_newest_step",
    "gauge",
    "",
    "Step of the newest of the run's last K checkpoints that is missing or too small (absent when none is).",
    labels=("run",),
    source="node",
)
CHECKPOINT_NEWEST_VERIFIED_AGE = MetricSpec(
    "checkpoint_newest_verified_age_seconds",
    "gauge",
    "seconds",
    "Seconds since the newest checkpoint of a run that verifies was completed: it exists with its "
    "recorded size and, where the tracker writes manifests, matches its manifest (no digest mismatch "
    "found so far).",
    labels=("run",),
    source="node",
)
#: Values of ``checkpoint_corrupt_newest_step{reason}`` (babysitter.checkpoints.verify.REASONS).
CORRUPT_REASONS = (
    "no_manifest",
    "manifest_invalid",
    "missing_file",
    "size",
    "structure",
    "digest",
    "incomplete",
)
CHECKPOINT_CORRUPT = MetricSpec(
    "checkpoint_corrupt",
    "gauge",
    "",
    "How many of the run's checked checkpoints fail verification against their manifest (a file "
    "truncated, changed or gone, a digest mismatch, no manifest after the save, a save that never "
    "ended); 0 when all verify.",
    labels=("run",),
    source="node",
)
CHECKPOINT_CORRUPT_STEP = MetricSpec(
    "checkpoint_corrupt_newest_step",
    "gauge",
    "",
    "Step of the newest of the run's checkpoints that fails verification, with the first bad file "
    "(relative to the checkpoint) and why (absent when none fails).",
    labels=("run", "file", "reason"),
    source="node",
)
CHECKPOINT_VERIFY_READ = MetricSpec(
    "checkpoint_verify_read_bytes_total",
    "counter",
    "bytes",
    "Bytes the checkpoint sentinel read back to verify digests (its I/O on the checkpoint storage; a "
    "run's worker killed during a pass counts all the bytes it was granted).",
    source="node",
)
CHECKPOINT_VERIFY_BUDGET = MetricSpec(
    "checkpoint_verify_budget_bytes",
    "gauge",
    "bytes",
    "Bytes the checkpoint sentinel may read per pass to verify digests (--checkpoint-verify-bytes; "
    "0: sizes and structure only).",
    source="node",
)
CHECKPOINT_LEDGER_UP = MetricSpec(
    "checkpoint_ledger_up",
    "gauge",
    "",
    "1 when the sentinel read the run's ledger on its last check, 0 when the ledger could not be read.",
    labels=("run",),
    source="node",
)

#: Values of ``checkpoint_check_failing{reason}``: why the sentinel could not finish a run's checks.
CHECK_FAILURE_REASONS = (
    "timeout",  # its worker did not answer within --checkpoint-run-timeout (a FIFO, a hung mount, a stop)
    "memory",  # its worker ran out of --checkpoint-run-memory
    "crashed",  # its worker died, or answered something that is not an answer
    "error",  # its worker met an error no check foresaw (a bug, or an input nothing bounds yet)
    "privileges",  # the agent could not take the run owner's credentials (no CAP_SETUID/CAP_SETGID)
)
CHECKPOINT_CHECK_FAILING = MetricSpec(
    "checkpoint_check_failing",
    "gauge",
    "seconds",
    "Seconds since the sentinel last finished checking the run, while it cannot (absent when it can): its "
    "worker ran past its time or memory budget, died, or could not take the owner's credentials; the "
    "run's other checkpoint series are its last complete check.",
    labels=("run", "reason"),
    source="node",
)
CHECKPOINT_UNCHECKED = MetricSpec(
    "checkpoint_unchecked",
    "gauge",
    "",
    "How many of the run's last K checkpoints the sentinel cannot check (absent when none): a URL, no "
    "path, a path outside the run directory, a directory someone else controls, a file that is not a "
    "regular file, or one its owner cannot read.",
    labels=("run",),
    source="node",
)

METRICS: tuple[MetricSpec, ...] = (
    STORAGE_PROBE_WRITE,
    STORAGE_PROBE_FSYNC,
    STORAGE_PROBE_READ,
    STORAGE_PROBE_UP,
    STORAGE_PROBE_ERRORS,
    STORAGE_PROBE_RUNNING,
    STORAGE_FREE,
    STORAGE_SIZE,
    CHECKPOINT_MISSING,
    CHECKPOINT_MISSING_STEP,
    CHECKPOINT_NEWEST_VERIFIED_AGE,
    CHECKPOINT_LEDGER_UP,
    CHECKPOINT_CORRUPT,
    CHECKPOINT_CORRUPT_STEP,
    CHECKPOINT_VERIFY_READ,
    CHECKPOINT_VERIFY_BUDGET,
    CHECKPOINT_CHECK_FAILING,
    CHECKPOINT_UNCHECKED,
)
