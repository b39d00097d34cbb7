"""PCIe links and AER of the host's GPUs and NICs, from ``bus/pci/devices/<address>``.

Per watched function (:mod:`babysitter.node.fabric.pci`: GPUs and NICs by PCI class):

- the link: ``current_link_width``/``current_link_speed`` now, and the most it can train at, which is
  the lower of the device's and its upstream port's ``max_link_*`` (a x16 card in a x8 slot is not
  downtrained: it is where it can be). A width below that is a downtrained link, whatever the load.
  Speed is another matter: GPUs drop to 2.5 GT/s when idle to save power, so a lower speed only
  means something under load (the alert asks for it; docs/fabric.md).
- AER, ``aer_dev_correctable``/``_nonfatal``/``_fatal``: lines ``<name> <count>`` ending with
  ``TOTAL_ERR_COR``/``TOTAL_ERR_NONFATAL``/``TOTAL_ERR_FATAL``. Names differ between kernels (4.19
  spells them out, ``Receiver Error 2``; later kernels abbreviate, ``RxErr 2``); the count is the
  last field of each line and the total line is used when present (else the sum). The exported
  count adds the upstream port's: the kernel documents that errors of a failing endpoint are often
  counted by its link partner, the port that received the bad packets.

Counters survive a device being removed and added back (a GPU reset, a hot-plug) as the InfiniBand
ones do: :class:`~babysitter.node.sysfs.Counters` keeps them monotonic.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.node.fabric.pci import BDF, Inventory, PciDevice
from babysitter.node.sysfs import Counters, Sample, SysfsReader, to_families

__all__ = ["PcieCollector", "parse_aer", "parse_speed"]

_DRIVER = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a kernel module's name, as bus/pci/drivers/ lists it
_SPEED = re.compile(r"^([0-9]+(?:\.[0-9]+)?) ?GT/s")
_AER_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}
_TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}


def parse_speed(text: str) -> float | None:
    """``32.0 GT/s PCIe`` (or an older kernel's ``8 GT/s``) -> transfers per second; None otherwise
    (``Unknown``: a link that is down)."""
    match = _SPEED.match(text)
    return float(match.group(1)) * 1e9 if match else None


def parse_aer(text: str, severity: str) -> int | None:
    """The count of an ``aer_dev_*`` file: its ``TOTAL_ERR_*`` line, else the sum of its lines; None
    when a line is not ``<name> <count>``."""
    marker = _TOTALS[severity] + " "
    at = text.rfind(marker)
    if at >= 0 and (at == 0 or text[at - 1] == "\n"):
        tail = text[at + len(marker) :].split("\n", 1)[0].strip()
        if tail.isdigit():
            return int(tail)
    total = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, count = line.rpartition(" ")
        if not name.strip() or not count.isdigit():
            return None
        if name.strip() == _TOTALS[severity]:
            return int(count)
        total += int(count)
    return total


@dataclass(frozen=True)
class _Static:
    """What does not change while a device exists: its link's maximums, its info, which files it has."""

    max_width: float | None
    max_speed: float | None
    info: tuple[str, ...]
    width: str  # current_link_width, "" when the device has none (a virtual NIC)
    speed: str
    aer: tuple[tuple[str, str], ...]  # (severity, file) of the device
    partner: tuple[tuple[str, str], ...]  # the same of its upstream port


class PcieCollector:
    """The ``pcie`` collector: link width and speed and AER counts of every GPU and NIC."""

    name = "pcie"

    def __init__(
        self,
        sysfs: str | os.PathLike[str] = "/sys",
        *,
        rescan_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = SysfsReader(os.fspath(sysfs), self.name)
        self._inventory = Inventory(self._reader, rescan_seconds=rescan_seconds, clock=clock, ports=False)
        self._static: dict[str, _Static] = {}
        self._counters = Counters("PCIe AER")
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the files kept open (after a collection in flight: its reads use them)."""
        with self._lock:
            self._reader.close()

    def _prepare(self) -> None:
        r = self._reader
        self._static = {}
        for d in self._inventory.devices:
            width = r.integer(f"{d.path}/max_link_width", listed=False)
            speed_text = r.text(f"{d.path}/max_link_speed", listed=False)
            speed = parse_speed(speed_text) if speed_text else None
            up = os.path.dirname(d.path) if BDF.match(d.upstream) else ""
            if up:
                up_width = r.integer(f"{up}/max_link_width", listed=False)
                up_text = r.text(f"{up}/max_link_speed", listed=False)
                up_speed = parse_speed(up_text) if up_text else None
                if width is not None and up_width:
                    width = min(width, up_width)
                if speed is not None and up_speed:
                    speed = min(speed, up_speed)
            driver = os.path.basename(r.resolve(f"{d.path}/driver") or "")
            info = (
                f"0x{d.vendor:04x}",
                f"0x{d.device:04x}",
                driver if _DRIVER.fullmatch(driver) else "",
                str(d.numa_node),
                d.upstream,
            )

            def have(path: str, name: str) -> str:
                return f"{path}/{name}" if r.exists(f"{path}/{name}") else ""

            def aer(path: str) -> tuple[tuple[str, str], ...]:
                return tuple((sev, f"{path}/{n}") for sev, n in _AER_FILES.items() if path and have(path, n))

            self._static[d.address] = _Static(
                float(width) if width else None,
                speed,
                info,
                have(d.path, "current_link_width"),
                have(d.path, "current_link_speed"),
                aer(d.path),
                aer(up),
            )

    def collect(self) -> Iterable[Metric]:
        """Every watched device's link and AER counts; never raises for what one device does."""
        with self._lock:
            with self._reader.passing():
                if self._inventory.refresh():
                    self._prepare()
            samples: list[Sample] = []
            vanished = self._reader.vanished
            aer_cache: dict[str, dict[str, int | None]] = {}
            for d in self._inventory.devices:
                before = self._reader.vanished
                mine: list[Sample] = []
                self._collect_device(d, mine, aer_cache)
                if self._reader.vanished == before:
                    samples.extend(mine)  # a device that left during the scrape is gone from it
            self._counters.sweep()
            if self._reader.vanished != vanished:
                with self._reader.passing():  # a device left: scan again, forget it next scrape
                    self._inventory.refresh(force=True)
                    self._prepare()
            families = to_families(samples)
            families.extend(self._reader.families())
            self._reader.release_unread()
            return families

    def _collect_device(
        self, d: PciDevice, out: list[Sample], aer_cache: dict[str, dict[str, int | None]]
    ) -> None:
        r = self._reader
        labels = (d.address, d.kind)
        st = self._static.get(d.address)
        if st is None:
            return
        out.append((F.PCIE_DEVICE_INFO, (*labels, *st.info), 1.0))
        width = r.integer(st.width) if st.width else None
        if width is not None:
            out.append((F.PCIE_LINK_WIDTH, labels, float(width)))
        if st.max_width is not None:
            out.append((F.PCIE_LINK_MAX_WIDTH, labels, st.max_width))
        speed_text = r.text(st.speed) if st.speed else None
        if speed_text is not None:
            speed = parse_speed(speed_text)
            if speed is not None:
                r.ok(st.speed, "garbage")
                out.append((F.PCIE_LINK_SPEED, labels, speed))
            elif not speed_text.startswith("Unknown"):  # a link that is down has no speed
                r.problem(st.speed, "garbage", repr(speed_text[:40]))
        if st.max_speed is not None:
            out.append((F.PCIE_LINK_MAX_SPEED, labels, st.max_speed))
        self._counters.epoch(labels, r.inode(d.path))
        own = self._aer(st.aer, aer_cache)
        partner = self._aer(st.partner, aer_cache)
        for severity in F.PCIE_AER_SEVERITIES:
            mine, theirs = own.get(severity, 0), partner.get(severity, 0)
            if (severity not in own and severity not in partner) or mine is None or theirs is None:
                continue  # no AER there, or one end's count is garbage: the sum is unknown
            raw = mine + theirs
            value = self._counters.value((*labels, severity), raw)
            out.append((F.PCIE_AER_ERRORS, (*labels, severity), float(value)))

    def _aer(
        self, files: tuple[tuple[str, str], ...], cache: dict[str, dict[str, int | None]]
    ) -> dict[str, int | None]:
        """The AER counts of one function's files (None: garbage), read once a scrape (a port above two
        devices too)."""
        if not files:
            return {}
        key = files[0][1]
        cached = cache.get(key)
        if cached is not None:
            return cached
        found: dict[str, int | None] = {}
        r = self._reader
        for severity, path in files:
            text = r.text(path)
            if text is None:
                continue
            found[severity] = count = parse_aer(text, severity)
            if count is None:
                r.problem(path, "garbage", repr(text[:40]))
            else:
                r.ok(path, "garbage")
        cache[key] = found
        return found
