"""Host memory errors from EDAC: ``devices/system/edac/mc/mc<N>/{ce_count,ue_count}``.

The kernel's EDAC drivers (``skx_edac``, ``i10nm_edac``, ``amd64_edac``) count the ECC errors the
memory controllers report: correctable ones (``ce_count``, a DIMM wearing out long before it fails)
and uncorrectable ones (``ue_count``; the kernel usually panics or kills the process that touched
the memory, and on a training node the job dies). Both are per memory controller, as
node_exporter's edac collector reads them; the per-``csrow`` breakdown (which DIMM) is in the same
directory for whoever replaces the DIMM. A host without an EDAC driver loaded has no
``edac/mc`` (many cloud VMs): no series, which the docs say it cannot see. At most 64 controllers,
the lowest numbers (:data:`~babysitter.catalog.budget.CAPS`); more are shown in
``babysitter_sysfs_items_dropped``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.catalog.budget import CAPS
from babysitter.node.sysfs import Counters, Rescan, Sample, SysfsReader, to_families

__all__ = ["EdacCollector"]

_MC = re.compile(r"^mc(\d{1,4})$")


class EdacCollector:
    """The ``edac`` collector: correctable and uncorrectable memory errors per memory controller."""

    name = "edac"

    def __init__(
        self,
        sysfs: str | os.PathLike[str] = "/sys",
        *,
        rescan_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = SysfsReader(os.fspath(sysfs), self.name)
        self._rescan = Rescan(rescan_seconds, clock)
        self._controllers: list[tuple[str, str]] = []  # (controller number, directory)
        self._counters = Counters("EDAC")
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the files kept open (after a collection in flight: its reads use them)."""
        with self._lock:
            self._reader.close()

    def collect(self) -> Iterable[Metric]:
        """Each memory controller's error counts."""
        with self._lock:
            if self._rescan.due():
                found = sorted(
                    (int(m.group(1)), name)
                    for name in self._reader.listdir("devices/system/edac/mc")
                    if (m := _MC.match(name))
                )
                self._controllers = [
                    (str(number), path)
                    for number, name in self._reader.bound("memory_controller", found, CAPS.memory_controller)
                    if (path := self._reader.real("devices/system/edac/mc", name)) is not None
                ]
            samples: list[Sample] = []
            r, c = self._reader, self._counters
            for number, base in self._controllers:
                c.epoch((number,), r.inode(base))
                for spec, name in ((F.EDAC_CORRECTABLE, "ce_count"), (F.EDAC_UNCORRECTABLE, "ue_count")):
                    raw = r.integer(f"{base}/{name}")
                    if raw is not None:
                        samples.append((spec, (number,), float(c.value((number, name), raw))))
            c.sweep()
            families = to_families(samples)
            families.extend(r.families())
            r.release_unread()
            return families
