"""babysitter's own health: errors it swallowed so training never sees them."""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = ["BUILD_INFO", "EXPORTER_PORT", "INPUT_REJECTED", "INTERNAL_ERRORS", "METRICS"]

INTERNAL_ERRORS = MetricSpec(
    "babysitter_internal_errors_total",
    "counter",
    "",
    "Exceptions raised inside babysitter and caught before they reached training, by where they happened.",
    labels=("where",),
    source="self",
)
INPUT_REJECTED = MetricSpec(
    "babysitter_input_rejected_total",
    "counter",
    "",
    "Values passed to the tracker at run time that were skipped as invalid, by reason.",
    labels=("reason",),
    source="self",
)
EXPORTER_PORT = MetricSpec(
    "babysitter_exporter_port",
    "gauge",
    "",
    "TCP port this process's metrics endpoint is bound to, exported when it differs from the one "
    "requested (a fallback: the requested port was taken).",
    labels=("requested",),
    source="self",
)
BUILD_INFO = MetricSpec(
    "babysitter_build_info",
    "info",
    "",
    "babysitter version and the Python it runs on (the node agent; trackers put both in train_info).",
    labels=("version", "python"),
    source="self",
)

METRICS: tuple[MetricSpec, ...] = (INTERNAL_ERRORS, INPUT_REJECTED, EXPORTER_PORT, BUILD_INFO)
