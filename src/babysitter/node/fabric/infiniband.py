"""InfiniBand and RoCE ports from ``class/infiniband``: state, rate, error and data counters, flaps.

Per device and port (``class/infiniband/<device>/ports/<port>/``, as prometheus/procfs reads it):
``state`` (``4: ACTIVE``), ``phys_state`` (``5: LinkUp``), ``rate`` (``400 Gb/sec (4X NDR)``),
``link_layer``; the error counters of ``counters/`` (:data:`~babysitter.catalog.fabric.DEFAULT_PORT_ERRORS`)
and the driver's ``hw_counters/`` (mlx5, irdma; :data:`~babysitter.catalog.fabric.DEFAULT_HW_COUNTERS`),
every file of both with ``all_counters``; data in bytes (the kernel's ``port_*_data`` count 4-byte
words) and packets; and the carrier changes of the port's netdev (RoCE Ethernet, IPoIB), from the
NIC's ``net/<interface>`` whose ``dev_port`` is the port's.

What drivers do differently is normal, not an error: Broadcom's bnxt_re has no ``counters/``, Intel's
irdma only ``hw_counters/``, a software device (rxe) no PCIe function; each exports what it has. A
counter that reads ``N/A (no PMA)`` is absent and counted ``unavailable`` once. A driver reload
resets every counter: :class:`~babysitter.node.sysfs.Counters` keeps the exported ones monotonic
(the port directory's inode tells a recreated device even when its counters are already higher).

Which devices, ports and counter files exist is scanned again every ``rescan_seconds`` (and at the
next scrape after a file vanished): at each scrape only the values are read, about 22 files per port.

Bounded whatever the tree holds (:data:`~babysitter.catalog.budget.CAPS`): at most 64 RDMA devices and
64 ports, 128 counter files per directory; the devices of SR-IOV virtual functions (their PCIe function
has a ``physfn`` link) are skipped, as :mod:`~babysitter.node.fabric.pci` skips them: their physical
function's ports are the host's, a virtual function's belong to whoever it is passed to. Only the
links of the layout are followed (``class/infiniband/<device>`` and its ``device``, both resolved
below the root); ``ports/<port>``, ``counters``, ``hw_counters`` and ``net/<interface>`` must be
directories, not links. The info series' label values are served only when they are what the kernel
writes: ``link_layer`` one of its three words, ``fw_ver`` a version of digits and dots (else ""
and counted ``garbage``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.catalog._spec import MetricSpec
from babysitter.catalog.budget import CAPS
from babysitter.node.sysfs import Counters, Rescan, Sample, SysfsReader, to_families

__all__ = ["InfinibandCollector", "parse_firmware", "parse_link_layer", "parse_rate", "parse_state"]

_DATA = (("port_rcv_data", "receive"), ("port_xmit_data", "transmit"))
_PACKETS = (("port_rcv_packets", "receive"), ("port_xmit_packets", "transmit"))
_OTHER_KNOWN = {"port_xmit_wait", *(n for n, _ in _DATA), *(n for n, _ in _PACKETS)}
#: What drivers write in ``fw_ver`` (mlx5 ``28.39.1002``, bnxt_re and efa four numbers, irdma two).
_FIRMWARE = re.compile(r"[0-9]{1,10}(?:\.[0-9]{1,10}){0,5}")
#: What the kernel writes in ``link_layer`` (drivers/infiniband/core/sysfs.c).
_LINK_LAYERS = frozenset(("InfiniBand", "Ethernet", "Unknown"))
_PORT = re.compile(r"[0-9]{1,3}")


def parse_state(text: str) -> int | None:
    """``4: ACTIVE`` -> 4; None when the text is not ``<number>: <name>``."""
    number, sep, _ = text.partition(":")
    number = number.strip()
    return int(number) if sep and number.isascii() and number.isdigit() and len(number) <= 3 else None


def parse_firmware(text: str) -> str | None:
    """``28.39.1002`` as it is; None for anything but numbers and dots (at most 6 of at most 10 digits)."""
    return text if _FIRMWARE.fullmatch(text) else None


def parse_link_layer(text: str) -> str | None:
    """``InfiniBand``, ``Ethernet`` or ``Unknown`` as they are; None for anything else."""
    return text if text in _LINK_LAYERS else None


def parse_rate(text: str) -> float | None:
    """``400 Gb/sec (4X NDR)`` -> bytes per second (5e10); None for anything else."""
    head, _, unit = text.partition(" ")
    if not unit.startswith("Gb/sec"):
        return None
    try:
        gbits = float(head)
    except ValueError:
        return None
    return gbits * 1e9 / 8 if gbits >= 0 else None


@dataclass
class _Port:
    device: str
    port: str
    base: str  # .../ports/<port>, resolved
    link_layer: str
    pci_address: str
    interface: str
    fw_version: str
    carrier: str  # the netdev's carrier_changes, "" when the port has none
    errors: list[tuple[str, str]] = field(default_factory=list)  # (counter, file)
    others: list[tuple[str, str]] = field(default_factory=list)
    hw: list[tuple[str, str]] = field(default_factory=list)
    wait: str = ""
    data: list[tuple[str, str]] = field(default_factory=list)  # (direction, file)
    packets: list[tuple[str, str]] = field(default_factory=list)
    #: Every counter read at a scrape: (entry, label values, file, scale), made once by _plan.
    reads: list[tuple[MetricSpec, tuple[str, ...], str, int]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # the files of ``reads``, in order
    keys: list[tuple[str, ...]] = field(default_factory=list)  # their counters' keys (Counters)


class InfinibandCollector:
    """The ``infiniband`` collector over ``<sysfs>/class/infiniband`` (see the module docstring)."""

    name = "infiniband"

    def __init__(
        self,
        sysfs: str | os.PathLike[str] = "/sys",
        *,
        all_counters: bool = False,
        rescan_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = SysfsReader(os.fspath(sysfs), self.name)
        self._all = all_counters
        self._rescan = Rescan(rescan_seconds, clock)
        self._ports: list[_Port] = []
        self._counters = Counters("InfiniBand")
        self._lock = threading.Lock()
        self._over = 0  # counter files beyond the cap in the scan under way
        self.scans = 0

    def close(self) -> None:
        """Close the files kept open (after a collection in flight: its reads use them)."""
        with self._lock:
            self._reader.close()

    # --- discovery ----------------------------------------------------------------------------------
    def _scan(self) -> None:
        r = self._reader
        devices: list[tuple[str, str, str | None]] = []  # (name, directory, its PCIe function)
        for device in r.listdir("class/infiniband"):
            top = r.resolve(f"class/infiniband/{device}")
            if top is None:
                continue
            nic = r.resolve(f"{top}/device")
            if nic is not None and r.exists(f"{nic}/physfn"):
                continue  # an SR-IOV virtual function: its physical function's ports are watched
            devices.append((device, top, nic))
        found: list[tuple[str, str, str, str | None, str]] = []  # (device, port, base, nic, fw)
        for device, top, nic in r.bound("rdma_device", devices, CAPS.rdma_device):
            if r.real(top, "ports") is None:
                continue
            fw = self._label(f"{top}/fw_ver", parse_firmware)
            for port in r.listdir(f"{top}/ports"):
                base = r.real(top, "ports", port) if _PORT.fullmatch(port) else None
                if base is not None:
                    found.append((device, port, base, nic, fw))
        ports: list[_Port] = []
        netdevs: dict[str, dict[str, str]] = {}
        self._over = 0
        for device, port, base, nic, fw in r.bound("port", found, CAPS.port):
            if nic and nic not in netdevs:
                netdevs[nic] = self._netdevs(nic)
            interface = netdevs.get(nic or "", {}).get(port, "")
            p = _Port(
                device=device,
                port=port,
                base=base,
                link_layer=self._label(f"{base}/link_layer", parse_link_layer),
                pci_address=os.path.basename(nic) if nic else "",
                interface=interface,
                fw_version=fw,
                carrier=f"{nic}/net/{interface}/carrier_changes" if interface else "",
            )
            self._plan(p)
            ports.append(p)
        r.dropped("counter", self._over, CAPS.counter)
        self._ports = ports
        self.scans += 1

    def _label(self, path: str, parse: Callable[[str], str | None]) -> str:
        """A label value read from ``path``: what ``parse`` vouches for, else "" (garbage, counted)."""
        text = self._reader.text(path, listed=False)
        if text is None:
            return ""
        value = parse(text)
        if value is None:
            self._reader.problem(path, "garbage", repr(text[:40]))
            return ""
        return value

    def _netdevs(self, nic: str) -> dict[str, str]:
        """port -> netdev of the NIC function (``net/<if>/dev_port`` counts from 0; absent means 1)."""
        r = self._reader
        found: dict[str, str] = {}
        if r.real(nic, "net") is None:
            return found
        for interface in r.listdir(f"{nic}/net")[: CAPS.port]:
            if r.real(nic, "net", interface) is None:
                continue
            dev_port = r.text(f"{nic}/net/{interface}/dev_port", listed=False)
            if dev_port is None:
                port = "1"
            elif _PORT.fullmatch(dev_port):
                port = str(int(dev_port) + 1)
            else:
                r.problem(f"{nic}/net/{interface}/dev_port", "garbage", repr(dev_port[:40]))
                continue
            found.setdefault(port, interface)
        return found

    def _counter_files(self, base: str, directory: str) -> list[str]:
        """The files of ``counters``/``hw_counters`` (not a link), at most CAPS.counter of them."""
        if self._reader.real(base, directory) is None:
            return []
        names = self._reader.listdir(f"{base}/{directory}")
        self._over += max(len(names) - CAPS.counter, 0)
        return names[: CAPS.counter]

    def _plan(self, p: _Port) -> None:
        counters = set(self._counter_files(p.base, "counters"))
        for name in F.DEFAULT_PORT_ERRORS:
            if name in counters:
                p.errors.append((name, f"{p.base}/counters/{name}"))
        if self._all:
            known = {*F.DEFAULT_PORT_ERRORS, *_OTHER_KNOWN}
            p.others = [(n, f"{p.base}/counters/{n}") for n in sorted(counters - known)]
        if "port_xmit_wait" in counters:
            p.wait = f"{p.base}/counters/port_xmit_wait"
        p.data = [(d, f"{p.base}/counters/{n}") for n, d in _DATA if n in counters]
        p.packets = [(d, f"{p.base}/counters/{n}") for n, d in _PACKETS if n in counters]
        hw = self._counter_files(p.base, "hw_counters")
        wanted = hw if self._all else [n for n in F.DEFAULT_HW_COUNTERS if n in hw]
        p.hw = [(n, f"{p.base}/hw_counters/{n}") for n in wanted if n != "lifespan"]
        port = (p.device, p.port)
        p.reads = [
            *((F.IB_PORT_ERRORS, (*port, n), path, 1) for n, path in p.errors),
            *(((F.IB_PORT_TRANSMIT_WAIT, port, p.wait, 1),) if p.wait else ()),
            *((F.IB_PORT_COUNTER, (*port, n), path, 1) for n, path in p.others),
            *((F.IB_PORT_HW_COUNTER, (*port, n), path, 1) for n, path in p.hw),
            *((F.IB_PORT_DATA, (*port, d), path, 4) for d, path in p.data),  # 4-byte words
            *((F.IB_PORT_PACKETS, (*port, d), path, 1) for d, path in p.packets),
        ]
        if p.carrier:
            p.reads.append((F.IB_PORT_CARRIER_CHANGES, (*port, p.interface), p.carrier, 1))
        p.paths = [path for _, _, path, _ in p.reads]
        p.keys = [(*series, spec.name) for spec, series, _, _ in p.reads]

    # --- collection -----------------------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        """Every port's state, rate, counters and flaps; never raises for what one port does."""
        with self._lock:
            if self._rescan.due():
                with self._reader.passing():
                    self._scan()
            samples: list[Sample] = []
            vanished = self._reader.vanished
            for p in self._ports:
                before = self._reader.vanished
                mine: list[Sample] = []
                self._collect_port(p, mine)
                if self._reader.vanished == before:
                    samples.extend(mine)  # a port that left during the scrape is gone from it
            self._counters.sweep()
            if self._reader.vanished != vanished:
                self._rescan.soon()  # a device went away (or is being recreated): look again next scrape
            families = to_families(samples)
            families.extend(self._reader.families())
            self._reader.release_unread()
            return families

    def _collect_port(self, p: _Port, out: list[Sample]) -> None:
        r, c = self._reader, self._counters
        labels = (p.device, p.port)
        c.epoch(labels, r.inode(p.base))
        for spec, name in ((F.IB_PORT_STATE, "state"), (F.IB_PORT_PHYS_STATE, "phys_state")):
            text = r.text(f"{p.base}/{name}")
            if text is not None:
                value = parse_state(text)
                if value is None:
                    r.problem(f"{p.base}/{name}", "garbage", repr(text[:40]))
                else:
                    r.ok(f"{p.base}/{name}", "garbage")
                    out.append((spec, labels, float(value)))
        rate_text = r.text(f"{p.base}/rate")
        if rate_text is not None:
            rate = parse_rate(rate_text)
            if rate is None:
                r.problem(f"{p.base}/rate", "garbage", repr(rate_text[:40]))
            else:
                r.ok(f"{p.base}/rate", "garbage")
                out.append((F.IB_PORT_RATE, labels, rate))
        out.append((F.IB_PORT_INFO, (*labels, p.link_layer, p.pci_address, p.interface, p.fw_version), 1.0))

        grown = c.value
        for (spec, series, _, scale), key, raw in zip(p.reads, p.keys, r.integers(p.paths), strict=True):
            if raw is not None:  # keyed by the port first: a recreated device resets all of its own
                out.append((spec, series, float(grown(key, raw * scale))))
