"""CPU thermal throttling: ``devices/system/cpu/cpu<N>/thermal_throttle/{core,package}_throttle_count``.

Intel CPUs count the times a core, and a whole package, went over their thermal limit and were slowed
(the ``therm_throt`` driver; AMD CPUs have no such files). A throttled host CPU slows the input
pipeline and the kernel launches of every rank on it. Series per package, not per logical CPU (a
2 x 56-core host has 224): the core counts of a package summed, each physical core once (both
hyperthreads of a core show the same count), and the package count read from one of its CPUs.
Which CPU is which core comes from ``topology/`` and is read again every ``rescan_seconds``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.node.sysfs import Counters, Rescan, Sample, SysfsReader, to_families

__all__ = ["CpuThermalCollector"]

_CPU = re.compile(r"^cpu(\d{1,5})$")


class CpuThermalCollector:
    """The ``thermal`` collector: core and package thermal throttle events per CPU package."""

    name = "thermal"

    def __init__(
        self,
        sysfs: str | os.PathLike[str] = "/sys",
        *,
        rescan_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = SysfsReader(os.fspath(sysfs), self.name)
        self._rescan = Rescan(rescan_seconds, clock)
        self._cores: dict[str, list[str]] = {}  # package -> core_throttle_count file of one CPU per core
        self._packages: dict[str, str] = {}  # package -> package_throttle_count file of one of its CPUs
        self._counters = Counters("CPU thermal")
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the files kept open (after a collection in flight: its reads use them)."""
        with self._lock:
            self._reader.close()

    def _scan(self) -> None:
        r = self._reader
        cores: dict[str, dict[str, str]] = {}
        packages: dict[str, str] = {}
        for name in r.listdir("devices/system/cpu"):
            if not _CPU.match(name):
                continue
            base = r.path(f"devices/system/cpu/{name}")
            if not r.exists(f"{base}/thermal_throttle/core_throttle_count"):
                continue  # offline, or a CPU without the counters (AMD)
            package = r.text(f"{base}/topology/physical_package_id", listed=False)
            core = r.text(f"{base}/topology/core_id", listed=False)
            if package is None or core is None or not package.lstrip("-").isdigit():
                continue
            cores.setdefault(package, {}).setdefault(core, f"{base}/thermal_throttle/core_throttle_count")
            packages.setdefault(package, f"{base}/thermal_throttle/package_throttle_count")
        self._cores = {p: list(c.values()) for p, c in sorted(cores.items())}
        self._packages = dict(sorted(packages.items()))

    def collect(self) -> Iterable[Metric]:
        """Throttle events per package."""
        with self._lock:
            if self._rescan.due():
                with self._reader.passing():
                    self._scan()
            r, c = self._reader, self._counters
            samples: list[Sample] = []
            for package, files in self._cores.items():
                total, seen = 0, False
                for path, value in zip(files, r.integers(files), strict=True):
                    if value is not None:
                        total += c.value((package, path), value)
                        seen = True
                if seen:
                    samples.append((F.CPU_CORE_THROTTLES, (package,), float(total)))
            for package, path in self._packages.items():
                value = r.integer(path)
                if value is not None:
                    samples.append(
                        (F.CPU_PACKAGE_THROTTLES, (package,), float(c.value((package, path), value)))
                    )
            c.sweep()
            families = to_families(samples)
            families.append(r.family())
            r.release_unread()
            return families
