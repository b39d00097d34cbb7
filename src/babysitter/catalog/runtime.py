"""Per-rank run health the tracker computes in-process: hangs and stragglers.

Same labels as the tracker's metrics (``run``, ``rank`` and the user's constant labels). Three
series per rank (the hang threshold from rank 0 alone), inside the per-rank budget of DESIGN.md.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "HANGS",
    "HANG_THRESHOLD",
    "METRICS",
    "STALLED_SECONDS",
    "STRAGGLER_SCORE",
]

HANGS = MetricSpec(
    "train_hangs_total",
    "counter",
    "",
    "Hangs the in-process watchdog detected: no step finished for longer than the hang threshold "
    "(checkpoints and marked phases excluded). One per episode.",
    counts="hang",
)
HANG_THRESHOLD = MetricSpec(
    "train_hang_threshold_seconds",
    "gauge",
    "seconds",
    "Seconds without a finished step after which the watchdog declares a hang (fixed, or k x the "
    "recent median step time with a floor).",
    ranks="rank0",
)
STALLED_SECONDS = MetricSpec(
    "train_stalled_seconds",
    "gauge",
    "seconds",
    "Seconds since this rank's last finished step, not counting checkpoints and marked phases "
    "(0 while one is under way).",
)
STRAGGLER_SCORE = MetricSpec(
    "train_straggler_score",
    "gauge",
    "",
    "This rank's median step time over the median of all ranks' medians, exchanged in-process "
    "every N steps (1 = typical, 1.5 = 50% slower than the median rank).",
)

METRICS: tuple[MetricSpec, ...] = (HANGS, HANG_THRESHOLD, STALLED_SECONDS, STRAGGLER_SCORE)
