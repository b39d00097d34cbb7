"""Node agent metrics about checkpoint storage: the storage probe and the checkpoint sentinel."""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = ["CHECKPOINT_MISSING", "METRICS", "STORAGE_FREE", "STORAGE_PROBE_FSYNC", "STORAGE_PROBE_WRITE"]

STORAGE_PROBE_WRITE = MetricSpec(
    "storage_probe_write_seconds",
    "gauge",
    "seconds",
    "Time of the last probe write in a checkpoint directory.",
    labels=("path",),
    source="node",
)
STORAGE_PROBE_FSYNC = MetricSpec(
    "storage_probe_fsync_seconds",
    "gauge",
    "seconds",
    "Time of the last probe fsync in a checkpoint directory.",
    labels=("path",),
    source="node",
)
STORAGE_FREE = MetricSpec(
    "storage_free_bytes",
    "gauge",
    "bytes",
    "Free bytes on the file system of a checkpoint directory.",
    labels=("path",),
    source="node",
)
CHECKPOINT_MISSING = MetricSpec(
    "checkpoint_missing",
    "gauge",
    "",
    "1 when a checkpoint the ledger says completed is missing or has the wrong size.",
    labels=("run", "step"),
    source="node",
)
METRICS: tuple[MetricSpec, ...] = (STORAGE_PROBE_WRITE, STORAGE_PROBE_FSYNC, STORAGE_FREE, CHECKPOINT_MISSING)
