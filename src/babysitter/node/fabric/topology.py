"""Which NIC port each GPU uses: ``fabric_gpu_nic_info``, the series that ties a rank to its fabric.

A rank names its GPU's UUID in ``train_info`` (docs/rank-gpu.md); this info series names, for each GPU
UUID, the RDMA port(s) nearest to it in the PCIe tree (:func:`babysitter.node.fabric.pci.nearest`: the
deepest bridge both are under). NCCL picks a GPU's NIC the same way (its topology search prefers the
NIC under the GPU's PCIe switch), so on a rail-optimized host the nearest port is the one the rank's
traffic leaves by, and its errors and flaps are the rank's. Several equally near ports each get a
series, numbered by ``nic_index`` so that the recording rules can join them one at a time.

The UUID comes from the agent's GPU collector (NVML), or without one (dcgm-exporter hosts) from the
NVIDIA driver's ``<procfs>/driver/nvidia/gpus/<address>/information``. A GPU with neither has no series.
The tree is read again every ``rescan_seconds``: devices do not move, they come and go.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.labels import normalize_pci_bus_id
from babysitter.node.collector import GpuIdentity
from babysitter.node.fabric.pci import Inventory, nearest
from babysitter.node.sysfs import Sample, SysfsReader, to_families

__all__ = ["MAX_NICS_PER_GPU", "TopologyCollector"]

log = logging.getLogger(__name__)

#: Equally near ports exported per GPU (a GPU between two dual-port cards has 4); the rest are logged.
MAX_NICS_PER_GPU = 4
_UUID = re.compile(r"^GPU UUID:\s*(GPU-[0-9a-fA-F-]{8,64})\s*$", re.MULTILINE)


class TopologyCollector:
    """The ``topology`` collector: one ``fabric_gpu_nic_info`` per GPU and nearest RDMA port."""

    name = "topology"

    def __init__(
        self,
        sysfs: str | os.PathLike[str] = "/sys",
        *,
        procfs: str | os.PathLike[str] = "/proc",
        gpus: Callable[[], Sequence[GpuIdentity]] = list,
        rescan_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Read once a rescan, not every scrape: nothing to keep open.
        self._reader = SysfsReader(os.fspath(sysfs), self.name, keep_open=False)
        self._proc = SysfsReader(os.fspath(procfs), self.name, keep_open=False)
        self._inventory = Inventory(self._reader, rescan_seconds=rescan_seconds, clock=clock)
        self._gpus = gpus
        self._pairs: list[tuple[str, str, tuple[str, ...]]] = []  # (bus id, address, labels after uuid)
        self._driver_uuids: dict[str, str] = {}
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Nothing to release."""

    def _rescan(self) -> None:
        self._pairs = []
        self._driver_uuids = {}
        ports = self._inventory.ports
        for gpu in self._inventory.devices:
            if gpu.kind != "gpu":
                continue
            best = nearest(gpu, ports)
            if len(best) > MAX_NICS_PER_GPU and gpu.address not in self._logged:
                self._logged.add(gpu.address)
                names = ", ".join(f"{p.device}/{p.port}" for p, _ in best)
                log.warning(
                    "babysitter: GPU %s has %d equally near RDMA ports (%s); the first %d are exported",
                    gpu.address,
                    len(best),
                    names,
                    MAX_NICS_PER_GPU,
                )
            for index, (port, link) in enumerate(best[:MAX_NICS_PER_GPU]):
                nic = port.pci.address if port.pci is not None else ""
                self._pairs.append(
                    (gpu.pci_bus_id, gpu.address, (port.device, port.port, nic, link, str(index)))
                )
            info = self._proc.text(f"driver/nvidia/gpus/{gpu.address}/information", listed=False)
            match = _UUID.search(info) if info else None
            if match:
                self._driver_uuids[gpu.pci_bus_id] = match.group(1).lower().replace("gpu-", "GPU-", 1)

    def _uuids(self) -> dict[str, str]:
        """Bus id -> UUID: the GPU collector's, else the driver's procfs file's."""
        found = dict(self._driver_uuids)
        try:
            identities = list(self._gpus())
        except Exception:  # the GPU collector's problem, reported by it
            identities = []
        for gpu in identities:
            try:
                found[normalize_pci_bus_id(gpu.pci_bus_id)] = gpu.uuid
            except ValueError:
                continue
        return found

    def collect(self) -> Iterable[Metric]:
        """The GPU-to-NIC pairs (from the tree read every rescan interval)."""
        with self._lock:
            if self._inventory.refresh():
                self._rescan()
            uuids = self._uuids()
            samples: list[Sample] = []
            for bus, address, rest in self._pairs:
                uuid = uuids.get(bus)
                if uuid:
                    samples.append((F.GPU_NIC, (uuid, bus, address, *rest), 1.0))
            families = to_families(samples)
            families.extend(self._reader.families())
            return families
