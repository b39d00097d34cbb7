"""One registration: what a tracker writes, and the checks every field passes before the agent uses it.

Every value comes from a file any local user can write, so each field is bounded here: a pid in the
kernel's range, a finite start time, a run name in the tracker's own alphabet, ranks that fit an
int32, and a URL that can only point at a literal IP address (or ``localhost``) on an explicit port.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MAX_PID", "SCHEMA", "Endpoint", "Target", "parse_endpoint", "parse_target"]

SCHEMA = 1
#: Linux's PID_MAX_LIMIT (2^22): no pid is larger.
MAX_PID = 4_194_304
_MAX_RANK = 2**31 - 1
_MAX_URL = 512
_RUN = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_PATH = re.compile(r"^/[A-Za-z0-9_./-]{0,255}$")


@dataclass(frozen=True)
class Endpoint:
    """One registered metrics endpoint of a training process."""

    pid: int
    start_time: float
    url: str
    run: str
    rank: int
    local_rank: int

    @property
    def name(self) -> str:
        """File name of the registration: unique per process and URL."""
        return f"{self.pid}-{parse_target(self.url).port}.json"


@dataclass(frozen=True)
class Target:
    """Where a registration URL points: no user info, no query, a literal address, an explicit port."""

    scheme: str
    host: str
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    path: str


def parse_target(url: str) -> Target:
    """Split and check a registration URL; ValueError saying what is wrong with it.

    ``localhost`` is taken to mean 127.0.0.1 (RFC 6761), never looked up: the address checked is the
    address connected to, so no resolver or /etc/hosts entry can redirect the agent.
    """
    if not isinstance(url, str) or len(url) > _MAX_URL or not url.isascii() or not url.isprintable():
        raise ValueError("url must be a printable ASCII string of at most 512 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"url scheme {parts.scheme!r} is not http or https")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ValueError("url must not carry user info, a query or a fragment")
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"url port: {exc}") from None
    if port is None or not 1 <= port <= 65535:
        raise ValueError("url needs an explicit port 1..65535")
    path = parts.path or "/"
    if not _PATH.fullmatch(path):
        raise ValueError("url path has unexpected characters")
    if host == "localhost":
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address("127.0.0.1")
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"url host {host!r} is not an IP address or localhost") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return Target(parts.scheme, host, address, port, path)


def _int(data: dict[str, Any], key: str, low: int, high: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer in {low}..{high}, got {value!r}"[:200])
    return value


def parse_endpoint(data: object) -> Endpoint:
    """The endpoint a decoded registration file describes; ValueError naming the first bad field."""
    if not isinstance(data, dict):
        raise ValueError(f"registration must be a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"unknown schema {data.get('schema')!r}"[:200])
    start = data.get("start_time")
    if (
        isinstance(start, bool)
        or not isinstance(start, (int, float))
        or not math.isfinite(start)
        or start <= 0
    ):
        raise ValueError(f"start_time must be a positive finite number, got {start!r}"[:200])
    run = data.get("run")
    if not isinstance(run, str) or not _RUN.fullmatch(run):
        raise ValueError(f"run must be 1-128 characters of [A-Za-z0-9_.:-], got {run!r}"[:200])
    url = data.get("url")
    parse_target(url)  # type: ignore[arg-type]
    return Endpoint(
        pid=_int(data, "pid", 1, MAX_PID),
        start_time=float(start),
        url=str(url),
        run=run,
        rank=_int(data, "rank", 0, _MAX_RANK),
        local_rank=_int(data, "local_rank", 0, _MAX_RANK),
    )
