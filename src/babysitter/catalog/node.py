"""Metrics of the node agent: per-GPU health, Xid errors, storage probe, checkpoint sentinel, collectors.

Per-GPU series carry :data:`GPU_LABELS`; the agent adds no host label (Prometheus' ``instance`` is the host).
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "COLLECTOR_DURATION",
    "COLLECTOR_SUCCESS",
    "GPU_CLOCK_EVENT_ACTIVE",
    "GPU_ECC_ERRORS",
    "GPU_ENERGY",
    "GPU_JOB",
    "GPU_LABELS",
    "GPU_MEMORY_CLOCK",
    "GPU_MEMORY_TOTAL",
    "GPU_MEMORY_USED",
    "GPU_NVLINK_ERRORS",
    "GPU_PCIE_REPLAYS",
    "GPU_POWER",
    "GPU_POWER_LIMIT",
    "GPU_QUERY_ERRORS",
    "GPU_REMAPPED_ROWS",
    "GPU_RETIRED_PAGES",
    "GPU_RETIRED_PAGES_PENDING",
    "GPU_SM_CLOCK",
    "GPU_TEMPERATURE",
    "GPU_TENSOR_ACTIVE",
    "GPU_UP",
    "GPU_UTILIZATION",
    "GPU_XID_ERRORS",
    "METRICS",
    "NODE_INFO",
    "TRAINERS",
    "TRAINER_RANK",
    "TRAINER_REGISTRATIONS_DROPPED",
    "TRAINER_REGISTRATIONS_SKIPPED",
    "TRAINER_SCRAPE_DURATION",
    "TRAINER_SCRAPE_ERRORS",
    "TRAINER_SCRAPE_SUCCESS",
    "TRAINER_SERIES_DROPPED",
    "XID_SOURCE_UP",
]

GPU_LABELS = ("gpu", "uuid", "pci_bus_id", "model")


def _gpu(name: str, kind: str, unit: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, unit, help_, labels=(*GPU_LABELS, *labels), source="node")  # type: ignore[arg-type]


GPU_UP = _gpu("gpu_up", "gauge", "", "1 when the GPU answers NVML/DCGM queries, 0 when it is lost.")
GPU_UTILIZATION = _gpu(
    "gpu_utilization_ratio", "gauge", "ratio", "Fraction of time a kernel was running (NVML utilization)."
)
GPU_TENSOR_ACTIVE = _gpu(
    "gpu_tensor_active_ratio", "gauge", "ratio", "Fraction of cycles the tensor pipes were active (DCGM/GPM)."
)
GPU_MEMORY_USED = _gpu("gpu_memory_used_bytes", "gauge", "bytes", "Device memory in use.")
GPU_MEMORY_TOTAL = _gpu("gpu_memory_total_bytes", "gauge", "bytes", "Device memory installed.")
GPU_POWER = _gpu("gpu_power_watts", "gauge", "watts", "Power draw.")
GPU_POWER_LIMIT = _gpu("gpu_power_limit_watts", "gauge", "watts", "Enforced power limit.")
GPU_ENERGY = _gpu("gpu_energy_joules_total", "counter", "joules", "Energy used since the driver loaded.")
GPU_TEMPERATURE = _gpu(
    "gpu_temperature_celsius", "gauge", "celsius", "Temperature by sensor.", labels=("sensor",)
)
GPU_SM_CLOCK = _gpu("gpu_sm_clock_hertz", "gauge", "hertz", "SM clock.")
GPU_MEMORY_CLOCK = _gpu("gpu_memory_clock_hertz", "gauge", "hertz", "Memory clock.")
GPU_CLOCK_EVENT_ACTIVE = _gpu(
    "gpu_clock_event_active",
    "gauge",
    "",
    "1 while a clock event (throttle) reason is active, by reason.",
    labels=("reason",),
)
GPU_ECC_ERRORS = _gpu(
    "gpu_ecc_errors_total", "counter", "", "ECC errors by type and counter scope.", labels=("type", "scope")
)
GPU_REMAPPED_ROWS = _gpu(
    "gpu_remapped_rows", "gauge", "", "Remapped memory rows by state.", labels=("state",)
)
GPU_RETIRED_PAGES = _gpu(
    "gpu_retired_pages",
    "gauge",
    "",
    "Memory pages retired by cause (pre-Ampere; Ampere and later remap rows instead).",
    labels=("cause",),
)
GPU_RETIRED_PAGES_PENDING = _gpu(
    "gpu_retired_pages_pending",
    "gauge",
    "",
    "1 when a page retirement waits for the next GPU reset or driver reload.",
)
GPU_XID_ERRORS = _gpu(
    "gpu_xid_errors_total",
    "counter",
    "",
    "Xid errors seen, by Xid code and action bucket (repeats count).",
    labels=("xid", "action"),
)
GPU_NVLINK_ERRORS = _gpu(
    "gpu_nvlink_errors_total",
    "counter",
    "",
    "NVLink error counters by link and type.",
    labels=("link", "type"),
)
GPU_PCIE_REPLAYS = _gpu("gpu_pcie_replays_total", "counter", "", "PCIe replay counter.")
GPU_JOB = _gpu(
    "gpu_job_info",
    "info",
    "",
    "1 for each batch job holding the GPU, from the job mapping a Slurm prolog writes; join on uuid.",
    labels=("hpc_job",),
)
GPU_QUERY_ERRORS = _gpu(
    "babysitter_gpu_query_errors_total",
    "counter",
    "",
    "GPU queries that failed with an error other than not-supported or GPU lost, by query and error.",
    labels=("query", "error"),
)

NODE_INFO = MetricSpec(
    "babysitter_node_agent_info",
    "info",
    "",
    "The node agent's GPU backend (nvml, dcgm, simulated, none) and the driver version it reports.",
    labels=("backend", "driver_version"),
    source="node",
)
TRAINERS = MetricSpec(
    "babysitter_trainers",
    "gauge",
    "",
    "Live training-process endpoints registered on this host.",
    source="node",
)
TRAINER_SCRAPE_SUCCESS = MetricSpec(
    "babysitter_trainer_scrape_success",
    "gauge",
    "",
    "1 when the agent's last fetch of a registered trainer endpoint succeeded; owner_uid is the user "
    "whose registration it is (from the file system, not from the file).",
    labels=("run", "rank", "owner_uid"),
    source="node",
)
TRAINER_SCRAPE_DURATION = MetricSpec(
    "babysitter_trainer_scrape_duration_seconds",
    "gauge",
    "seconds",
    "Time the agent's last fetch of a registered trainer endpoint took.",
    labels=("run", "rank", "owner_uid"),
    source="node",
)
TRAINER_RANK = MetricSpec(
    "babysitter_trainer_rank",
    "gauge",
    "",
    "The rank of a registered trainer endpoint as a number: its registration's, the rank label the "
    "agent binds the endpoint's series to. The rules compare it with the world size the run's rank 0 "
    "declares (PromQL cannot compare a label with a number).",
    labels=("run", "rank", "owner_uid"),
    source="node",
)
TRAINER_SCRAPE_ERRORS = MetricSpec(
    "babysitter_trainer_scrape_errors_total",
    "counter",
    "",
    "Failed fetches of a registered trainer endpoint, by reason: timeout (no complete response within "
    "the deadline), connect, tls, redirect (never followed), http_status, too_large, too_many_series, "
    "protocol, label_mismatch (it serves another run or rank than it registered), forbidden_target.",
    labels=("run", "rank", "reason"),
    source="node",
)
TRAINER_REGISTRATIONS_SKIPPED = MetricSpec(
    "babysitter_trainer_registrations_skipped_total",
    "counter",
    "",
    "Registration files the agent did not serve, each counted once, by reason: misplaced, not_regular, "
    "wrong_owner, unreadable, too_large, malformed, forbidden_target, dead, too_many, conflict (a run "
    "or rank another registration holds). See docs/security.md.",
    labels=("reason",),
    source="node",
)
TRAINER_REGISTRATIONS_DROPPED = MetricSpec(
    "babysitter_trainer_registrations_dropped_total",
    "counter",
    "",
    "Trainer registrations the agent stopped serving because their process exited.",
    source="node",
)
TRAINER_SERIES_DROPPED = MetricSpec(
    "babysitter_trainer_series_dropped_total",
    "counter",
    "",
    "Series a trainer endpoint served that the agent did not pass on, summed over scrapes, by the uid "
    "that registered it and reason: budget (over its user's fair share of the host-wide trainer budget, "
    "in series or bytes; whole families are dropped) or reserved (a name only the agent, Prometheus or "
    "another exporter may serve). See docs/security.md.",
    labels=("owner_uid", "reason"),
    source="node",
)

COLLECTOR_SUCCESS = MetricSpec(
    "babysitter_collector_success",
    "gauge",
    "",
    "1 when the collector's last run succeeded.",
    labels=("collector",),
    source="node",
)
COLLECTOR_DURATION = MetricSpec(
    "babysitter_collector_duration_seconds",
    "gauge",
    "seconds",
    "Time the collector's last run took.",
    labels=("collector",),
    source="node",
)

XID_SOURCE_UP = MetricSpec(
    "babysitter_xid_source_up",
    "gauge",
    "",
    "1 while an Xid source (kmsg, nvml) is read, 0 when it failed "
    "(unreadable /dev/kmsg, no NVML event support).",
    labels=("source",),
    source="node",
)

METRICS: tuple[MetricSpec, ...] = (
    XID_SOURCE_UP,
    GPU_UP,
    GPU_UTILIZATION,
    GPU_TENSOR_ACTIVE,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_ENERGY,
    GPU_TEMPERATURE,
    GPU_SM_CLOCK,
    GPU_MEMORY_CLOCK,
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_ECC_ERRORS,
    GPU_REMAPPED_ROWS,
    GPU_RETIRED_PAGES,
    GPU_RETIRED_PAGES_PENDING,
    GPU_XID_ERRORS,
    GPU_NVLINK_ERRORS,
    GPU_PCIE_REPLAYS,
    GPU_JOB,
    GPU_QUERY_ERRORS,
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
    NODE_INFO,
    TRAINERS,
    TRAINER_SCRAPE_SUCCESS,
    TRAINER_SCRAPE_DURATION,
    TRAINER_RANK,
    TRAINER_SCRAPE_ERRORS,
    TRAINER_REGISTRATIONS_DROPPED,
    TRAINER_REGISTRATIONS_SKIPPED,
    TRAINER_SERIES_DROPPED,
)
