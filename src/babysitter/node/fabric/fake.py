"""A fake sysfs (and procfs) tree with the kernel's real layout, for tests, benchmarks and demos.

Devices live under ``devices/pci<domain>:<bus>/<root port>/.../<address>`` with the files the
kernel has there; ``bus/pci/devices/<address>``, ``class/infiniband/<device>`` and
``class/net/<interface>`` are relative symlinks into that tree, and an RDMA device's ``device`` and
a netdev's ``device`` link back to their PCIe function, as on a real host (the layout of
prometheus/procfs' fixtures and of a DGX H100's ``/sys``). Values are written the kernel's way:
``4: ACTIVE``, ``400 Gb/sec (4X NDR)``, ``32.0 GT/s PCIe``, AER stats as ``<name> <count>`` lines
with their ``TOTAL_ERR_*`` line.

Files are rewritten in place (same inode, as sysfs attributes are), so a reader that keeps paths
sees the new value; :meth:`FakeSysfs.recreate` replaces a device directory the way a driver reload
does (new inodes, counters at 0).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FakeSysfs", "Host", "aer_text"]

#: Correctable AER names as kernels since 5.x print them, and as 4.19 did (spelled out).
_COR_NEW = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
_COR_OLD = (
    "Receiver Error",
    "Bad TLP",
    "Bad DLLP",
    "RELAY_NUM Rollover",
    "Replay Timer Timeout",
    "Advisory Non-Fatal",
    "Corrected Internal Error",
    "Header Log Overflow",
)
_UNCOR = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP")
_TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}
#: Every error counter of counters/ an mlx5 port has, with the data and packet counters.
IB_COUNTERS = (
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "VL15_dropped",
)
#: mlx5's hw_counters/ (a subset of the ~40 a ConnectX-7 has).
IB_HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "resp_cqe_error",
    "rnr_nak_retry_err",
    "roce_slow_restart",
    "rp_cnp_handled",
    "rp_cnp_ignored",
)


def aer_text(severity: str, count: int, *, old_names: bool = False) -> str:
    """An ``aer_dev_<severity>`` file: one ``<name> <count>`` line per error type, then the total
    (``count`` on the first type). ``old_names``: 4.19's spelled-out correctable names."""
    names = (_COR_OLD if old_names else _COR_NEW) if severity == "correctable" else _UNCOR
    lines = [f"{name} {count if i == 0 else 0}" for i, name in enumerate(names)]
    lines.append(f"{_TOTALS[severity]} {count}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Host:
    """What :meth:`FakeSysfs.dgx` built: the GPUs' and NICs' PCIe addresses, RDMA devices, netdevs."""

    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    rdma: tuple[str, ...]
    netdevs: tuple[str, ...]


class FakeSysfs:
    """Builds a sysfs tree at ``root`` (and a procfs at ``proc``) one device at a time."""

    def __init__(self, root: Path, proc: Path | None = None) -> None:
        self.root = Path(root)
        self.proc = Path(proc) if proc is not None else self.root.parent / "proc"
        self._dirs: dict[str, Path] = {}
        for sub in ("devices", "bus/pci/devices", "class/infiniband", "class/net"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.proc.mkdir(parents=True, exist_ok=True)

    # --- files ----------------------------------------------------------------------------------------
    def write(self, path: Path | str, value: object) -> None:
        """Write ``value`` and a newline, in place (same inode, as sysfs attributes keep theirs)."""
        target = Path(path) if Path(path).is_absolute() else self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a+") as fh:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{value}\n" if not str(value).endswith("\n") else str(value))

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(target, link.parent))

    def device_dir(self, address: str) -> Path:
        """Where a PCIe function's directory is (under ``devices/pci...``)."""
        return self._dirs[address]

    # --- PCIe -------------------------------------------------------------------------------------------
    def pci(
        self,
        address: str,
        *,
        parent: str | None = None,
        class_code: int = 0x060400,
        vendor: int = 0x8086,
        device: int = 0x0001,
        width: int | None = 16,
        max_width: int | None = 16,
        speed: str | None = "32.0 GT/s PCIe",
        max_speed: str | None = "32.0 GT/s PCIe",
        numa_node: int = 0,
        driver: str | None = None,
        aer: Mapping[str, int] | None = None,
    ) -> Path:
        """A PCIe function: under ``parent`` (a bridge made before) or on its domain's host bridge."""
        if parent is None:
            domain, bus = address.split(":")[:2]
            base = self.root / "devices" / f"pci{domain}:{bus}"
        else:
            base = self._dirs[parent]
        here = base / address
        here.mkdir(parents=True, exist_ok=True)
        self._dirs[address] = here
        self.write(here / "class", f"0x{class_code:06x}")
        self.write(here / "vendor", f"0x{vendor:04x}")
        self.write(here / "device", f"0x{device:04x}")
        self.write(here / "numa_node", numa_node)
        for name, value in (
            ("current_link_width", width),
            ("max_link_width", max_width),
            ("current_link_speed", speed),
            ("max_link_speed", max_speed),
        ):
            if value is not None:
                self.write(here / name, value)
        for severity, name in _FILES.items():
            self.write(here / name, aer_text(severity, (aer or {}).get(severity, 0)))
        if driver is not None:
            drivers = self.root / "bus/pci/drivers" / driver
            drivers.mkdir(parents=True, exist_ok=True)
            self._link(here / "driver", drivers)
        self._link(self.root / "bus/pci/devices" / address, here)
        return here

    def aer(self, address: str, severity: str, count: int, *, old_names: bool = False) -> None:
        """Set a function's AER count of ``severity`` (correctable, nonfatal, fatal)."""
        self.write(self._dirs[address] / _FILES[severity], aer_text(severity, count, old_names=old_names))

    def link(self, address: str, *, width: int | None = None, speed: str | None = None) -> None:
        """Retrain a link: its current width and/or speed."""
        if width is not None:
            self.write(self._dirs[address] / "current_link_width", width)
        if speed is not None:
            self.write(self._dirs[address] / "current_link_speed", speed)

    # --- RDMA and netdevs --------------------------------------------------------------------------------
    def rdma(
        self,
        name: str,
        nic: str,
        *,
        ports: int = 1,
        link_layer: str = "InfiniBand",
        rate: str = "400 Gb/sec (4X NDR)",
        counters: bool = True,
        hw_counters: bool = True,
        fw: str = "28.39.1002",
    ) -> Path:
        """An RDMA device on NIC function ``nic``: ``infiniband/<name>`` with its ports, all counters 0."""
        top = self._dirs[nic] / "infiniband" / name
        top.mkdir(parents=True, exist_ok=True)
        self._link(top / "device", self._dirs[nic])
        self.write(top / "fw_ver", fw)
        self.write(top / "node_type", "1: CA")
        for port in range(1, ports + 1):
            base = top / "ports" / str(port)
            self.write(base / "state", "4: ACTIVE")
            self.write(base / "phys_state", "5: LinkUp")
            self.write(base / "rate", rate)
            self.write(base / "link_layer", link_layer)
            if counters:
                for counter in IB_COUNTERS:
                    self.write(base / "counters" / counter, 0)
            if hw_counters:
                for counter in IB_HW_COUNTERS:
                    self.write(base / "hw_counters" / counter, 10 if counter == "lifespan" else 0)
        self._link(self.root / "class/infiniband" / name, top)
        return top

    def port_dir(self, name: str, port: int = 1) -> Path:
        """``class/infiniband/<name>/ports/<port>``, resolved."""
        return (self.root / "class/infiniband" / name).resolve() / "ports" / str(port)

    def counter(self, name: str, counter: str, value: object, *, port: int = 1, hw: bool = False) -> None:
        """Set a port counter (``hw``: in hw_counters/)."""
        self.write(self.port_dir(name, port) / ("hw_counters" if hw else "counters") / counter, value)

    def port_state(self, name: str, state: str, phys_state: str, *, port: int = 1) -> None:
        """Set a port's ``state`` (``1: DOWN``) and ``phys_state`` (``3: Disabled``)."""
        self.write(self.port_dir(name, port) / "state", state)
        self.write(self.port_dir(name, port) / "phys_state", phys_state)

    def recreate(self, name: str) -> None:
        """A driver reload: the RDMA device's directory is made anew, every counter back at 0."""
        top = (self.root / "class/infiniband" / name).resolve()
        nic = top.parent.parent.name
        fw = (top / "fw_ver").read_text().strip()
        ports = sorted(int(p.name) for p in (top / "ports").iterdir())
        layer = (top / "ports" / str(ports[0]) / "link_layer").read_text().strip()
        rate = (top / "ports" / str(ports[0]) / "rate").read_text().strip()
        hw = (top / "ports" / str(ports[0]) / "hw_counters").is_dir()
        counters = (top / "ports" / str(ports[0]) / "counters").is_dir()
        moved = top.with_name(f".{name}.old")
        top.rename(moved)  # keep the old inodes alive while the new ones are made: they must differ
        self.rdma(
            name, nic, ports=len(ports), link_layer=layer, rate=rate, counters=counters, hw_counters=hw, fw=fw
        )
        shutil.rmtree(moved)

    def netdev(self, interface: str, nic: str, *, dev_port: int = 0, carrier_changes: int = 2) -> None:
        """A netdev of NIC function ``nic`` (``net/<interface>``), linked from ``class/net``."""
        here = self._dirs[nic] / "net" / interface
        here.mkdir(parents=True, exist_ok=True)
        self._link(here / "device", self._dirs[nic])
        self.write(here / "dev_port", dev_port)
        self.write(here / "carrier_changes", carrier_changes)
        self.write(here / "operstate", "up")
        self._link(self.root / "class/net" / interface, here)

    def carrier(self, interface: str, changes: int) -> None:
        """Set a netdev's ``carrier_changes``."""
        self.write((self.root / "class/net" / interface).resolve() / "carrier_changes", changes)

    # --- host ---------------------------------------------------------------------------------------------
    def edac(self, controller: int, *, ce: int = 0, ue: int = 0) -> None:
        """A memory controller (``devices/system/edac/mc/mc<N>``) with its error counts."""
        base = self.root / "devices/system/edac/mc" / f"mc{controller}"
        self.write(base / "ce_count", ce)
        self.write(base / "ue_count", ue)
        self.write(base / "ce_noinfo_count", 0)
        self.write(base / "ue_noinfo_count", 0)
        self.write(base / "mc_name", "Intel_10nm")

    def cpu(
        self, number: int, *, package: int, core: int, core_throttles: int = 0, package_throttles: int = 0
    ) -> None:
        """A logical CPU with its topology and thermal throttle counts."""
        base = self.root / "devices/system/cpu" / f"cpu{number}"
        self.write(base / "topology/physical_package_id", package)
        self.write(base / "topology/core_id", core)
        self.write(base / "thermal_throttle/core_throttle_count", core_throttles)
        self.write(base / "thermal_throttle/package_throttle_count", package_throttles)

    def nvidia_gpu(self, address: str, uuid: str) -> None:
        """The driver's ``/proc/driver/nvidia/gpus/<address>/information`` with the GPU's UUID."""
        self.write(
            self.proc / "driver/nvidia/gpus" / address / "information",
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 132\nGPU UUID: \t {uuid}\n"
            f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nBus Location: \t {address}\n",
        )

    # --- a whole host -------------------------------------------------------------------------------------
    def dgx(
        self,
        gpus: int = 8,
        *,
        uuids: tuple[str, ...] = (),
        link_layer: str = "InfiniBand",
        memory_controllers: int = 2,
        packages: int = 2,
        cores: int = 4,
    ) -> Host:
        """An HGX-like host: each GPU and its NIC under one PCIe switch, two such pairs under a second
        switch on each host bridge, half the GPUs on each NUMA node; GPU ``i`` at bus ``0x18 + 0x10 i``
        (the simulator's GPUs), NIC ``i`` next to it as ``mlx5_<i>`` with netdev ``ibp<i>s0``."""
        gpu_at, nic_at, rdma, nets = [], [], [], []
        for i in range(gpus):
            bus = 0x18 + 0x10 * i
            host = 0x10 + 0x20 * (i // 2)
            node = i * 2 // max(gpus, 1)
            root, up = f"0000:{host:02x}:01.0", f"0000:{host + 1:02x}:00.0"
            if i % 2 == 0:
                self.pci(root, numa_node=node)
                self.pci(up, parent=root, numa_node=node)
            down = f"0000:{host + 2:02x}:{i % 2:02x}.0"
            self.pci(down, parent=up, numa_node=node)
            switch = f"0000:{bus - 2:02x}:00.0"
            self.pci(switch, parent=down, numa_node=node)
            to_gpu, to_nic = f"0000:{bus - 1:02x}:00.0", f"0000:{bus - 1:02x}:01.0"
            self.pci(to_gpu, parent=switch, numa_node=node)
            self.pci(to_nic, parent=switch, numa_node=node)
            gpu, nic = f"0000:{bus:02x}:00.0", f"0000:{bus + 1:02x}:00.0"
            self.pci(
                gpu,
                parent=to_gpu,
                class_code=0x030200,
                vendor=0x10DE,
                device=0x2330,
                numa_node=node,
                driver="nvidia",
            )
            self.pci(
                nic,
                parent=to_nic,
                class_code=0x020700 if link_layer == "InfiniBand" else 0x020000,
                vendor=0x15B3,
                device=0x1021,
                numa_node=node,
                driver="mlx5_core",
            )
            name, interface = f"mlx5_{i}", f"ibp{bus + 1}s0" if link_layer == "InfiniBand" else f"ens{i}np0"
            self.rdma(name, nic, link_layer=link_layer)
            self.netdev(interface, nic)
            if i < len(uuids):
                self.nvidia_gpu(gpu, uuids[i])
            gpu_at.append(gpu)
            nic_at.append(nic)
            rdma.append(name)
            nets.append(interface)
        for mc in range(memory_controllers):
            self.edac(mc)
        cpu = 0
        for package in range(packages):
            for core in range(cores):
                for _thread in range(2):
                    self.cpu(cpu, package=package, core=core)
                    cpu += 1
        return Host(tuple(gpu_at), tuple(nic_at), tuple(rdma), tuple(nets))
