"""Goodput metrics the tracker exports from the run ledger (continued across restarts).

Labels: the tracker's ``run`` and ``rank`` (only rank 0 exports these) plus the user's constant labels.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "BADPUT_CAUSES",
    "BADPUT_SECONDS",
    "CKPT_EXPECTED_GOODPUT",
    "CKPT_INTERVAL",
    "CKPT_INTERVAL_RECOMMENDED",
    "CKPT_INTERVAL_WHICH",
    "GOODPUT",
    "IDEAL_STEP",
    "LEDGER_DROPPED_RECORDS",
    "LEDGER_PENDING_BYTES",
    "LEDGER_SKIPPED_LINES",
    "LEDGER_WRITER_STATE",
    "LEDGER_WRITE_ERRORS",
    "METRICS",
    "PRODUCTIVE_SECONDS",
    "RESTARTS",
    "ROLLING_GOODPUT",
    "ROLLING_WINDOWS",
    "STEP_DEVIATION",
]

#: The ledger's vocabulary for time that did not become kept progress (see DESIGN.md). ``eval`` is
#: the phase named eval (or evaluation/validation/val); every other user-marked phase is ``phase``, so
#: the label stays bounded whatever names a training script uses. ``slowdown`` is step time beyond the
#: run's ideal step time (ledger/slowdown.py).
BADPUT_CAUSES = (
    "startup",
    "checkpoint_load",
    "checkpoint_save",
    "data_stall",
    "lost_progress",
    "downtime",
    "eval",
    "phase",
    "hang",
    "slowdown",
    "other",
)

GOODPUT = MetricSpec(
    "train_goodput_ratio",
    "gauge",
    "ratio",
    "Productive step time over wall time since the run first started, across restarts.",
    ranks="rank0",
)
PRODUCTIVE_SECONDS = MetricSpec(
    "train_productive_seconds_total",
    "counter",
    "seconds",
    "Step time that became kept progress, since the run first started (continued across restarts).",
    ranks="rank0",
)
BADPUT_SECONDS = MetricSpec(
    "train_badput_seconds_total",
    "counter",
    "seconds",
    "Wall time that did not become kept progress, by cause, since the run first started.",
    labels=("cause",),
    ranks="rank0",
)
RESTARTS = MetricSpec(
    "train_restarts_total",
    "counter",
    "",
    "Incarnations of this run after the first (restarts).",
    ranks="rank0",
    counts="restart",
)

# MLGM's step metrics (ledger/slowdown.py, docs/goodput.md "Slowdown"), from the same ledger.
IDEAL_STEP = MetricSpec(
    "train_ideal_step_seconds",
    "gauge",
    "seconds",
    "The run's ideal step time at the work of its latest step: the mean of recent healthy steps within "
    "median +- 3 MAD, per token of the step (absent until 20 steps of that work were seen).",
    ranks="rank0",
)
STEP_DEVIATION = MetricSpec(
    "train_step_time_deviation_seconds",
    "gauge",
    "seconds",
    "Mean absolute difference between step time and ideal step time over the last 100 judged steps "
    "(MLGM's step-time deviation).",
    ranks="rank0",
)
#: The windows ``train_rolling_goodput_ratio`` is computed over: label value -> seconds.
ROLLING_WINDOWS = {"15m": 900.0}
ROLLING_GOODPUT = MetricSpec(
    "train_rolling_goodput_ratio",
    "gauge",
    "ratio",
    "Goodput over the last window (label window), as babysitter report accounts it: steps not yet "
    "covered by a checkpoint count as productive, slow steps' time beyond the ideal as slowdown.",
    labels=("window",),
    ranks="rank0",
)

# The checkpoint-interval advisor (ledger/advisor.py), from the same ledger: see docs/checkpoint-interval.md.
CKPT_INTERVAL = MetricSpec(
    "train_checkpoint_interval_seconds",
    "gauge",
    "seconds",
    "The run's current checkpoint interval: median wall time from a successful save's end to the next "
    "save's begin (recent saves; absent before two saves).",
    ranks="rank0",
)
CKPT_INTERVAL_RECOMMENDED = MetricSpec(
    "train_checkpoint_recommended_interval_seconds",
    "gauge",
    "seconds",
    "The checkpoint interval that maximises expected goodput (Young/Daly from the measured save cost and "
    "interruption rate); absent while the interruption rate rests on too little data.",
    ranks="rank0",
)
#: Values of the expected goodput's ``interval`` label.
CKPT_INTERVAL_WHICH = ("current", "recommended")
CKPT_EXPECTED_GOODPUT = MetricSpec(
    "train_checkpoint_expected_goodput_ratio",
    "gauge",
    "ratio",
    "Expected goodput (Daly's model: measured save and restart costs, interruption rate) at the current "
    "and at the recommended checkpoint interval.",
    labels=("interval",),
    ranks="rank0",
)

LEDGER_WRITE_ERRORS = MetricSpec(
    "babysitter_ledger_write_errors_total",
    "counter",
    "",
    "Failed ledger operations (read-only or full disk, lock lost, file deleted...) by operation; "
    "records are retried.",
    labels=("op",),
    source="self",
    ranks="rank0",
)
LEDGER_SKIPPED_LINES = MetricSpec(
    "babysitter_ledger_skipped_lines_total",
    "counter",
    "",
    "Ledger lines skipped when this process read the ledger at start: torn (cut by a crash), invalid, "
    "or fenced (written by a writer after another took the lock over).",
    labels=("reason",),
    source="self",
    ranks="rank0",
)
LEDGER_PENDING_BYTES = MetricSpec(
    "babysitter_ledger_pending_bytes",
    "gauge",
    "bytes",
    "Ledger bytes waiting to be written (grows while the ledger's storage fails).",
    source="self",
    ranks="rank0",
)
LEDGER_DROPPED_RECORDS = MetricSpec(
    "babysitter_ledger_dropped_records_total",
    "counter",
    "",
    "Ledger lines dropped because the pending buffer was full while the storage kept failing.",
    source="self",
    ranks="rank0",
)

LEDGER_WRITER_STATE = MetricSpec(
    "babysitter_ledger_writer_state",
    "gauge",
    "",
    "1, labelled with the ledger writer's state: writing, waiting (another writer's lock, not stale "
    "yet), failing (storage errors), fenced (another writer took over); records are kept unless fenced.",
    labels=("state",),
    source="self",
)

METRICS: tuple[MetricSpec, ...] = (
    GOODPUT,
    PRODUCTIVE_SECONDS,
    BADPUT_SECONDS,
    RESTARTS,
    IDEAL_STEP,
    STEP_DEVIATION,
    ROLLING_GOODPUT,
    CKPT_INTERVAL,
    CKPT_INTERVAL_RECOMMENDED,
    CKPT_EXPECTED_GOODPUT,
    LEDGER_WRITE_ERRORS,
    LEDGER_SKIPPED_LINES,
    LEDGER_PENDING_BYTES,
    LEDGER_DROPPED_RECORDS,
    LEDGER_WRITER_STATE,
)
