"""Dense peak FLOP/s of the device a rank trains on, for MFU.

``lookup_peak(name, dtype)`` maps a device name as NVML, torch, rocm-smi or JAX spell it, and a
training dtype, to a row of a table that cites its source for every number. An unknown device, or a
dtype the device has no peak for, gives ``None`` and one warning: no MFU is better than a wrong one
(a guessed A100 fallback is how users got 150% MFU on MI350X and 7x on B300).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from babysitter.hardware._detect import detect_device_name
from babysitter.hardware._dtypes import DTYPES, matmul_dtype, normalize_dtype
from babysitter.hardware._names import SPELLINGS, DeviceMatch, canonical_device, did_you_mean
from babysitter.hardware._table import PEAK_TABLE, PeakRow

__all__ = [
    "DTYPES",
    "PEAK_TABLE",
    "SPELLINGS",
    "DeviceMatch",
    "PeakEntry",
    "PeakRow",
    "canonical_device",
    "describe_rows",
    "detect_device_name",
    "did_you_mean",
    "lookup_peak",
    "matmul_dtype",
    "normalize_dtype",
    "peak_flops",
]

_log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


@dataclass(frozen=True)
class PeakEntry:
    """One device's dense peak for one dtype: ``device`` is the table's row name (``"H100 SXM"``)."""

    device: str
    dtype: str
    flops_per_second: float
    source: str


def _warn_once(key: tuple[str, str], message: str, *args: object) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    _log.warning(message, *args)


def describe_rows(rows: tuple[str, ...] | list[str], dtype: str) -> str:
    """``'H100 SXM' (989.5 TFLOP/s bf16), 'H100 PCIe' (756 TFLOP/s bf16)``: table rows with their dense
    peak for ``dtype`` (a normalized spelling), for a message that asks to pick one."""
    out = []
    for name in rows:
        value = PEAK_TABLE[name].peaks.get(dtype) if name in PEAK_TABLE else None
        out.append(f"{name!r}" + ("" if value is None else f" ({value / 1e12:g} TFLOP/s {dtype})"))
    return ", ".join(out)


def lookup_peak(device_name: str, dtype: str) -> PeakEntry | None:
    """The dense peak of ``device_name`` (any usual spelling) for ``dtype`` (any :func:`normalize_dtype`
    spelling), or None with one warning per (device, dtype) when the table has none.

    Raises ValueError only for a dtype spelling nobody uses, which is a setup error.
    """
    key = normalize_dtype(dtype)
    match = canonical_device(device_name)
    if match.device is None:
        close = did_you_mean(device_name)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        if match.choices:
            hint = f"name one of {describe_rows(match.choices, key)}; or "
        _warn_once(
            (device_name, key),
            "no peak FLOP/s for device %r (%s): MFU is not reported; %spass peak_flops= or a device "
            "name from the table (%s)",
            device_name,
            match.reason,
            hint,
            ", ".join(PEAK_TABLE),
        )
        return None
    row = PEAK_TABLE[match.device]
    value = row.peaks.get(key)
    if value is None:
        _warn_once(
            (device_name, key),
            "device %r (%s) has no published dense %s peak (it has: %s): MFU is not reported; pass "
            "peak_flops= to set one",
            device_name,
            row.device,
            key,
            ", ".join(row.peaks),
        )
        return None
    return PeakEntry(device=row.device, dtype=key, flops_per_second=value, source=row.source)


def peak_flops(dtype: object, device_name: str | None = None) -> PeakEntry | None:
    """The peak of this process's device (detected when ``device_name`` is None) for ``dtype``;
    fp32 counts as tf32 when torch runs fp32 matmuls on TF32 tensor cores. Never raises for a
    missing device (None and one warning); raises ValueError for an unknown dtype spelling."""
    key = matmul_dtype(dtype)
    name = device_name if device_name is not None else detect_device_name()
    if name is None:
        _warn_once(("", key), "no accelerator detected: MFU is not reported; pass peak_flops= to set one")
        return None
    return lookup_peak(name, key)
