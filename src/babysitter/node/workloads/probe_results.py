"""The ``probe`` collector: serves the results of the last ``babysitter probe`` on this host as ``probe_*``.

``babysitter probe --results-dir DIR`` writes ``DIR/probe-<host>.json`` (atomically, so a scrape
never sees half a file). At each scrape this collector reads the ``probe-*.json`` files of the
directory, newest first, at most :data:`MAX_FILES` of at most :data:`MAX_FILE_BYTES` each, and turns
them into the catalog's ``probe_*`` families. Reads are cached by (mtime, size), so an unchanged file
is parsed once. A file that is not a probe report is skipped as a whole, counted in
``PROBE_RESULTS_INVALID`` and logged once per version of the file; it never fails the scrape.
A missing directory is not an error (no probe has run yet): the collector serves nothing but the count.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric

from babysitter.catalog import probe as P
from babysitter.labels import sanitize_value
from babysitter.probe.results import ProbeReport, read_report

__all__ = ["MAX_DEVICES", "MAX_FILES", "MAX_FILE_BYTES", "MAX_PATHS", "ProbeResultsCollector", "families"]

log = logging.getLogger(__name__)

MAX_FILES = 16
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Per file: a host has at most a few dozen devices and checkpoint paths; more is a file that is not
#: one host's results (a whole job's report, or garbage) and must not blow up the series count.
MAX_DEVICES = 64
MAX_PATHS = 16

_Key = tuple[int, int]  # (mtime_ns, size)


class ProbeResultsCollector:
    """Reads probe result files from ``directory`` at every scrape."""

    name = "probe"

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self._cache: dict[str, tuple[_Key, ProbeReport | None]] = {}

    def _files(self) -> list[tuple[Path, _Key]]:
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        found: list[tuple[Path, _Key]] = []
        for entry in entries:
            if not (entry.name.startswith("probe-") and entry.name.endswith(".json")):
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            found.append((Path(entry.path), (st.st_mtime_ns, st.st_size)))
        found.sort(key=lambda item: item[1][0], reverse=True)
        return found[:MAX_FILES]

    def _load(self, path: Path, key: _Key) -> ProbeReport | None:
        cached = self._cache.get(path.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            report: ProbeReport | None = read_report(path, MAX_FILE_BYTES)
        except (OSError, ValueError) as exc:
            log.warning("babysitter: skipping probe results file %s: %s", path, exc)
            report = None
        self._cache[path.name] = (key, report)
        return report

    def collect(self) -> Iterable[Metric]:
        """The ``probe_*`` families of every valid results file (the newest wins for a duplicate series)."""
        files = self._files()
        reports: list[ProbeReport] = []
        invalid = 0
        for path, key in files:
            report = self._load(path, key)
            if report is None:
                invalid += 1
            else:
                reports.append(report)
        names = {path.name for path, _ in files}
        for stale in set(self._cache) - names:
            del self._cache[stale]
        out = families(reports)
        count = P.PROBE_RESULTS_INVALID.family()
        count.add_metric([], float(invalid))  # type: ignore[attr-defined]
        out.append(count)
        return out

    def close(self) -> None:
        """Nothing to release."""
        self._cache.clear()


def _label(value: object) -> str:
    return sanitize_value(value) or "unknown"


def families(reports: Iterable[ProbeReport]) -> list[Metric]:
    """The ``probe_*`` families of ``reports``, the first report winning where two give the same series."""
    fams = {spec.name: spec.family() for spec in P.METRICS if spec is not P.PROBE_RESULTS_INVALID}
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def add(spec_name: str, labels: list[str], value: float | None) -> None:
        if value is None:
            return
        key = (spec_name, tuple(labels))
        if key in seen:
            return
        seen.add(key)
        fams[spec_name].add_metric(labels, float(value))  # type: ignore[attr-defined]

    for report in reports:
        add(P.PROBE_TIMESTAMP.name, [], report.finished)
        device_lemons = {(x.host, x.gpu, x.check) for x in report.lemons if x.scope == "device"}
        for d in report.devices[:MAX_DEVICES]:
            ids = [_label(d.gpu), _label(d.name)]
            m = d.matmul
            if not m.skipped and m.dtype:
                add(P.PROBE_MATMUL_FLOPS.name, [*ids, _label(m.dtype)], m.flops_per_second)
                add(P.PROBE_MATMUL_PEAK.name, [*ids, _label(m.dtype)], m.peak_ratio)
            add(P.PROBE_MEMORY_BANDWIDTH.name, ids, d.memory.bytes_per_second)
            for direction in ("host_to_device", "device_to_host"):
                add(P.PROBE_HOST_DEVICE_BANDWIDTH.name, [*ids, direction], d.value(direction))
            for check in P.DEVICE_CHECKS:
                if d.value(check) is not None:
                    flagged = (d.host, d.gpu, check) in device_lemons
                    add(P.PROBE_DEVICE_LEMON.name, [*ids, check], 1.0 if flagged else 0.0)
        c = report.collective
        if not c.skipped and c.busbw_bytes_per_second is not None:
            add(
                P.PROBE_ALLREDUCE_BUS_BANDWIDTH.name,
                [_label(c.backend), str(c.world_size)],
                c.busbw_bytes_per_second,
            )
        for n in report.node_collectives[:1]:  # this host's
            if not n.skipped:
                add(
                    P.PROBE_NODE_ALLREDUCE_BUS_BANDWIDTH.name,
                    [_label(n.backend), str(n.world_size)],
                    n.busbw_bytes_per_second,
                )
        for s in report.storage[:MAX_PATHS]:
            path = _label(s.path)
            add(P.PROBE_STORAGE_WRITE_BANDWIDTH.name, [path], s.write_bytes_per_second)
            add(P.PROBE_STORAGE_READ_BANDWIDTH.name, [path], s.read_bytes_per_second)
            add(P.PROBE_STORAGE_FSYNC.name, [path], None if s.error else s.fsync_seconds)
        node_lemons = {x.check for x in report.lemons if x.scope == "node"}
        measured = set()
        if any(d.matmul.flops_per_second for d in report.devices):
            measured.add("matmul")
        if any(not n.skipped and n.busbw_bytes_per_second for n in report.node_collectives):
            measured.add("allreduce")
        if any(s.write_bytes_per_second for s in report.storage):
            measured.add("storage_write")
        if any(s.read_bytes_per_second for s in report.storage):
            measured.add("storage_read")
        for check in P.NODE_CHECKS:
            if check in measured:
                add(P.PROBE_NODE_LEMON.name, [check], 1.0 if check in node_lemons else 0.0)
    return [fam for fam in fams.values() if fam.samples]
