"""Per-rank run health the tracker computes in-process: hangs, stragglers and collectives.

Same labels as the tracker's metrics (``run``, ``rank`` and the user's constant labels). Three
series per rank (the hang threshold from rank 0 alone), plus, where torch's flight recorder is read
(``training/collectives.py``), one per process group (at most four) and the collective lag; the
stuck-collective series exist only while a rank is stalled. Inside the per-rank budget of DESIGN.md.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "COLLECTIVE_LAG",
    "COLLECTIVE_LAST_ENQUEUED",
    "COLLECTIVE_STUCK",
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
    "How much slower this rank is than the median rank, exchanged in-process every N steps (1 = "
    "typical, 1.5 = 50% slower): its own work between collectives over the median rank's, from when "
    "each rank enqueued the default group's collectives (torch's flight recorder, clock offsets "
    "removed), which lockstep step times cannot show; where the recorder is off, its median work or "
    "step time over the median rank's.",
)
COLLECTIVE_LAST_ENQUEUED = MetricSpec(
    "train_collective_last_enqueued_seq",
    "gauge",
    "",
    "Sequence number of the last collective this rank enqueued on process group pg (torch's flight "
    "recorder; at most four groups, babysitter's own left out). In a hang, a rank below the others of "
    "its run never reached the collective they wait in.",
    labels=("pg",),
)
COLLECTIVE_STUCK = MetricSpec(
    "train_collective_stuck_seq",
    "gauge",
    "",
    "Exported only while this rank is stalled: the sequence number of the collective it waits in on "
    "process group pg (the oldest it enqueued and has not completed), with the operation, its element "
    "count and the last collective it completed.",
    labels=("pg", "op", "size", "last_completed"),
)
COLLECTIVE_LAG = MetricSpec(
    "train_collective_lag_seconds",
    "gauge",
    "seconds",
    "How much later than the median rank this rank enqueues the default group's collectives, over the "
    "last straggler round (clock offsets removed; on NCCL from the collectives' GPU durations): the "
    "other ranks wait about that long for it at each collective.",
)

METRICS: tuple[MetricSpec, ...] = (
    HANGS,
    HANG_THRESHOLD,
    STALLED_SECONDS,
    STRAGGLER_SCORE,
    COLLECTIVE_LAST_ENQUEUED,
    COLLECTIVE_STUCK,
    COLLECTIVE_LAG,
)
