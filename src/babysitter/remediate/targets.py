"""From an alert's labels to scheduler arguments, checked against each scheduler's own syntax.

A label value reaches a scheduler only as one argv element or one API field, never through a shell,
and only after it matched a strict pattern: a host such as ``n[1-512]`` or ``n1,n2`` would be a host
*list* to Slurm, so brackets, commas and spaces are refused outright.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from babysitter.remediate.policy import Hosts

__all__ = ["host_of", "render_reason", "valid_host", "valid_job"]

_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})$")
_JOB = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9})?$")  # Slurm job id, array task ids as 123_4
_POD = re.compile(r"^[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?/[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?$")
_FIELD = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)\}")
_UNSAFE = re.compile(r"[^\w .:/@+()#=-]")
MAX_REASON = 200


def valid_host(name: str) -> bool:
    """A single node name (DNS-ish characters only; no host lists, no spaces)."""
    return bool(_HOST.match(name))


def valid_job(job: str) -> bool:
    """A Slurm job id (``123`` or ``123_4``) or a Kubernetes ``namespace/pod``."""
    return bool(_JOB.match(job) or _POD.match(job))


def host_of(labels: Mapping[str, str], hosts: Hosts) -> str | None:
    """The node an alert is about, or None when the label is missing or does not give a valid name."""
    value = labels.get(hosts.label)
    if not value:
        return None
    match = hosts.pattern.fullmatch(value)
    if match is None or match.group(1) is None:
        return None
    name = match.group(1)
    return name if valid_host(name) else None


def render_reason(template: str, labels: Mapping[str, str], *, prefix: str = "babysitter: ") -> str:
    """The reason text for the scheduler: ``{label}`` fields filled from the alert, odd characters dropped.

    Always starts with ``prefix``, which is how an undrain recognizes a drain of its own.
    """

    def fill(match: re.Match[str]) -> str:
        return _UNSAFE.sub("", labels.get(match.group(1), "unknown"))[:64]

    text = _UNSAFE.sub("", _FIELD.sub(fill, template))
    return (prefix + " ".join(text.split()))[:MAX_REASON]
