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
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.catalog._spec import MetricSpec
from babysitter.labels import sanitize_value
from babysitter.node.sysfs import Counters, Rescan, Sample, SysfsReader, to_families

__all__ = ["InfinibandCollector", "parse_rate", "parse_state"]

_DATA = (("port_rcv_data", "receive"), ("port_xmit_data", "transmit"))
_PACKETS = (("port_rcv_packets", "receive"), ("port_xmit_packets", "transmit"))
_OTHER_KNOWN = {"port_xmit_wait", *(n for n, _ in _DATA), *(n for n, _ in _PACKETS)}


def parse_state(text: str) -> int | None:
    """``4: ACTIVE`` -> 4; None when the text is not ``<number>: <name>``."""
    number, sep, _ = text.partition(":")
    number = number.strip()
    return int(number) if sep and number.isdigit() and len(number) <= 3 else None


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
        self.scans = 0

    def close(self) -> None:
        """Close the files kept open (after a collection in flight: its reads use them)."""
        with self._lock:
            self._reader.close()

    # --- discovery ----------------------------------------------------------------------------------
    def _scan(self) -> None:
        r = self._reader
        ports: list[_Port] = []
        for device in r.listdir("class/infiniband"):
            top = r.resolve(f"class/infiniband/{device}")
            if top is None:
                continue
            nic = r.resolve(f"{top}/device")
            pci = os.path.basename(nic) if nic else ""
            fw = sanitize_value(r.text(f"{top}/fw_ver", listed=False) or "")
            netdevs = self._netdevs(nic) if nic else {}
            for port in r.listdir(f"{top}/ports"):
                if not port.isdigit():
                    continue
                base = f"{top}/ports/{port}"
                interface = netdevs.get(port, "")
                p = _Port(
                    device=device,
                    port=port,
                    base=base,
                    link_layer=sanitize_value(r.text(f"{base}/link_layer", listed=False) or ""),
                    pci_address=pci,
                    interface=interface,
                    fw_version=fw,
                    carrier=f"{nic}/net/{interface}/carrier_changes" if interface else "",
                )
                self._plan(p)
                ports.append(p)
        self._ports = ports
        self.scans += 1

    def _netdevs(self, nic: str) -> dict[str, str]:
        """port -> netdev of the NIC function (``net/<if>/dev_port`` counts from 0; absent means 1)."""
        found: dict[str, str] = {}
        for interface in self._reader.listdir(f"{nic}/net"):
            dev_port = self._reader.text(f"{nic}/net/{interface}/dev_port", listed=False)
            port = str(int(dev_port) + 1) if dev_port is not None and dev_port.isdigit() else "1"
            found.setdefault(port, interface)
        return found

    def _plan(self, p: _Port) -> None:
        r = self._reader
        counters = set(r.listdir(f"{p.base}/counters"))
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
        hw = r.listdir(f"{p.base}/hw_counters")
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
            families.append(self._reader.family())
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
