"""The series budget: how many series one process, GPU or host may export with the default collectors.

At 16,384 GPUs (2,048 hosts of 8) the budget bounds the whole fleet: about 1.1 million active
series at most, inside what one Mimir, Thanos or VictoriaMetrics tier ingests. Per-rack Prometheus
agents size their ``sample_limit`` from it (:func:`per_node`), and ``tests/test_series_budget.py``
scrapes real exporters and fails when a count goes over.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUDGET", "CAPS", "MEASURED", "HardwareCaps", "Measured", "SeriesBudget", "per_node"]


@dataclass(frozen=True)
class SeriesBudget:
    """Upper bounds on exported series (samples per scrape), by what exports them."""

    #: A training process other than rank 0.
    rank: int = 25
    #: Rank 0: its per-rank series plus the run's (goodput and the ledger's health live there; the
    #: slowdown cause, the ideal step time, the step-time deviation and rolling goodput: 52 with them).
    rank0: int = 52
    #: One GPU, as the node agent exports it (series carrying its ``gpu`` label).
    gpu: int = 35
    #: A host's own series: the node agent's health, storage probe and checkpoint sentinel.
    host: int = 30
    #: Every training process of one host together, as its node agent re-serves them: a hard bound
    #: the agent enforces per scrape, shared fairly between the host's users (docs/security.md).
    trainers: int = 2048
    #: One InfiniBand/RoCE port with the default counters (catalog/fabric.py): state, physical state,
    #: rate, info, 8 error counters, transmit wait, 5 driver counters, bytes and packets each way, and its
    #: netdev's carrier changes. ``--fabric-all-counters`` adds about 40 more.
    fabric_port: int = 24
    #: One watched PCIe device (a GPU or a NIC function): width and speed now and at most, AER by
    #: severity, info.
    pcie_device: int = 8
    #: The nearest-NIC info of one GPU (one series per equally near port, at most 4).
    gpu_nic: int = 4
    #: The host's hardware: EDAC per memory controller, CPU thermal per package, the kernel-log patterns,
    #: and the sysfs collectors' own success and duration.
    host_hardware: int = 60


BUDGET = SeriesBudget()


@dataclass(frozen=True)
class HardwareCaps:
    """How many of each thing the sysfs collectors watch at most: the per-item budgets above times
    these bound a host's hardware series whatever its sysfs holds (docs/fabric.md). What a scan finds
    beyond a cap is not watched, shown in ``babysitter_sysfs_items_dropped{collector,kind}`` and
    logged once. Each is several times what a training host has (an HGX: 8-10 RDMA devices, 16-20
    ports, 20 GPUs and NICs, 2 x 112 CPUs, 8-24 memory controllers)."""

    #: RDMA devices (``class/infiniband/<device>``), SR-IOV virtual functions not counted (skipped).
    rdma_device: int = 64
    #: InfiniBand/RoCE ports, all devices together.
    port: int = 64
    #: Counter files read per port directory (``counters/``, ``hw_counters/``): only reached with
    #: ``--fabric-all-counters`` (mlx5 has about 20 and 40).
    counter: int = 128
    #: Watched PCIe functions (GPUs and physical NICs).
    pcie_device: int = 64
    #: Logical CPUs whose thermal throttle counts are read (one file per physical core a scrape).
    cpu: int = 1024
    #: CPU packages (the thermal series are per package).
    package: int = 16
    #: EDAC memory controllers (``devices/system/edac/mc/mc<N>``), in number order.
    memory_controller: int = 64


CAPS = HardwareCaps()


@dataclass(frozen=True)
class Measured:
    """Series counts of the real exporters in the budget test's scenario (docs/metrics.md shows them).

    ``tests/test_series_budget.py`` fails when a count differs from what it measures, so these are
    never stale; ``*_before`` are the same test run against the code before the budget (16f5ca2).
    """

    rank: int
    rank0: int
    gpu: int
    host: int
    fabric_port: int = 0
    pcie_device: int = 0
    gpu_nic: int = 0
    host_hardware: int = 0
    rank_before: int = 66
    rank0_before: int = 83
    gpu_before: int = 34
    host_before: int = 36


#: Rank 0's 48 include the slowdown cause and the rolling goodput; its 20 steps (checkpoints every 5)
#: hold too few plain steps for an ideal step time, whose two gauges the budget's 52 leaves room for.
MEASURED = Measured(
    rank=19, rank0=49, gpu=30, host=30, fabric_port=23, pcie_device=8, gpu_nic=1, host_hardware=25
)


def per_node(
    gpus: int = 8,
    ranks: int = 8,
    budget: SeriesBudget = BUDGET,
    *,
    ports: int = 8,
    pcie_devices: int | None = None,
) -> int:
    """Series one node agent target may serve: the host, its GPUs, its ranks (one of them rank 0), and
    its fabric: ``ports`` InfiniBand/RoCE ports and ``pcie_devices`` watched PCIe devices (by default
    every GPU and one NIC function per port)."""
    devices = gpus + ports if pcie_devices is None else pcie_devices
    if min(gpus, ranks, ports, devices) < 0:
        raise ValueError("gpus, ranks, ports and pcie_devices must not be negative")
    rank0 = budget.rank0 if ranks else 0
    fabric = ports * budget.fabric_port + devices * budget.pcie_device + gpus * budget.gpu_nic
    return (
        budget.host
        + gpus * budget.gpu
        + max(ranks - 1, 0) * budget.rank
        + rank0
        + fabric
        + budget.host_hardware
    )
