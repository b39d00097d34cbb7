"""GPU-to-job mapping from a Slurm prolog's per-GPU files (dcgm-exporter's hpc-job-mapping format)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from babysitter.catalog import node as N
from babysitter.node.collector import GpuIdentity
from babysitter.node.workloads.jobs import GpuJobsCollector
from node_helpers import scrape

GPUS = [
    GpuIdentity(0, "GPU-aaa", "00000000:18:00.0", "NVIDIA H100 80GB HBM3"),
    GpuIdentity(1, "GPU-bbb", "00000000:28:00.0", "NVIDIA H100 80GB HBM3"),
]


def jobs(directory: Path, **kw: int) -> GpuJobsCollector:
    return GpuJobsCollector(directory, gpus=lambda: GPUS, **kw)


def test_jobs_by_index_and_uuid(tmp_path: Path) -> None:
    """Files named by index or UUID map job ids to GPUs, labelled with the GPU's identity."""
    (tmp_path / "0").write_text("4242\n4243\n\n")
    (tmp_path / "GPU-bbb").write_text("777_3\n")
    s = scrape(jobs(tmp_path))
    assert s.value(N.GPU_JOB.name, gpu="0", uuid="GPU-aaa", pci_bus_id="0000:18:00", hpc_job="4242") == 1
    assert s.value(N.GPU_JOB.name, gpu="0", hpc_job="4243") == 1
    assert s.value(N.GPU_JOB.name, gpu="1", hpc_job="777_3") == 1
    assert len(s.samples) == 3


def test_no_directory_means_no_jobs(tmp_path: Path) -> None:
    """Before the first prolog ran there is no directory: no series, no failure."""
    assert scrape(jobs(tmp_path / "absent")).samples == []


def test_malformed_ids_skipped_and_count_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A line that is not a job id is skipped with one log line; at most max_jobs_per_gpu per GPU."""
    (tmp_path / "0").write_text("$(reboot)\n" + "".join(f"{i}\n" for i in range(20)))
    with caplog.at_level(logging.WARNING, logger="babysitter.node.workloads.jobs"):
        collector = jobs(tmp_path, max_jobs_per_gpu=3)
        s = scrape(collector)
        scrape(collector)
    assert sorted(x.labels["hpc_job"] for x in s.samples) == ["17", "18", "19"]
    assert len([r for r in caplog.records if "malformed" in r.getMessage()]) == 1


def test_not_a_directory_fails_the_collector(tmp_path: Path) -> None:
    """A file where the directory should be is a collector failure (reported by the agent)."""
    (tmp_path / "jobs").write_text("x")
    with pytest.raises(NotADirectoryError):
        list(jobs(tmp_path / "jobs").collect())
