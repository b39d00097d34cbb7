"""The GPU collector over DCGM, when its Python bindings are installed (they are not on PyPI).

DCGM ships ``DcgmReader`` and ``dcgm_fields`` with its packages: DCGM 4 under
``/usr/share/datacenter-gpu-manager-4/bindings/python3``, older releases under
``/usr/local/dcgm/bindings/python3``; ``$BABYSITTER_DCGM_BINDINGS`` adds a directory to try first.
They need a running ``nv-hostengine``. The collector exports the same catalog metrics as the NVML
collector, from DCGM fields resolved by name (a field the installed DCGM lacks is skipped), so
dashboards and alerts do not care which backend ran. Tensor activity comes from the profiling field
``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` where the DCP module is loaded. NVLink errors are DCGM's totals
over links (``link="all"``).

``DcgmReader`` swallows a lost hostengine connection and returns no values; the collector turns an
empty answer into a failure (``babysitter_collector_success{collector="gpu"} 0``) and a GPU missing
from an answer into ``gpu_up 0`` for that GPU.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from babysitter.catalog import node as N
from babysitter.catalog._spec import MetricSpec
from babysitter.node.collector import GpuIdentity
from babysitter.node.gpu.collector import EXPORTED_CLOCK_EVENT_REASONS, Sample, _families

__all__ = ["BINDING_PATHS", "FIELDS", "DcgmCollector", "DcgmUnavailable"]

log = logging.getLogger(__name__)

#: Where DCGM packages install their Python bindings, newest first.
BINDING_PATHS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
    "/usr/local/dcgm/bindings",
)
_MIB = 1024 * 1024

#: DCGM field name -> (catalog entry, extra label values, scale to base units).
FIELDS: dict[str, tuple[MetricSpec, tuple[str, ...], float]] = {
    "DCGM_FI_DEV_GPU_UTIL": (N.GPU_UTILIZATION, (), 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (N.GPU_TENSOR_ACTIVE, (), 1.0),
    "DCGM_FI_DEV_FB_USED": (N.GPU_MEMORY_USED, (), float(_MIB)),
    "DCGM_FI_DEV_FB_TOTAL": (N.GPU_MEMORY_TOTAL, (), float(_MIB)),
    "DCGM_FI_DEV_POWER_USAGE": (N.GPU_POWER, (), 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": (N.GPU_POWER_LIMIT, (), 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (N.GPU_ENERGY, (), 0.001),
    "DCGM_FI_DEV_GPU_TEMP": (N.GPU_TEMPERATURE, ("gpu",), 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": (N.GPU_TEMPERATURE, ("memory",), 1.0),
    "DCGM_FI_DEV_SM_CLOCK": (N.GPU_SM_CLOCK, (), 1e6),
    "DCGM_FI_DEV_MEM_CLOCK": (N.GPU_MEMORY_CLOCK, (), 1e6),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": (N.GPU_ECC_ERRORS, ("corrected", "volatile"), 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (N.GPU_ECC_ERRORS, ("uncorrected", "volatile"), 1.0),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": (N.GPU_ECC_ERRORS, ("corrected", "aggregate"), 1.0),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (N.GPU_ECC_ERRORS, ("uncorrected", "aggregate"), 1.0),
    "DCGM_FI_DEV_RETIRED_SBE": (N.GPU_RETIRED_PAGES, ("multiple_single_bit_ecc",), 1.0),
    "DCGM_FI_DEV_RETIRED_DBE": (N.GPU_RETIRED_PAGES, ("double_bit_ecc",), 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (N.GPU_REMAPPED_ROWS, ("correctable",), 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (N.GPU_REMAPPED_ROWS, ("uncorrectable",), 1.0),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": (N.GPU_REMAPPED_ROWS, ("pending",), 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (N.GPU_REMAPPED_ROWS, ("failure",), 1.0),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": (N.GPU_NVLINK_ERRORS, ("all", "replay"), 1.0),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (N.GPU_NVLINK_ERRORS, ("all", "recovery"), 1.0),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (N.GPU_NVLINK_ERRORS, ("all", "crc_flit"), 1.0),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (N.GPU_NVLINK_ERRORS, ("all", "crc_data"), 1.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": (N.GPU_PCIE_REPLAYS, (), 1.0),
}
#: Fields read for something other than a direct sample.
_REASONS_FIELDS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
_PENDING_FIELD = "DCGM_FI_DEV_RETIRED_PENDING"
_NAME_FIELD = "DCGM_FI_DEV_NAME"
_DRIVER_FIELD = "DCGM_FI_DRIVER_VERSION"
#: NVML's clock event reason bits, which DCGM reports unchanged.
_REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
_MAX_LABEL = 128


class DcgmUnavailable(RuntimeError):
    """DCGM cannot be used: bindings not installed, or no nv-hostengine answering."""


def _text(value: object) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return "".join(ch for ch in text if ch.isprintable()).strip()[:_MAX_LABEL]


class DcgmCollector:
    """Per-GPU health from a ``DcgmReader``: the same catalog metrics as the NVML collector."""

    def __init__(self, reader: Any, fields: Any, *, name: str = "gpu") -> None:
        self.name = name
        self._reader = reader
        self._ids: dict[str, int] = {
            n: int(getattr(fields, n)) for n in _all_field_names() if hasattr(fields, n)
        }
        self._lock = threading.Lock()
        self._identities: dict[int, GpuIdentity] = {}
        self._lost: set[int] = set()

    @staticmethod
    def field_ids(fields: Any) -> list[int]:
        """The DCGM field ids to watch: every known field the installed bindings define."""
        return [int(getattr(fields, n)) for n in _all_field_names() if hasattr(fields, n)]

    @classmethod
    def from_bindings(
        cls,
        *,
        paths: Sequence[str] | None = None,
        hostname: str = "localhost",
        update_interval_seconds: float = 1.0,
        nvlink_per_link: bool = False,
    ) -> DcgmCollector:
        """Load DCGM's bindings from their install paths and connect; DcgmUnavailable when impossible."""
        del nvlink_per_link  # DCGM's totals only; per-link needs the per-lane fields (not wired)
        candidates = list(paths) if paths is not None else _default_paths()
        found = next((p for p in candidates if Path(p, "DcgmReader.py").is_file()), None)
        if found is None:
            raise DcgmUnavailable(f"DCGM Python bindings not found in {', '.join(candidates)}")
        if found not in sys.path:
            sys.path.append(found)
        try:
            reader_module = importlib.import_module("DcgmReader")
            fields = importlib.import_module("dcgm_fields")
        except Exception as exc:
            raise DcgmUnavailable(f"cannot import DCGM bindings from {found}: {exc}") from exc
        try:
            reader = reader_module.DcgmReader(
                hostname=hostname,
                fieldIds=cls.field_ids(fields),
                updateFrequency=int(update_interval_seconds * 1_000_000),
            )
            reader.Init()
            if not reader.GetLatestGpuValuesAsFieldIdDict():
                raise DcgmUnavailable(f"nv-hostengine at {hostname} returned no GPU values (not running?)")
        except DcgmUnavailable:
            raise
        except Exception as exc:
            raise DcgmUnavailable(f"DCGM at {hostname}: {exc}") from exc
        return cls(reader, fields)

    def identities(self) -> list[GpuIdentity]:
        """The GPUs seen so far."""
        with self._lock:
            return [self._identities[k] for k in sorted(self._identities)]

    def collect(self) -> Iterable[Metric]:
        """One reading of every GPU DCGM watches; raises when DCGM answers nothing at all."""
        with self._lock:
            values: dict[int, dict[int, Any]] = self._reader.GetLatestGpuValuesAsFieldIdDict()
            if not values:
                raise DcgmUnavailable("DCGM returned no GPU values (nv-hostengine down?)")
            known = set(getattr(self._reader, "m_gpuIdToUUId", {}) or {}) | set(values)
            samples: list[Sample] = []
            for gpu_id in sorted(known):
                samples.extend(self._gpu(gpu_id, values.get(gpu_id)))
        return _families(samples)

    def _gpu(self, gpu_id: int, fv: dict[int, Any] | None) -> list[Sample]:
        identity = self._identity(gpu_id, fv or {})
        labels = identity.label_values() if identity else (str(gpu_id), "", "", "")
        if not fv:
            if gpu_id not in self._lost:
                self._lost.add(gpu_id)
                log.error(
                    "babysitter: DCGM has no values for GPU %d (%s); exporting gpu_up=0", gpu_id, labels[1]
                )
            return [(N.GPU_UP, labels, 0.0)]
        if gpu_id in self._lost:
            self._lost.discard(gpu_id)
            log.warning("babysitter: DCGM reports GPU %d again", gpu_id)
        out: list[Sample] = [(N.GPU_UP, labels, 1.0)]
        for field_name, (spec, extra, scale) in FIELDS.items():
            value = self._value(fv, field_name)
            if value is not None:
                out.append((spec, (*labels, *extra), value * scale))
        pending = self._value(fv, _PENDING_FIELD)
        if pending is not None:
            out.append((N.GPU_RETIRED_PAGES_PENDING, labels, 1.0 if pending > 0 else 0.0))
        reasons = next((r for r in (self._value(fv, n) for n in _REASONS_FIELDS) if r is not None), None)
        if reasons is not None:
            for label, _ in EXPORTED_CLOCK_EVENT_REASONS:
                active = 1.0 if int(reasons) & _REASON_BITS[label] else 0.0
                out.append((N.GPU_CLOCK_EVENT_ACTIVE, (*labels, label), active))
        return out

    def _value(self, fv: dict[int, Any], field_name: str) -> float | None:
        field_id = self._ids.get(field_name)
        if field_id is None or field_id not in fv:
            return None
        try:
            return float(fv[field_id])
        except (TypeError, ValueError):
            return None

    def _identity(self, gpu_id: int, fv: dict[int, Any]) -> GpuIdentity | None:
        if gpu_id in self._identities:
            return self._identities[gpu_id]
        uuid = _text((getattr(self._reader, "m_gpuIdToUUId", {}) or {}).get(gpu_id, ""))
        bus = _text((getattr(self._reader, "m_gpuIdToBusId", {}) or {}).get(gpu_id, ""))
        name_id = self._ids.get(_NAME_FIELD)
        model = _text(fv.get(name_id, "")) if name_id is not None else ""
        if not uuid or not bus or not model:
            return None
        try:
            identity = GpuIdentity(index=gpu_id, uuid=uuid, pci_bus_id=bus, model=model)
            identity.label_values()
        except ValueError:
            return None
        self._identities[gpu_id] = identity
        return identity

    def close(self) -> None:
        """Disconnect from the hostengine."""
        shutdown = getattr(self._reader, "Shutdown", None)
        if callable(shutdown):
            shutdown()


def _all_field_names() -> list[str]:
    return [*FIELDS, *_REASONS_FIELDS, _PENDING_FIELD, _NAME_FIELD, _DRIVER_FIELD]


def _default_paths() -> list[str]:
    extra = os.environ.get("BABYSITTER_DCGM_BINDINGS")
    return [extra, *BINDING_PATHS] if extra else list(BINDING_PATHS)
