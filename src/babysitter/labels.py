"""Label names and values from users and environments, checked at setup and bounded in size.

Label values end up in every series of a run; an unbounded or odd value (a path, a stack trace, a
newline) would blow up Prometheus' index or break the exposition format.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "MAX_LABELS",
    "MAX_VALUE_LENGTH",
    "RESERVED",
    "normalize_pci_bus_id",
    "sanitize_value",
    "validate_labels",
]

MAX_LABELS = 8
MAX_VALUE_LENGTH = 128
#: Names the tracker or the catalog already use, or that Prometheus treats specially.
RESERVED = frozenset(
    {"run", "rank", "le", "quantile", "cause", "phase", "where", "reason", "requested", "job", "instance"}
)
_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: C0, DEL and C1 controls (0x9b is CSI on terminals that read 8-bit controls), bidi marks, embeddings,
#: overrides and isolates (they reorder what a terminal or a dashboard shows), lone surrogates (not
#: UTF-8: the exposition could not encode them).
_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def sanitize_value(value: object) -> str:
    """``value`` as a label value: control characters (C0, DEL, C1) and bidi controls removed, at
    most :data:`MAX_VALUE_LENGTH` chars."""
    text = _BAD_CHARS.sub("", str(value)).strip()
    return text[:MAX_VALUE_LENGTH]


def validate_labels(labels: Mapping[str, object] | None) -> dict[str, str]:
    """Check user constant labels at setup; raise ValueError with the reason for any bad one."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of label name to value, got {type(labels).__name__}")
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} constant labels are allowed, got {len(labels)}")
    clean: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("__"):
            raise ValueError(f"invalid label name {name!r}: use [a-zA-Z_][a-zA-Z0-9_]*, not starting with __")
        if name in RESERVED:
            raise ValueError(f"label name {name!r} is reserved by babysitter; pick another name")
        if value is None:
            raise ValueError(f"label {name!r} is None: pass its value as a string")
        text = sanitize_value(value)
        if not text:
            raise ValueError(f"label {name!r} has an empty value")
        clean[name] = text
    return clean


def normalize_pci_bus_id(bus_id: str) -> str:
    """One spelling for a PCI address: NVML's ``00000000:9B:00.0`` and the kernel log's ``0000:9b:00``
    both become ``0000:9b:00``, so Xid lines, a rank's ``train_info`` and the node agent's GPU series
    name the same GPU the same way; ValueError for anything else."""
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    text = text.split(".", 1)[0]
    parts = text.split(":")
    if len(parts) == 3:
        domain, bus, device = parts
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"
    if len(parts) == 2:
        bus, device = parts
        return f"0000:{int(bus, 16):02x}:{int(device, 16):02x}"
    raise ValueError(f"not a PCI bus id: {bus_id!r}")
