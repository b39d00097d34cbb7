"""CPU thermal throttling: ``devices/system/cpu/cpu<N>/thermal_throttle/{core,package}_throttle_count``.

Intel CPUs count the times a core, and a whole package, went over their thermal limit and were slowed
(the ``therm_throt`` driver; AMD CPUs have no such files). A throttled host CPU slows the input
pipeline and the kernel launches of every rank on it. Series per package, not per logical CPU (a
2 x 56-core host has 224): the core counts of a package summed, each physical core once (both
hyperthreads of a core show the same count), and the package count read from one of its CPUs.
Which CPU is which core comes from ``topology/`` and is read again every ``rescan_seconds``. At most
1,024 CPUs (the lowest numbers) and 16 packages (:data:`~babysitter.catalog.budget.CAPS`); more are
shown in ``babysitter_sysfs_items_dropped``. A package is named by the number its CPUs' files give.
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

__all__ = ["CpuThermalCollector"]

_CPU = re.compile(r"^cpu([0-9]{1,5})$")
_ID = re.compile(r"-?[0-9]{1,5}")
_TOPOLOGY = ("physical_package_id", "core_id")


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
        cores: dict[int, dict[str, str]] = {}
        packages: dict[int, str] = {}
        cpus = sorted((int(m.group(1)), n) for n in r.listdir("devices/system/cpu") if (m := _CPU.match(n)))
        for _, name in r.bound("cpu", cpus, CAPS.cpu):
            base = r.real("devices/system/cpu", name)
            if base is None or r.real(base, "thermal_throttle") is None or r.real(base, "topology") is None:
                continue  # offline, or a CPU without the counters (AMD)
            if not r.exists(f"{base}/thermal_throttle/core_throttle_count"):
                continue
            ids = [(f"{base}/topology/{f}", r.text(f"{base}/topology/{f}", listed=False)) for f in _TOPOLOGY]
            (_, package), (_, core) = ids
            if package is None or core is None:
                continue
            bad = [(path, text) for path, text in ids if not _ID.fullmatch(text or "")]
            if bad:
                r.problem(bad[0][0], "garbage", repr((bad[0][1] or "")[:40]))
                continue
            throttles = f"{base}/thermal_throttle"
            cores.setdefault(int(package), {}).setdefault(core, f"{throttles}/core_throttle_count")
            packages.setdefault(int(package), f"{throttles}/package_throttle_count")
        kept = r.bound("package", sorted(packages), CAPS.package)
        self._cores = {str(p): list(cores[p].values()) for p in kept}
        self._packages = {str(p): packages[p] for p in kept}

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
            families.extend(r.families())
            r.release_unread()
            return families
