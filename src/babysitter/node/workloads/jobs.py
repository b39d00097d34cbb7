"""Which batch job holds each GPU, from a per-GPU job mapping directory that a Slurm prolog writes.

The format is dcgm-exporter's ``--hpc-job-mapping-dir``: one file per GPU, named by its index (or its
UUID), each line a job id; the prolog appends the job id for every GPU it allocates and the epilog
removes it (``exporters/slurm.md``). Sites already feeding dcgm-exporter can point both at the same
directory.

Exported as ``gpu_job_info{gpu,uuid,pci_bus_id,model,hpc_job} 1``, an info series joined onto the
health series in PromQL (``* on(uuid) group_left(hpc_job) gpu_job_info``), rather than a job label on
every GPU series, which would start new series for all of them at every job boundary.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from prometheus_client.core import Metric

from babysitter.catalog import node as N
from babysitter.node.collector import GpuIdentity

__all__ = ["GpuJobsCollector"]

log = logging.getLogger(__name__)

_JOB_ID = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")
_MAX_FILE_BYTES = 4096


class GpuJobsCollector:
    """``gpu_job_info`` for every GPU with a job mapping file in ``directory``."""

    def __init__(
        self,
        directory: Path,
        *,
        gpus: Callable[[], Sequence[GpuIdentity]],
        max_jobs_per_gpu: int = 8,
        name: str = "jobs",
    ) -> None:
        self.name = name
        self.directory = directory
        self._gpus = gpus
        self._max_jobs = max_jobs_per_gpu
        self._logged: set[str] = set()

    def collect(self) -> Iterable[Metric]:
        """One info series per (GPU, job); no directory means no jobs, an unreadable one raises."""
        family = N.GPU_JOB.family()
        if not self.directory.exists():
            return [family]
        if not self.directory.is_dir():
            raise NotADirectoryError(f"GPU job mapping {self.directory} is not a directory")
        for gpu in self._gpus():
            for job in self._jobs(gpu):
                family.add_metric([*gpu.label_values(), job], {})  # type: ignore[attr-defined]
        return [family]

    def _jobs(self, gpu: GpuIdentity) -> list[str]:
        jobs: list[str] = []
        for name in (str(gpu.index), gpu.uuid):
            path = self.directory / name
            try:
                with path.open("rb") as fh:
                    raw = fh.read(_MAX_FILE_BYTES)
            except FileNotFoundError:
                continue
            for line in raw.decode("utf-8", errors="replace").splitlines():
                job = line.strip()
                if not job:
                    continue
                if not _JOB_ID.fullmatch(job):
                    self._log_once(f"{path}: skipping malformed job id {job[:40]!r}")
                    continue
                if job not in jobs:
                    jobs.append(job)
        if len(jobs) > self._max_jobs:
            self._log_once(f"GPU {gpu.index}: {len(jobs)} jobs mapped, exporting the last {self._max_jobs}")
            jobs = jobs[-self._max_jobs :]
        return jobs

    def _log_once(self, message: str) -> None:
        if message not in self._logged and len(self._logged) < 100:
            self._logged.add(message)
            log.warning("babysitter: %s", message)

    def close(self) -> None:
        """Nothing to release."""
