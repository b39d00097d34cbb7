"""Metrics of ``babysitter probe`` (cluster qualification), exposed through the node agent.

The probe writes one JSON results file per host; the node agent's ``probe`` collector turns the file
into these series, so a fleet's qualification results land in the same Prometheus as its training
metrics (and the scorecard can put them next to MFU and goodput).

Per-device series carry ``gpu`` (the local device index, or ``cpu`` for a CPU-only probe) and
``model`` (the device name); both sets are bounded by the host's hardware. ``check`` on the lemon
series is one of :data:`DEVICE_CHECKS` / :data:`NODE_CHECKS`.
"""

from __future__ import annotations

from babysitter.catalog._spec import MetricSpec

__all__ = [
    "DEVICE_CHECKS",
    "DEVICE_LABELS",
    "METRICS",
    "NODE_CHECKS",
    "PROBE_ALLREDUCE_BUS_BANDWIDTH",
    "PROBE_DEVICE_LEMON",
    "PROBE_HOST_DEVICE_BANDWIDTH",
    "PROBE_MATMUL_FLOPS",
    "PROBE_MATMUL_PEAK",
    "PROBE_MEMORY_BANDWIDTH",
    "PROBE_NODE_ALLREDUCE_BUS_BANDWIDTH",
    "PROBE_NODE_LEMON",
    "PROBE_RESULTS_INVALID",
    "PROBE_STORAGE_FSYNC",
    "PROBE_STORAGE_READ_BANDWIDTH",
    "PROBE_STORAGE_WRITE_BANDWIDTH",
    "PROBE_TIMESTAMP",
]

DEVICE_LABELS = ("gpu", "model")

#: Per-device measurements a device is compared on against the fleet median.
DEVICE_CHECKS = ("matmul", "memory", "host_to_device", "device_to_host")
#: Per-node measurements a node is compared on against the fleet median.
NODE_CHECKS = ("matmul", "allreduce", "storage_write", "storage_read")


def _device(name: str, unit: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "gauge", unit, help_, labels=(*DEVICE_LABELS, *labels), source="probe")


PROBE_MATMUL_FLOPS = _device(
    "probe_matmul_flops_per_second",
    "flops",
    "Best dense matmul throughput of a device in the last probe (bf16 on GPUs, fp32 on CPUs).",
    labels=("dtype",),
)
PROBE_MATMUL_PEAK = _device(
    "probe_matmul_peak_ratio",
    "ratio",
    "Measured matmul throughput over the device's dense peak for the dtype (absent when unknown).",
    labels=("dtype",),
)
PROBE_MEMORY_BANDWIDTH = _device(
    "probe_memory_bandwidth_bytes_per_second",
    "bytes",
    "Device memory bandwidth of a device-to-device copy (bytes read + bytes written per second).",
)
PROBE_HOST_DEVICE_BANDWIDTH = _device(
    "probe_host_device_bandwidth_bytes_per_second",
    "bytes",
    "Pinned host-device copy bandwidth, by direction (host_to_device, device_to_host); GPUs only.",
    labels=("direction",),
)
PROBE_ALLREDUCE_BUS_BANDWIDTH = MetricSpec(
    "probe_allreduce_bus_bandwidth_bytes_per_second",
    "gauge",
    "bytes",
    "All-reduce bus bandwidth of the last probe's job, as NCCL-tests define it: algbw x 2(n-1)/n.",
    labels=("backend", "world_size"),
    source="probe",
)
PROBE_NODE_ALLREDUCE_BUS_BANDWIDTH = MetricSpec(
    "probe_node_allreduce_bus_bandwidth_bytes_per_second",
    "gauge",
    "bytes",
    "All-reduce bus bandwidth among this node's ranks in the last probe (NVLink/NVSwitch on GPU nodes).",
    labels=("backend", "world_size"),
    source="probe",
)
PROBE_STORAGE_WRITE_BANDWIDTH = MetricSpec(
    "probe_storage_write_bandwidth_bytes_per_second",
    "gauge",
    "bytes",
    "Checkpoint-directory write bandwidth of a checkpoint-sized file, fsync included (what a save sees).",
    labels=("path",),
    source="probe",
)
PROBE_STORAGE_READ_BANDWIDTH = MetricSpec(
    "probe_storage_read_bandwidth_bytes_per_second",
    "gauge",
    "bytes",
    "Checkpoint-directory read bandwidth of the same file with its cached pages dropped (what a load sees).",
    labels=("path",),
    source="probe",
)
PROBE_STORAGE_FSYNC = MetricSpec(
    "probe_storage_fsync_seconds",
    "gauge",
    "seconds",
    "Time of the fsync that followed the probe's write of a checkpoint-sized file.",
    labels=("path",),
    source="probe",
)
PROBE_DEVICE_LEMON = _device(
    "probe_device_lemon",
    "",
    "1 when a device measured more than the lemon fraction below the fleet median in a check, else 0.",
    labels=("check",),
)
PROBE_NODE_LEMON = MetricSpec(
    "probe_node_lemon",
    "gauge",
    "",
    "1 when this node measured more than the lemon fraction below the fleet's median node in a check.",
    labels=("check",),
    source="probe",
)
PROBE_TIMESTAMP = MetricSpec(
    "probe_last_run_timestamp_seconds",
    "gauge",
    "seconds",
    "Unix time at which the probe whose results this host serves finished.",
    source="probe",
)
PROBE_RESULTS_INVALID = MetricSpec(
    "probe_results_invalid_files",
    "gauge",
    "",
    "Files in the probe results directory that could not be read or are not probe results (skipped).",
    source="probe",
)

METRICS: tuple[MetricSpec, ...] = (
    PROBE_MATMUL_FLOPS,
    PROBE_MATMUL_PEAK,
    PROBE_MEMORY_BANDWIDTH,
    PROBE_HOST_DEVICE_BANDWIDTH,
    PROBE_ALLREDUCE_BUS_BANDWIDTH,
    PROBE_NODE_ALLREDUCE_BUS_BANDWIDTH,
    PROBE_STORAGE_WRITE_BANDWIDTH,
    PROBE_STORAGE_READ_BANDWIDTH,
    PROBE_STORAGE_FSYNC,
    PROBE_DEVICE_LEMON,
    PROBE_NODE_LEMON,
    PROBE_TIMESTAMP,
    PROBE_RESULTS_INVALID,
)
