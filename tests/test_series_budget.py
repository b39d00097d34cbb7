"""The series budget holds: real exporters, scraped over HTTP, counted against catalog.budget.

Scenario (the worst of normal operation): two trackers of one run, rank 0 with its ledger and rank 1,
each after 20 steps, a checkpoint save, a checkpoint load and an eval phase; a node agent with 8
simulated GPUs, one storage path and the checkpoint sentinel over rank 0's run directory (one of
its checkpoints deleted), reading the fabric of a fake HGX-like host (babysitter.node.fabric.fake:
8 GPUs and 8 single-port NICs, 16 PCIe devices, 2 memory controllers, 2 CPU packages). The counts
must stay within the budget and equal the ones recorded in catalog.budget.MEASURED, which
docs/metrics.md shows.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import babysitter
from babysitter.catalog import fabric as F
from babysitter.catalog.budget import BUDGET, MEASURED
from babysitter.node.config import SYSFS_COLLECTORS
from babysitter.node.fabric.fake import FakeSysfs
from node_helpers import read_port_file, wait_for

pytestmark = pytest.mark.slow

Series = list[tuple[str, dict[str, str]]]


def _scrape(url: str) -> Series:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
        text = response.read().decode()
    return [(s.name, dict(s.labels)) for f in text_string_to_metric_families(text) for s in f.samples]


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Series]:
    tmp = tmp_path_factory.mktemp("budget")
    run_dir, storage, reg = tmp / "run", tmp / "storage", tmp / "reg"
    for folder in (run_dir, storage, reg):
        folder.mkdir()
    saved = os.environ.copy()
    out: dict[str, Series] = {}
    trackers = []
    try:
        for rank in (0, 1):
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
            trackers.append(
                babysitter.watch(
                    run="budget",
                    tokens_per_step=4096,
                    flops_per_token=6e9,
                    peak_flops=1e15,
                    port=0,
                    registry_dir=reg,
                    run_dir=run_dir if rank == 0 else None,
                    labels={"cluster": "c1"},
                    flush_interval=0.1,
                )
            )
        for rank, tracker in enumerate(trackers):
            for step in range(1, 21):
                tracker.step(loss=1.5)
                if step % 5 == 0:
                    path = run_dir / f"ckpt-{step}-rank{rank}.pt"
                    with tracker.checkpoint_save(step=step, nbytes=16, path=str(path)):
                        path.write_bytes(bytes(16))
            with tracker.checkpoint_load(step=20):
                pass
            with tracker.phase("eval"):
                pass
        time.sleep(0.5)  # a housekeeping pass folds the steps and feeds the ledger
        for rank, tracker in enumerate(trackers):
            assert tracker.metrics_url is not None
            out[f"rank{rank}"] = _scrape(tracker.metrics_url)
    finally:
        for tracker in trackers:
            tracker.close()
        os.environ.clear()
        os.environ.update(saved)
    (run_dir / "ckpt-20-rank0.pt").unlink()  # the sentinel finds one missing
    argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "8", "--port", "0"]
    argv += ["--port-file", str(tmp / "addr"), "--registry-dir", str(tmp / "empty-reg")]
    argv += ["--storage-path", str(storage), "--checkpoint-run-dir", str(run_dir)]
    argv += ["--storage-interval", "1", "--checkpoint-interval", "1"]
    argv += ["--simulate-kernel-log", str(tmp / "kern.log")]
    fabric = FakeSysfs(tmp / "sys", tmp / "proc")
    fabric.dgx(8, memory_controllers=2, packages=2, cores=4)
    argv += ["--path.sysfs", str(fabric.root), "--path.procfs", str(fabric.proc)]
    with (tmp / "agent.log").open("wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://{read_port_file(tmp / 'addr', timeout=60)}/metrics"

        def settled() -> Series | None:
            series = _scrape(url)
            names = {name for name, _ in series}
            return series if {"storage_probe_up", "checkpoint_missing_newest_step"} <= names else None

        wait_for(settled, timeout=30, interval=0.5)
        out["agent"] = _scrape(url)
    finally:
        agent.terminate()
        agent.wait(timeout=20)
    return out


def _per_gpu(series: Series) -> dict[str, int]:
    return collections.Counter(labels["gpu"] for _, labels in series if "gpu" in labels)


def test_a_rank_other_than_zero_stays_within_its_budget(scrapes: dict[str, Series]) -> None:
    """Rank 1 exports only what a per-rank view or a sum over ranks needs."""
    series = scrapes["rank1"]
    assert {labels.get("rank") for _, labels in series} == {"1"}
    assert len(series) <= BUDGET.rank, sorted(name for name, _ in series)
    assert len(series) == MEASURED.rank, "update catalog.budget.MEASURED and docs/metrics.md"


def test_rank_zero_stays_within_its_budget(scrapes: dict[str, Series]) -> None:
    """Rank 0 adds the run's view and its goodput and ledger series, and stays within 45."""
    series = scrapes["rank0"]
    names = {name for name, _ in series}
    assert {"train_goodput_ratio", "train_step", "train_loss"} <= names  # it is the full rank 0
    assert len(series) <= BUDGET.rank0, sorted(name for name, _ in series)
    assert len(series) == MEASURED.rank0, "update catalog.budget.MEASURED and docs/metrics.md"


def test_each_gpu_stays_within_its_budget(scrapes: dict[str, Series]) -> None:
    """Eight simulated GPUs, each within 35 series (the largest is counted)."""
    counts = _per_gpu(scrapes["agent"])
    assert len(counts) == 8
    assert max(counts.values()) <= BUDGET.gpu, counts
    assert max(counts.values()) == MEASURED.gpu, "update catalog.budget.MEASURED and docs/metrics.md"


_FABRIC = {spec.name for spec in F.METRICS}
_HOST_HARDWARE = {spec.name for spec in (F.EDAC_CORRECTABLE, F.EDAC_UNCORRECTABLE, F.CPU_CORE_THROTTLES)} | {
    F.CPU_PACKAGE_THROTTLES.name,
    F.KERNEL_LOG_EVENTS.name,
    F.SYSFS_PROBLEMS.name,
}


def _hardware(name: str, labels: dict[str, str]) -> bool:
    """A host-hardware series: EDAC, thermal, kernel-log patterns, and the sysfs collectors' own health."""
    return name in _HOST_HARDWARE or labels.get("collector") in SYSFS_COLLECTORS


def _by(series: Series, names: set[str], key: str) -> dict[str, int]:
    return collections.Counter(labels[key] for name, labels in series if name in names and key in labels)


def test_each_fabric_port_pcie_device_and_gpu_nic_stays_within_its_budget(scrapes: dict[str, Series]) -> None:
    """8 InfiniBand ports, 16 PCIe devices (8 GPUs, 8 NICs) and 8 GPUs' nearest NICs, the largest counted."""
    agent = scrapes["agent"]
    ports = collections.Counter(
        (labels["device"], labels["port"]) for name, labels in agent if name.startswith("infiniband_")
    )
    devices = _by(agent, {n for n in _FABRIC if n.startswith("pcie_")}, "pci_address")
    nics = _by(agent, {F.GPU_NIC.name}, "uuid")
    assert (len(ports), len(devices), len(nics)) == (8, 16, 8)
    assert max(ports.values()) <= BUDGET.fabric_port, ports
    assert max(devices.values()) <= BUDGET.pcie_device, devices
    assert max(nics.values()) <= BUDGET.gpu_nic, nics
    assert (max(ports.values()), max(devices.values()), max(nics.values())) == (
        MEASURED.fabric_port,
        MEASURED.pcie_device,
        MEASURED.gpu_nic,
    ), "update catalog.budget.MEASURED and docs/metrics.md"


def test_the_hosts_hardware_stays_within_its_budget(scrapes: dict[str, Series]) -> None:
    """EDAC (2 controllers), CPU thermal (2 packages), the kernel-log patterns, the sysfs collectors' health."""
    hardware = [(name, labels) for name, labels in scrapes["agent"] if _hardware(name, labels)]
    assert len(hardware) <= BUDGET.host_hardware, sorted(name for name, _ in hardware)
    assert len(hardware) == MEASURED.host_hardware, "update catalog.budget.MEASURED and docs/metrics.md"


def test_the_host_stays_within_its_budget(scrapes: dict[str, Series]) -> None:
    """The agent's own series, one storage path and one sentinel run, within 30."""
    host = [
        (name, labels)
        for name, labels in scrapes["agent"]
        if "gpu" not in labels and name not in _FABRIC and not _hardware(name, labels)
    ]
    assert not [s for s in host if "rank" in s[1]]  # no trainer registered with this agent
    assert {"storage_probe_up", "checkpoint_missing", "checkpoint_missing_newest_step"} <= {
        n for n, _ in host
    }
    assert len(host) <= BUDGET.host, sorted(name for name, _ in host)
    assert len(host) == MEASURED.host, "update catalog.budget.MEASURED and docs/metrics.md"
