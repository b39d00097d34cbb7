"""The Xid collector's state file: its counts and how far into the kernel log they go.

Without it, a restarted agent recounts the kernel ring buffer, which gives the same counts unless the
buffer has since dropped old records (it is a ring) or NVML reported Xids the kernel log did not: then
a counter would go down and Prometheus would read the drop as a reset and count the rest again. With
it, the agent restores its counts and counts only kernel records after the saved sequence number.

The state is valid for one boot (``/proc/sys/kernel/random/boot_id``) and one kernel-log path; it is
written atomically (temporary file, fsync, rename), so a crash leaves the old state or the new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

__all__ = ["StateError", "XidState", "boot_id", "load_state", "save_state"]

_VERSION = 1
_MAX_BYTES = 4 * 1024 * 1024
_MAX_ENTRIES = 4096
_MAX_LABEL = 256
_MAX_XID = 100_000
_BOOT_ID = "/proc/sys/kernel/random/boot_id"

#: (gpu, uuid, pci_bus_id, model, xid)
CountKey = tuple[str, str, str, str, int]


class StateError(ValueError):
    """The state file exists but cannot be used (corrupt, foreign, too large)."""


@dataclass(frozen=True)
class XidState:
    """What one agent counted in one boot.

    ``kmsg_seq`` is the sequence number of the last ``/dev/kmsg`` record whose Xid is in ``counts``
    (None: none yet). ``resumable`` is False once an Xid from a line without a sequence number (dmesg
    or journal text) was counted: such a line cannot be told apart from a new one after a restart,
    so that state is not restored and the log is counted again from its start.
    """

    boot_id: str
    kmsg_path: str
    kmsg_seq: int | None
    resumable: bool
    counts: dict[CountKey, int] = field(default_factory=dict)


def boot_id(path: str = _BOOT_ID) -> str:
    """This boot's id, or "" when the kernel does not say (then no state is ever restored)."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return ""


def load_state(path: str | Path) -> XidState | None:
    """The saved state, None when there is none; :class:`StateError` when the file is unusable."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(raw) > _MAX_BYTES:
        raise StateError(f"{path} is larger than {_MAX_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"{path} is not JSON: {exc}") from exc
    return _parse(data, str(path))


def save_state(path: str | Path, state: XidState) -> None:
    """Write ``state`` atomically (mode 0600); raises OSError."""
    target = Path(path)
    body = json.dumps(
        {
            "version": _VERSION,
            "boot_id": state.boot_id,
            "kmsg_path": state.kmsg_path,
            "kmsg_seq": state.kmsg_seq,
            "resumable": state.resumable,
            "counts": [
                {"gpu": k[0], "uuid": k[1], "pci_bus_id": k[2], "model": k[3], "xid": k[4], "value": v}
                for k, v in sorted(state.counts.items())
            ],
        },
        separators=(",", ":"),
    ).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a power cut once the dir is synced
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _parse(data: object, where: str) -> XidState:
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        raise StateError(f"{where}: not a version {_VERSION} Xid state file")
    boot, path, seq, resumable, rows = (
        data.get("boot_id"),
        data.get("kmsg_path"),
        data.get("kmsg_seq"),
        data.get("resumable"),
        data.get("counts"),
    )
    if not _label(boot) or not isinstance(path, str) or len(path) > 4096:
        raise StateError(f"{where}: bad boot_id or kmsg_path")
    if seq is not None and (not _int(seq) or seq < 0):
        raise StateError(f"{where}: bad kmsg_seq")
    if not isinstance(resumable, bool) or not isinstance(rows, list) or len(rows) > _MAX_ENTRIES:
        raise StateError(f"{where}: bad resumable flag or counts")
    counts: dict[CountKey, int] = {}
    for row in rows:
        if not isinstance(row, dict):
            raise StateError(f"{where}: bad count entry")
        labels = [row.get(name) for name in ("gpu", "uuid", "pci_bus_id", "model")]
        xid, value = row.get("xid"), row.get("value")
        if not all(_label(v, empty_ok=True) for v in labels):
            raise StateError(f"{where}: bad labels in a count entry")
        if not (_int(xid) and _int(value)) or not 0 < xid < _MAX_XID or value < 0:
            raise StateError(f"{where}: bad xid or value in a count entry")
        key = (str(labels[0]), str(labels[1]), str(labels[2]), str(labels[3]), xid)
        counts[key] = counts.get(key, 0) + value
    return XidState(str(boot), path, seq, resumable, counts)


def _label(value: object, *, empty_ok: bool = False) -> bool:
    return isinstance(value, str) and (empty_ok or bool(value)) and len(value) <= _MAX_LABEL


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
