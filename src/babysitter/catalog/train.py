"""Metrics the in-process tracker exports, one set per rank.

Every series carries the labels ``run`` and ``rank`` plus the constant labels the user passes to
``watch(labels=...)`` (for example ``cluster``); see :data:`TRACKER_LABELS`.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "CHECKPOINT_BUCKETS",
    "CKPT_BYTES",
    "CKPT_FAILURES",
    "CKPT_LAST_SUCCESS",
    "CKPT_LOAD_DURATION",
    "CKPT_SAVE_DURATION",
    "DATA_WAIT",
    "HARDWARE_FLOPS",
    "HFU",
    "INFO",
    "LAST_STEP_TIMESTAMP",
    "LOSS",
    "METRICS",
    "MFU",
    "MODEL_FLOPS",
    "NONFINITE_LOSS",
    "PARALLEL_LABELS",
    "PEAK_FLOPS",
    "PHASE_SECONDS",
    "RUN_START_TIMESTAMP",
    "SAMPLES",
    "STEP",
    "STEPS",
    "STEP_BUCKETS",
    "STEP_DURATION",
    "TOKENS",
    "TOKENS_PER_SECOND",
    "TRACKER_LABELS",
]

TRACKER_LABELS = ("run", "rank")
#: ``train_info`` labels with the parallel degrees (tensor, pipeline, context, expert, data): the keys
#: of ``watch(parallelism=...)``.
PARALLEL_LABELS = ("tp", "pp", "cp", "ep", "dp")

#: Step time buckets: 1/16 s to 128 s, doubling (12 buckets + ``+Inf``). Doubling keeps the
#: per-rank series budget small while still telling a 2x slowdown apart at any step time.
STEP_BUCKETS = tuple(2.0**k for k in range(-4, 8))
#: Checkpoint save/load buckets: 1 s to 1 h.
CHECKPOINT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

STEPS = MetricSpec("train_steps_total", "counter", "", "Optimizer steps completed by this process.")
STEP = MetricSpec("train_step", "gauge", "", "Current global step (as passed to or counted by the tracker).")
STEP_DURATION = MetricSpec(
    "train_step_duration_seconds",
    "histogram",
    "seconds",
    "Time between consecutive step boundaries (device time on CUDA, wall time on CPU).",
    buckets=STEP_BUCKETS,
)
LAST_STEP_TIMESTAMP = MetricSpec(
    "train_last_step_timestamp_seconds", "gauge", "seconds", "Unix time at which the last step finished."
)
TOKENS = MetricSpec(
    "train_tokens_total",
    "counter",
    "",
    "This rank's share of its data-parallel replica's tokens (replica tokens / (tp x pp x cp)): "
    "the sum over ranks is the job's tokens.",
)
SAMPLES = MetricSpec(
    "train_samples_total",
    "counter",
    "",
    "This rank's share of its data-parallel replica's samples (sequences), shared as the tokens are.",
)
TOKENS_PER_SECOND = MetricSpec(
    "train_tokens_per_second",
    "gauge",
    "",
    "This rank's share of its replica's tokens per second over the tracker's sliding window.",
)
MODEL_FLOPS = MetricSpec(
    "train_model_flops_total",
    "counter",
    "flops",
    "This rank's share of its replica's model FLOPs (forward + backward, no recomputation): the MFU "
    "numerator; summed over ranks, the job's model FLOPs.",
)
HARDWARE_FLOPS = MetricSpec(
    "train_hardware_flops_total",
    "counter",
    "flops",
    "This rank's share of its replica's hardware FLOPs, counting activation recomputation: the HFU "
    "numerator.",
)
PEAK_FLOPS = MetricSpec(
    "train_peak_flops_per_second",
    "gauge",
    "flops",
    "Dense peak FLOP/s of this rank's device for the training dtype (absent when unknown).",
)
MFU = MetricSpec(
    "train_mfu_ratio",
    "gauge",
    "ratio",
    "Model FLOPs utilization over the tracker's sliding window: this rank's share of model FLOP/s over "
    "its dense peak (the job's MFU when the ranks keep pace).",
)
HFU = MetricSpec(
    "train_hfu_ratio",
    "gauge",
    "ratio",
    "Hardware FLOPs utilization over the tracker's sliding window (counts recomputation).",
)
DATA_WAIT = MetricSpec(
    "train_data_wait_seconds_total",
    "counter",
    "seconds",
    "Time the training loop spent blocked waiting for the next batch.",
)
PHASE_SECONDS = MetricSpec(
    "train_phase_seconds_total",
    "counter",
    "seconds",
    "Time spent in user-marked phases (eval, ...), by phase.",
    labels=("phase",),
)
CKPT_SAVE_DURATION = MetricSpec(
    "train_checkpoint_save_duration_seconds",
    "histogram",
    "seconds",
    "Blocking time of checkpoint saves on this rank.",
    buckets=CHECKPOINT_BUCKETS,
)
CKPT_LOAD_DURATION = MetricSpec(
    "train_checkpoint_load_duration_seconds",
    "histogram",
    "seconds",
    "Time of checkpoint loads on this rank.",
    buckets=CHECKPOINT_BUCKETS,
)
CKPT_BYTES = MetricSpec(
    "train_checkpoint_bytes_total", "counter", "bytes", "Bytes written by successful checkpoint saves."
)
CKPT_LAST_SUCCESS = MetricSpec(
    "train_checkpoint_last_success_timestamp_seconds",
    "gauge",
    "seconds",
    "Unix time at which the last checkpoint save succeeded.",
)
CKPT_FAILURES = MetricSpec(
    "train_checkpoint_failures_total", "counter", "", "Checkpoint saves that raised an exception."
)
LOSS = MetricSpec(
    "train_loss", "gauge", "", "Last training loss read off the hot path (may lag the step by a little)."
)
NONFINITE_LOSS = MetricSpec(
    "train_nonfinite_loss_total", "counter", "", "Loss values read that were NaN or infinite."
)
RUN_START_TIMESTAMP = MetricSpec(
    "train_run_start_timestamp_seconds",
    "gauge",
    "seconds",
    "Unix time at which this process's tracker started (this incarnation).",
)
INFO = MetricSpec(
    "train_info",
    "info",
    "",
    "Static facts about this training process: version, device, dtype used for the peak, world size, "
    "tensor/pipeline/context/expert/data parallel degrees.",
    labels=("version", "device", "peak_dtype", "world_size", "local_rank", "flops_source", *PARALLEL_LABELS),
)

METRICS: tuple[MetricSpec, ...] = (
    STEPS,
    STEP,
    STEP_DURATION,
    LAST_STEP_TIMESTAMP,
    TOKENS,
    SAMPLES,
    TOKENS_PER_SECOND,
    MODEL_FLOPS,
    HARDWARE_FLOPS,
    PEAK_FLOPS,
    MFU,
    HFU,
    DATA_WAIT,
    PHASE_SECONDS,
    CKPT_SAVE_DURATION,
    CKPT_LOAD_DURATION,
    CKPT_BYTES,
    CKPT_LAST_SUCCESS,
    CKPT_FAILURES,
    LOSS,
    NONFINITE_LOSS,
    RUN_START_TIMESTAMP,
    INFO,
)
