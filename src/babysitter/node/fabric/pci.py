"""The host's PCIe devices as sysfs lays them out: which are GPUs and NICs, where each sits in the tree.

``bus/pci/devices/<bdf>`` links to ``devices/pci<domain>:<bus>/<root port>/.../<bdf>``: the path
names every bridge between the host bridge and the device, so two devices' paths tell how close they
are (the deepest bridge both are under), which is what :func:`nearest` uses to pair each GPU with
its NIC, in the vocabulary of ``nvidia-smi topo -m``:

- ``PIX``: both under one PCIe switch (at most one switch between them);
- ``PXB``: under a common bridge, through several switches, without the host bridge;
- ``PHB``: only the host bridge (root complex) in common;
- ``NODE``: different host bridges, same NUMA node;
- ``SYS``: different NUMA nodes (the traffic crosses the CPU interconnect).

Kinds come from the PCI class code: ``0x0302`` (3D controller) and ``0x0300`` (VGA) of NVIDIA or AMD
are GPUs (a BMC's VGA is not), ``0x0200`` (Ethernet) and ``0x0207`` (InfiniBand) are NICs, SR-IOV
virtual functions (a ``physfn`` link) left out, of the NICs and of the RDMA devices alike. Scanning
lists and reads a few hundred files, so collectors keep the result and scan again every
``rescan_seconds`` (:class:`Inventory`). At most 64 devices and 64 RDMA ports
(:data:`~babysitter.catalog.budget.CAPS`); more are shown in ``babysitter_sysfs_items_dropped``.
A GPU's or NIC's files are read from where its ``bus/pci/devices`` link leads (below the root).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from babysitter.catalog.budget import CAPS
from babysitter.node.sysfs import Rescan, SysfsReader

__all__ = ["LINKS", "Inventory", "PciDevice", "RdmaPort", "nearest", "scan_pci", "scan_rdma"]

BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
#: Closeness of two PCIe devices, nearest first (nvidia-smi topo -m's names).
LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_GPU_VENDORS = (0x10DE, 0x1002)  # NVIDIA, AMD: a VGA-class device of another vendor is a BMC's display
_NUMA = re.compile(r"-?[0-9]{1,4}")
_PORT = re.compile(r"[0-9]{1,3}")


@dataclass(frozen=True)
class PciDevice:
    """One watched PCIe function."""

    address: str  # 0000:9b:00.0
    kind: str  # gpu | nic
    path: str  # resolved sysfs path (devices/pci.../<address>)
    chain: tuple[str, ...]  # host bridge, bridges..., the device itself
    vendor: int
    device: int
    numa_node: int
    upstream: str  # the bridge its link goes to ("" for a device on the host bridge)

    @property
    def pci_bus_id(self) -> str:
        """``domain:bus:device`` as the GPU series spell it (``0000:9b:00``)."""
        return self.address.rsplit(".", 1)[0]


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device (``class/infiniband/<device>/ports/<port>``)."""

    device: str
    port: str
    pci: PciDevice | None  # the NIC function the device belongs to, when it is a PCIe device


def _kind(reader: SysfsReader, base: str) -> tuple[str, int] | None:
    """(gpu or nic, vendor id) by the PCI class of the function at ``base``; None for anything else.
    Read through the ``bus/pci/devices`` link (two bounded hex numbers: nothing served as it is), so
    that only the few GPUs and NICs are resolved (a host has a hundred bridges and other functions)."""
    klass = _id(reader, f"{base}/class", 0xFFFFFF)
    vendor = _id(reader, f"{base}/vendor", 0xFFFF)
    if klass is None or vendor is None:
        return None
    sub = klass >> 8
    if sub == 0x0302 or (sub == 0x0300 and vendor in _GPU_VENDORS):
        return "gpu", vendor
    if sub in (0x0200, 0x0207):
        return "nic", vendor
    return None


def _id(reader: SysfsReader, path: str, most: int) -> int | None:
    """A hex id (``0x10de``) no larger than ``most``: the pcie_device_info labels are written from it."""
    value = reader.integer(path, base=16)
    if value is not None and value > most:
        reader.problem(path, "garbage", f"0x{value:x}"[:40])
        return None
    return value


def _chain(reader: SysfsReader, resolved: str) -> tuple[str, ...]:
    """The host bridge and the bridges down to the device, from its resolved path."""
    parts = os.path.relpath(resolved, reader.path("devices")).split(os.sep)
    chain = [p for p in parts if BDF.match(p) or _HOST_BRIDGE.match(p)]
    return tuple(chain)


def scan_pci(reader: SysfsReader) -> list[PciDevice]:
    """The GPUs and NICs under ``bus/pci/devices`` (at most CAPS.pcie_device), in address order."""
    found: list[PciDevice] = []
    more = 0
    for address in reader.listdir("bus/pci/devices"):
        if not BDF.match(address):
            continue
        kind = _kind(reader, f"bus/pci/devices/{address}")
        if kind is None:
            continue
        resolved = reader.resolve(f"bus/pci/devices/{address}")
        if resolved is None or os.path.basename(resolved) != address:
            continue
        if kind[0] == "nic" and reader.exists(f"{resolved}/physfn"):
            continue  # an SR-IOV virtual function: its physical function is watched
        if len(found) >= CAPS.pcie_device:
            more += 1
            continue
        chain = _chain(reader, resolved)
        numa = reader.text(f"{resolved}/numa_node", listed=False)
        parent = chain[-2] if len(chain) >= 2 and BDF.match(chain[-2]) else ""
        found.append(
            PciDevice(
                address=address,
                kind=kind[0],
                path=resolved,
                chain=chain,
                vendor=kind[1],
                device=_id(reader, f"{resolved}/device", 0xFFFF) or 0,
                numa_node=int(numa) if numa is not None and _NUMA.fullmatch(numa) else -1,
                upstream=parent,
            )
        )
    reader.dropped("pcie_device", more, CAPS.pcie_device)
    return found


def scan_rdma(reader: SysfsReader, devices: Sequence[PciDevice]) -> list[RdmaPort]:
    """Every port of every device under ``class/infiniband`` (at most CAPS.port), with its PCIe
    function; the devices of SR-IOV virtual functions left out."""
    by_path = {d.path: d for d in devices}
    ports: list[RdmaPort] = []
    for name in reader.listdir("class/infiniband"):
        top = reader.resolve(f"class/infiniband/{name}")
        if top is None or reader.real(top, "ports") is None:
            continue
        resolved = reader.resolve(f"{top}/device")
        pci = by_path.get(resolved or "")
        if pci is None and resolved is not None and BDF.match(os.path.basename(resolved)):
            if reader.exists(f"{resolved}/physfn"):
                continue  # a virtual function's device: the physical function's are the host's
            chain = _chain(reader, resolved)
            address = os.path.basename(resolved)
            pci = PciDevice(address, "nic", resolved, chain, 0, 0, -1, "")
        names = reader.listdir(f"{top}/ports")
        ports.extend(RdmaPort(name, port, pci) for port in names if _PORT.fullmatch(port))
    return list(reader.bound("port", ports, CAPS.port))


def _link(a: PciDevice, b: PciDevice) -> tuple[int, int]:
    """(index in LINKS, depth of the deepest common bridge) of two devices."""
    common = 0
    for x, y in zip(a.chain, b.chain, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        same_node = a.numa_node == b.numa_node  # -1 on both: no NUMA, one node
        return (LINKS.index("NODE") if same_node else LINKS.index("SYS")), 0
    if common == 1:
        return LINKS.index("PHB"), common
    below = max(len(a.chain), len(b.chain)) - common
    return (LINKS.index("PIX") if below <= 2 else LINKS.index("PXB")), common


def nearest(gpu: PciDevice, ports: Sequence[RdmaPort]) -> list[tuple[RdmaPort, str]]:
    """The RDMA ports nearest to ``gpu`` (every one equally near), each with its link name."""
    scored = [(_link(gpu, p.pci), p) for p in ports if p.pci is not None]
    if not scored:
        return []
    best = min((link, -depth) for (link, depth), _ in scored)
    return sorted(
        ((p, LINKS[link]) for (link, depth), p in scored if (link, -depth) == best),
        key=lambda item: (item[0].device, int(item[0].port)),
    )


class Inventory:
    """The PCIe devices and RDMA ports (unless ``ports`` is off), scanned again every ``rescan_seconds``
    (or when asked)."""

    def __init__(
        self,
        reader: SysfsReader,
        *,
        rescan_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        ports: bool = True,
    ) -> None:
        self._reader = reader
        self._want_ports = ports
        self._rescan = Rescan(rescan_seconds, clock)
        self.devices: list[PciDevice] = []
        self.ports: list[RdmaPort] = []
        self.scans = 0

    def refresh(self, *, force: bool = False) -> bool:
        """Scan again when due (or ``force``); True when it did."""
        if force:
            self._rescan.soon()
        if not self._rescan.due():
            return False
        self.devices = scan_pci(self._reader)
        if self._want_ports:
            self.ports = scan_rdma(self._reader, self.devices)
        self.scans += 1
        return True
