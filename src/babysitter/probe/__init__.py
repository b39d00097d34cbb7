"""``babysitter probe``: qualify an allocation before training on it.

Per device: dense matmul throughput against the peak table, device memory bandwidth, host-device
bandwidth; per job: all-reduce bus bandwidth (torchrun); per host: checkpoint-directory write, fsync
and read bandwidth. Devices and nodes more than a fraction below the fleet median are flagged as
lemons. Results: JSON and a per-host file the node agent serves as ``probe_*`` metrics;
:mod:`babysitter.views.probe` prints them as a table.

Importing this package does not import torch; :func:`run_probe` does.
"""

from __future__ import annotations

from babysitter.probe.lemons import DEFAULT_FRACTION, find_lemons
from babysitter.probe.results import (
    SCHEMA,
    Bandwidth,
    CollectiveResult,
    DeviceResult,
    Lemon,
    MatmulResult,
    ProbeReport,
    StorageResult,
    host_file_name,
    read_report,
    write_report,
)
from babysitter.probe.runner import SECTIONS, ProbeConfig, Sizes, run_probe

__all__ = [
    "DEFAULT_FRACTION",
    "SCHEMA",
    "SECTIONS",
    "Bandwidth",
    "CollectiveResult",
    "DeviceResult",
    "Lemon",
    "MatmulResult",
    "ProbeConfig",
    "ProbeReport",
    "Sizes",
    "StorageResult",
    "find_lemons",
    "host_file_name",
    "read_report",
    "run_probe",
    "write_report",
]
