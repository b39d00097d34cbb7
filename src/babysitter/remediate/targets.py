"""From an alert's labels to scheduler arguments, checked against each scheduler's own syntax.

A label value reaches a scheduler only as one argv element or one API field, never through a shell,
and only after it matched a strict pattern: a host such as ``n[1-512]`` or ``n1,n2`` would be a host
*list* to Slurm, so brackets, commas and spaces are refused outright.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from babysitter.remediate.alerts import Alert
from babysitter.remediate.policy import Hosts

__all__ = ["CULPRIT_ANNOTATION", "culprit_hosts", "host_of", "render_reason", "valid_host", "valid_job"]

#: The annotation a stall page names its culprits' hosts in (``generate/collectives.py``), comma separated.
CULPRIT_ANNOTATION = "culprit_hosts"

_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})$")
_JOB = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9})?$")  # Slurm job id, array task ids as 123_4
_POD = re.compile(r"^[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?/[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?$")
_FIELD = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)\}")
_UNSAFE = re.compile(r"[^\w .:/@+()#=-]")
MAX_REASON = 200


def valid_host(name: str) -> bool:
    """A single node name (DNS-ish characters only; no host lists, no spaces)."""
    return bool(_HOST.fullmatch(name))


def valid_job(job: str) -> bool:
    """A Slurm job id (``123`` or ``123_4``) or a Kubernetes ``namespace/pod``."""
    return bool(_JOB.fullmatch(job) or _POD.fullmatch(job))


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


def culprit_hosts(alert: Alert, hosts: Hosts, limit: int) -> tuple[list[str], str]:
    """The node names of the hosts an alert names as its culprits, and why (the text for the audit).

    Only the ``culprit_hosts`` annotation counts: the ranks a hung collective waits for, never the
    ranks that wait. Empty (with the reason) when it names none, a name is not a valid node, or it
    names more than ``limit`` hosts.
    """
    annotations = alert.annotations
    summary = str(annotations.get("summary", ""))[:300]
    raw = str(annotations.get(CULPRIT_ANNOTATION, ""))
    found: list[str] = []
    for value in (part.strip() for part in raw.split(",")):
        if not value:
            continue
        name = host_of({hosts.label: value}, hosts)
        if name is None:
            return [], f"culprit host {value[:64]!r} is not a valid node name"
        if name not in found:
            found.append(name)
    if not found:
        return (
            [],
            f"the alert names no culprit host ({CULPRIT_ANNOTATION} is empty: no rank was found behind)",
        )
    if len(found) > limit:
        return [], f"the alert names {len(found)} culprit hosts ({', '.join(found[:8])}), more than {limit}"
    return found, f"culprit of the stall: {summary}" if summary else "culprit of the stall"


def render_reason(template: str, labels: Mapping[str, str], *, prefix: str = "babysitter: ") -> str:
    """The reason text for the scheduler: ``{label}`` fields filled from the alert, odd characters dropped.

    Always starts with ``prefix``, which is how an undrain recognizes a drain of its own.
    """

    def fill(match: re.Match[str]) -> str:
        return _UNSAFE.sub("", labels.get(match.group(1), "unknown"))[:64]

    text = _UNSAFE.sub("", _FIELD.sub(fill, template))
    return (prefix + " ".join(text.split()))[:MAX_REASON]
