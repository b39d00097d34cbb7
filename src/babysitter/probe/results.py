"""What a probe measured: plain records, their JSON form and the per-host file (the table is in
:mod:`babysitter.views.probe`).

The JSON form is the interface between the probe and everything after it (the node agent's ``probe``
collector, scripts comparing allocations), so it is versioned (``schema``) and read back strictly:
a file that does not parse into these records is rejected as a whole, never half-used. No torch
import here: the node agent reads results without it.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from babysitter import jsonin, jsonout
from babysitter.userfiles import TooLargeError, read_regular

__all__ = [
    "SCHEMA",
    "Bandwidth",
    "CollectiveResult",
    "DeviceResult",
    "Lemon",
    "MatmulResult",
    "ProbeReport",
    "StorageResult",
    "host_file_name",
    "read_report",
    "write_report",
]

SCHEMA = "babysitter.probe/1"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class MatmulResult:
    """Best dense matmul throughput of one device; ``skipped`` holds why it was not measured."""

    dtype: str = ""
    n: int = 0
    iterations: int = 0
    flops_per_second: float | None = None
    peak_flops_per_second: float | None = None
    peak_device: str = ""
    peak_source: str = ""
    skipped: str = ""

    @property
    def peak_ratio(self) -> float | None:
        """Measured over dense peak; None when either is unknown."""
        if not self.flops_per_second or not self.peak_flops_per_second:
            return None
        return self.flops_per_second / self.peak_flops_per_second


@dataclass
class Bandwidth:
    """One copy bandwidth (device memory, host-to-device, device-to-host), or why it was skipped."""

    bytes: int = 0
    iterations: int = 0
    bytes_per_second: float | None = None
    skipped: str = ""


@dataclass
class DeviceResult:
    """Everything measured on one device (one rank under torchrun)."""

    host: str
    rank: int
    local_rank: int
    gpu: str  # the device label: CUDA index ("0"), or "cpu<local rank>" on a CPU-only probe
    name: str  # the device model as the driver names it ("NVIDIA H100 80GB HBM3", or the CPU's)
    matmul: MatmulResult = field(default_factory=MatmulResult)
    memory: Bandwidth = field(default_factory=Bandwidth)
    host_to_device: Bandwidth = field(default_factory=Bandwidth)
    device_to_host: Bandwidth = field(default_factory=Bandwidth)
    errors: list[str] = field(default_factory=list)

    def value(self, check: str) -> float | None:
        """The number a lemon check compares (``matmul``, ``memory``, ``host_to_device``...)."""
        if check == "matmul":
            return self.matmul.flops_per_second
        section = getattr(self, check, None)
        return section.bytes_per_second if isinstance(section, Bandwidth) else None


@dataclass
class CollectiveResult:
    """All-reduce bandwidth of the whole job (``host`` empty) or among one host's ranks, as NCCL-tests
    define ``algbw`` and ``busbw``."""

    host: str = ""
    backend: str = ""
    world_size: int = 0
    bytes: int = 0
    iterations: int = 0
    seconds_per_op: float | None = None
    algbw_bytes_per_second: float | None = None
    busbw_bytes_per_second: float | None = None
    skipped: str = ""


@dataclass
class StorageResult:
    """Write (with fsync) and cold read of one checkpoint-sized file in one directory of one host."""

    host: str
    path: str
    size_bytes: int = 0
    write_seconds: float | None = None
    fsync_seconds: float | None = None
    read_seconds: float | None = None
    error: str = ""  # why it failed or was skipped; "" when measured

    @property
    def write_bytes_per_second(self) -> float | None:
        """Size over write + fsync time: the rate a checkpoint save gets."""
        if self.write_seconds is None or self.fsync_seconds is None or self.error:
            return None
        total = self.write_seconds + self.fsync_seconds
        return self.size_bytes / total if total > 0 else None

    @property
    def read_bytes_per_second(self) -> float | None:
        """Size over the cold read time: the rate a checkpoint load gets."""
        if self.read_seconds is None or self.error or self.read_seconds <= 0:
            return None
        return self.size_bytes / self.read_seconds


@dataclass
class Lemon:
    """One device or node more than ``fraction`` below the median of its peers in one check."""

    scope: str  # "device" or "node"
    host: str
    gpu: str  # "" for a node
    check: str
    value: float
    median: float
    peers: int

    @property
    def below_median(self) -> float:
        """How far below the median, as a fraction (0.3 = 30% slower)."""
        return 1.0 - self.value / self.median if self.median > 0 else 0.0


@dataclass
class ProbeReport:
    """The results of one probe run: every device, the collective, storage, lemons."""

    started: float
    finished: float
    world_size: int
    lemon_fraction: float
    devices: list[DeviceResult] = field(default_factory=list)
    collective: CollectiveResult = field(default_factory=CollectiveResult)
    node_collectives: list[CollectiveResult] = field(default_factory=list)
    storage: list[StorageResult] = field(default_factory=list)
    lemons: list[Lemon] = field(default_factory=list)
    schema: str = SCHEMA

    @property
    def hosts(self) -> list[str]:
        """Hosts that took part, in first-seen order."""
        seen: dict[str, None] = {}
        for host in [*(d.host for d in self.devices), *(s.host for s in self.storage)]:
            seen.setdefault(host, None)
        return list(seen)

    def for_host(self, host: str) -> ProbeReport:
        """The part of the report about one host (what that host's node agent serves)."""
        return ProbeReport(
            started=self.started,
            finished=self.finished,
            world_size=self.world_size,
            lemon_fraction=self.lemon_fraction,
            devices=[d for d in self.devices if d.host == host],
            collective=self.collective,
            node_collectives=[c for c in self.node_collectives if c.host == host],
            storage=[s for s in self.storage if s.host == host],
            lemons=[lemon for lemon in self.lemons if lemon.host == host],
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with derived numbers (peak ratio, storage bandwidths) spelled out."""
        data = asdict(self)
        for device, raw in zip(self.devices, data["devices"], strict=True):
            raw["matmul"]["peak_ratio"] = device.matmul.peak_ratio
        for storage, raw in zip(self.storage, data["storage"], strict=True):
            raw["write_bytes_per_second"] = storage.write_bytes_per_second
            raw["read_bytes_per_second"] = storage.read_bytes_per_second
        for lemon, raw in zip(self.lemons, data["lemons"], strict=True):
            raw["below_median"] = lemon.below_median
        return jsonout.finite_only(data)  # type: ignore[no-any-return]

    def to_json(self) -> str:
        """Indented JSON text."""
        return jsonout.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeReport:
        """Strict inverse of :meth:`to_dict`; ValueError for anything that is not a probe report."""
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a probe report (schema must be {SCHEMA!r})")
        try:
            return cls(
                started=_number(data["started"]),
                finished=_number(data["finished"]),
                world_size=int(data["world_size"]),
                lemon_fraction=_number(data["lemon_fraction"]),
                devices=[_device(d) for d in _list(data.get("devices", []))],
                collective=_record(CollectiveResult, data.get("collective", {})),
                node_collectives=[
                    _record(CollectiveResult, c) for c in _list(data.get("node_collectives", []))
                ],
                storage=[_record(StorageResult, s) for s in _list(data.get("storage", []))],
                lemons=[_record(Lemon, x) for x in _list(data.get("lemons", []))],
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed probe report: {type(exc).__name__}: {exc}") from exc


_R = TypeVar("_R")


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _record(cls: type[_R], raw: Any) -> _R:
    """A dataclass from a dict: known fields only, each of the annotated JSON type."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"{cls.__name__}: expected an object, got {type(raw).__name__}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in raw:
            continue
        value = raw[f.name]
        kind = str(f.type)
        if kind == "str":
            if not isinstance(value, str):
                raise TypeError(f"{cls.__name__}.{f.name}: expected a string")
            value = value[:1024]
        elif kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{cls.__name__}.{f.name}: expected an integer")
        elif kind == "float":
            value = _number(value)
        elif kind == "float | None":
            value = None if value is None else _number(value)
        elif kind == "list[str]":
            value = [str(v)[:1024] for v in _list(value)][:32]
        else:
            continue  # nested records are built by the caller
        kwargs[f.name] = value
    return cls(**kwargs)


def _device(raw: Any) -> DeviceResult:
    device = _record(DeviceResult, raw)
    device.matmul = _record(MatmulResult, raw.get("matmul", {}))
    for name in ("memory", "host_to_device", "device_to_host"):
        setattr(device, name, _record(Bandwidth, raw.get(name, {})))
    return device


def host_file_name(host: str) -> str:
    """The per-host results file in a results directory: ``probe-<host>.json`` (host made file-safe)."""
    return f"probe-{_SAFE.sub('_', host)[:128] or 'host'}.json"


def write_report(report: ProbeReport, path: Path) -> None:
    """Write ``report`` atomically (temp file + rename), mode 0644 so the node agent's user can read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".probe-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(report.to_json() + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def read_report(path: Path, max_bytes: int = 4 * 1024 * 1024) -> ProbeReport:
    """Read a results file; ValueError when it is too large, nested too deep or not a probe report,
    OSError when unreadable or not a regular file (a FIFO is refused, never opened)."""
    try:
        raw = read_regular(path, limit=max_bytes)
    except TooLargeError:
        raise ValueError(f"larger than {max_bytes} bytes") from None
    try:
        data = jsonin.loads(raw, max_bytes=max_bytes)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    return ProbeReport.from_dict(data)
