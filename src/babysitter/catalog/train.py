"""Metrics the in-process tracker exports, one set per rank.

Every series carries the labels ``run`` and ``rank`` plus the constant labels the user passes to
``watch(labels=...)`` (for example ``cluster``); see :data:`TRACKER_LABELS`.

Per-rank series are multiplied by the GPU count (16,384 at the scale this is built for), so every
rank exports only what a per-rank view or a sum over ranks needs; what is the same on every rank of
a synchronous job (the global step, the loss, step-time quantiles, timestamps) comes from rank 0
alone (``ranks="rank0"``). See :mod:`babysitter.catalog.budget`.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "CKPT_BYTES",
    "CKPT_FAILURES",
    "CKPT_LAST_SUCCESS",
    "CKPT_LOAD_DURATION",
    "CKPT_SAVE_DURATION",
    "DATA_WAIT",
    "GPU_INFO_LABELS",
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
    "STEP_DURATION",
    "STEP_QUANTILES",
    "STEP_QUANTILE_STEPS",
    "TOKENS",
    "TRACKER_LABELS",
    "WORLD_SIZE",
]

TRACKER_LABELS = ("run", "rank")
#: ``train_info`` labels with the parallel degrees (tensor, pipeline, context, expert, data): the keys
#: of ``watch(parallelism=...)``.
PARALLEL_LABELS = ("tp", "pp", "cp", "ep", "dp")
#: ``train_info`` labels naming the GPU the rank runs on, spelled as the node agent's GPU series spell
#: them (``catalog.node.GPU_LABELS``), so PromQL joins a rank to its GPU on ``uuid``; empty on CPU.
GPU_INFO_LABELS = ("uuid", "pci_bus_id")

#: Step-time quantiles rank 0 computes over its last :data:`STEP_QUANTILE_STEPS` steps. Ranks of a
#: synchronous job share step boundaries, so rank 0's distribution is the run's; a 13-bucket
#: histogram on every rank would cost 13 series x 16,384 GPUs for the same answer.
STEP_QUANTILES = (0.5, 0.9)
STEP_QUANTILE_STEPS = 256

STEPS = MetricSpec(
    "train_steps_total", "counter", "", "Optimizer steps completed by this process.", counts="step"
)
STEP = MetricSpec(
    "train_step",
    "gauge",
    "",
    "Current global step (as passed to or counted by the tracker).",
    ranks="rank0",
    counts="step",
)
STEP_DURATION = MetricSpec(
    "train_step_duration_seconds",
    "summary",
    "seconds",
    "Time between consecutive step boundaries (device time on CUDA, wall time on CPU); rank 0 adds "
    f"the {', '.join(f'{q:g}' for q in STEP_QUANTILES)} quantiles of its last {STEP_QUANTILE_STEPS} steps.",
    quantiles=STEP_QUANTILES,
)
LAST_STEP_TIMESTAMP = MetricSpec(
    "train_last_step_timestamp_seconds",
    "gauge",
    "seconds",
    "Unix time at which the last step finished.",
    ranks="rank0",
)
TOKENS = MetricSpec(
    "train_tokens_total",
    "counter",
    "",
    "This rank's share of its data-parallel replica's tokens (replica tokens / (tp x pp x cp)): "
    "the sum over ranks is the job's tokens.",
    counts="token",
)
SAMPLES = MetricSpec(
    "train_samples_total",
    "counter",
    "",
    "This rank's share of its data-parallel replica's samples (sequences), shared as the tokens are "
    "(exported once the tracker counted any).",
    counts="sample",
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
    "numerator (exported when recomputation is declared; without it hardware FLOPs equal model FLOPs).",
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
    ranks="rank0",
)
HFU = MetricSpec(
    "train_hfu_ratio",
    "gauge",
    "ratio",
    "Hardware FLOPs utilization over the tracker's sliding window (counts recomputation; exported "
    "when recomputation is declared).",
    ranks="rank0",
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
    ranks="rank0",
)
CKPT_SAVE_DURATION = MetricSpec(
    "train_checkpoint_save_duration_seconds",
    "summary",
    "seconds",
    "Blocking time of checkpoint saves on this rank (sum and count: the slow-save alert uses the mean).",
)
CKPT_LOAD_DURATION = MetricSpec(
    "train_checkpoint_load_duration_seconds",
    "summary",
    "seconds",
    "Time of checkpoint loads on this rank (sum and count).",
)
CKPT_BYTES = MetricSpec(
    "train_checkpoint_bytes_total", "counter", "bytes", "Bytes written by successful checkpoint saves."
)
CKPT_LAST_SUCCESS = MetricSpec(
    "train_checkpoint_last_success_timestamp_seconds",
    "gauge",
    "seconds",
    "Unix time at which the last checkpoint save succeeded.",
    ranks="rank0",
)
CKPT_FAILURES = MetricSpec(
    "train_checkpoint_failures_total", "counter", "", "Checkpoint saves that raised an exception."
)
LOSS = MetricSpec(
    "train_loss",
    "gauge",
    "",
    "Last training loss read off the hot path (may lag the step by a little).",
    ranks="rank0",
)
NONFINITE_LOSS = MetricSpec(
    "train_nonfinite_loss_total", "counter", "", "Loss values read that were NaN or infinite."
)
RUN_START_TIMESTAMP = MetricSpec(
    "train_run_start_timestamp_seconds",
    "gauge",
    "seconds",
    "Unix time at which this process's tracker started (this incarnation).",
    ranks="rank0",
)
WORLD_SIZE = MetricSpec(
    "train_world_size",
    "gauge",
    "",
    "Ranks the launcher started (torch.distributed's world size; 1 without it). Rank 0's value declares "
    "the run's ranks: the rules leave a rank number at or past it out of the run's stall, culprit and "
    "drain decisions.",
    ranks="rank0",
)
INFO = MetricSpec(
    "train_info",
    "info",
    "",
    "Static facts about this training process: versions, device, dtype used for the peak, world size, "
    "tensor/pipeline/context/expert/data parallel degrees, the UUID and PCI address of its GPU "
    "(empty on CPU or when NVML does not answer), and whether torch's flight recorder is read "
    "(flight_recorder: on, off, unavailable; empty without torch.distributed).",
    labels=(
        "version",
        "python",
        "device",
        "peak_dtype",
        "world_size",
        "local_rank",
        "flops_source",
        *PARALLEL_LABELS,
        *GPU_INFO_LABELS,
        "flight_recorder",
    ),
)

METRICS: tuple[MetricSpec, ...] = (
    STEPS,
    STEP,
    STEP_DURATION,
    LAST_STEP_TIMESTAMP,
    TOKENS,
    SAMPLES,
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
    WORLD_SIZE,
    INFO,
)
