"""Alertmanager's webhook payload (version 4), parsed into bounded, typed alerts.

Everything in a payload is untrusted: the sizes are capped, label names must be Prometheus label
names, and values are kept verbatim (an action that puts one into a scheduler argument checks it
against that scheduler's own syntax first, see :mod:`babysitter.remediate.targets`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

__all__ = ["Alert", "Notification", "PayloadError", "parse_notification", "parse_time"]

MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_VALUE = 1024
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,127}$")
_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


class PayloadError(ValueError):
    """The request body is not an Alertmanager webhook payload this receiver accepts."""


@dataclass(frozen=True)
class Alert:
    """One alert of a notification; ``starts_at``/``ends_at`` in Unix seconds (``ends_at`` None if unset)."""

    status: str  # firing | resolved
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    ends_at: float | None
    fingerprint: str

    @property
    def name(self) -> str:
        """The alert name (``alertname`` label)."""
        return self.labels.get("alertname", "")

    @property
    def key(self) -> str:
        """Identity of one firing episode: the same alert re-sent in later notifications has the same key."""
        return f"{self.fingerprint}@{self.starts_at:.3f}"

    def describe(self) -> dict[str, object]:
        """What the audit log keeps of the alert."""
        return {
            "name": self.name,
            "status": self.status,
            "labels": dict(self.labels),
            "starts_at": self.starts_at,
            "fingerprint": self.fingerprint,
            "summary": self.annotations.get("summary", ""),
        }


@dataclass(frozen=True)
class Notification:
    """One webhook request: its group and its alerts (firing and resolved)."""

    group_key: str
    receiver: str
    alerts: tuple[Alert, ...] = field(default_factory=tuple)


def parse_time(text: str) -> float | None:
    """An RFC 3339 time as Alertmanager writes it (ns digits) in Unix seconds; None for Go's zero time."""
    match = _TIME.fullmatch(text)
    if match is None:
        raise PayloadError(f"not an RFC 3339 time: {text[:40]!r}")
    base, frac, zone = match.groups()
    if base.startswith("0001-"):
        return None
    parsed = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    return parsed.replace(tzinfo=parsed.tzinfo or timezone.utc).timestamp() + float(f"0.{frac or 0}")


def _str_map(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(f"{what} is not an object")
    if len(value) > MAX_LABELS:
        raise PayloadError(f"{what} has {len(value)} entries (at most {MAX_LABELS})")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _LABEL_NAME.fullmatch(key):
            raise PayloadError(f"{what}: bad label name {str(key)[:40]!r}")
        if not isinstance(item, str):
            raise PayloadError(f"{what}.{key} is not a string")
        if len(item) > MAX_VALUE:
            raise PayloadError(f"{what}.{key} is longer than {MAX_VALUE} characters")
        out[key] = item
    return out


def _fingerprint(labels: Mapping[str, str]) -> str:
    text = "\x00".join(f"{k}\x01{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _alert(item: object) -> Alert:
    if not isinstance(item, dict):
        raise PayloadError("an alert is not an object")
    status = item.get("status")
    if status not in ("firing", "resolved"):
        raise PayloadError(f"alert status {str(status)[:20]!r} is neither firing nor resolved")
    labels = _str_map(item.get("labels"), "labels")
    if not labels.get("alertname"):
        raise PayloadError("an alert has no alertname label")
    starts = item.get("startsAt")
    if not isinstance(starts, str):
        raise PayloadError("an alert has no startsAt")
    starts_at = parse_time(starts)
    if starts_at is None:
        raise PayloadError("an alert's startsAt is the zero time")
    ends = item.get("endsAt")
    ends_at = parse_time(ends) if isinstance(ends, str) else None
    fingerprint = item.get("fingerprint")
    if not isinstance(fingerprint, str) or not re.fullmatch(r"[0-9a-fA-F]{1,64}", fingerprint):
        fingerprint = _fingerprint(labels)
    return Alert(
        status=status,
        labels=labels,
        annotations=_str_map(item.get("annotations"), "annotations"),
        starts_at=starts_at,
        ends_at=ends_at,
        fingerprint=fingerprint,
    )


def parse_notification(body: object) -> Notification:
    """The alerts of one webhook payload; PayloadError says what is wrong with it."""
    if not isinstance(body, dict):
        raise PayloadError("the payload is not a JSON object")
    version = body.get("version")
    if version is not None and version != "4":
        raise PayloadError(f"webhook payload version {str(version)[:10]!r} (this receiver reads version 4)")
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("the payload has no 'alerts' list")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError(f"{len(alerts)} alerts in one notification (at most {MAX_ALERTS})")
    group_key = body.get("groupKey", "")
    receiver = body.get("receiver", "")
    return Notification(
        group_key=str(group_key)[:MAX_VALUE],
        receiver=str(receiver)[:200],
        alerts=tuple(_alert(item) for item in alerts),
    )
