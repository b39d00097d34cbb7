"""The one client of Prometheus' HTTP API that babysitter's readers share (urllib only, no dependency).

``babysitter top``, ``babysitter scorecard`` and the remediator's job map ask Prometheus through it;
it works against Prometheus and the servers that speak its API (Thanos Query, Mimir,
VictoriaMetrics). Queries are POSTed as a form, so a long scorecard expression never meets a URL
length limit. Every response is read up to ``max_bytes``, and every failure (unreachable, an HTTP
error, a body too large or not JSON, a rejected query, a result that is not a vector) is a
:class:`PromError` whose message names the server and, for a rejected query, the query.

Each request ends within ``timeout`` seconds from connect to its last byte, however slowly the server
drips (:mod:`babysitter.prom.deadline`), and a client given a command's :class:`Deadline` gives each
request only what is left of it: a command that asks many queries ends by its deadline too.
"""

from __future__ import annotations

import copy
import errno
import json
import math
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from babysitter.prom.deadline import Deadline, open_until

__all__ = ["DEFAULT_MAX_BYTES", "Deadline", "PromClient", "PromError", "Sample", "fetch", "finite"]

#: Connect errors that say nothing answers at the address (with refused and an unknown host name).
_NO_ROUTE = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL})

#: The largest response read by default: a frame of ``babysitter top`` over thousands of hosts fits.
DEFAULT_MAX_BYTES = 32 * 1024 * 1024


class PromError(RuntimeError):
    """Prometheus could not be reached, or rejected a query (the message says which and why).

    ``kind`` says which, for a command to add what to do: ``unreachable`` (nothing answered at the
    address: refused, no such host, no route), ``timeout`` (no complete answer in time), ``answer``
    (anything else: an error status, a body that is not Prometheus' API, a connection cut).
    """

    def __init__(self, message: str, *, kind: str = "answer") -> None:
        super().__init__(message)
        self.kind = kind

    def advice(self, flag: str = "--prometheus") -> str:
        """What to do, to append to the message ("" when it answered: its message says why), for a
        command whose ``flag`` names the server."""
        if self.kind == "unreachable":
            return f"; start it, or point at the right one with {flag} URL"
        if self.kind == "timeout":
            return (
                "; it is slow or overloaded: give it longer with --timeout SECONDS (and --deadline), or "
                f"point at another with {flag} URL"
            )
        return ""


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector: its labels and value (NaN for NaN)."""

    labels: dict[str, str]
    value: float


def _timed_out(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)


def fetch(
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    deadline: Deadline | None = None,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    name: str | None = None,
    what: str = "",
) -> bytes:
    """The body of ``url`` (GET, or POST with ``data``), all of it within ``timeout`` seconds and what
    is left of ``deadline``; PromError for any failure (naming ``name``, the URL by default; ``what``
    said of a request cut by its deadline), HTTPError for a status."""
    name = name or url
    limit = timeout
    if deadline is not None:
        left = deadline.remaining()
        if left <= 0:
            raise PromError(f"{name}: the command's deadline of {deadline.seconds:g} s has passed{what}")
        limit = min(limit, left)
    request = urllib.request.Request(url, data=data, headers=headers or {})  # noqa: S310 - schemes checked by callers
    try:
        _, raw = open_until(request, limit, max_bytes=max_bytes)
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if _timed_out(exc):
            raise PromError(f"{name}: no complete answer within {limit:g} s{what}", kind="timeout") from exc
        reason = getattr(exc, "reason", exc)  # urllib wraps the socket's error in a URLError
        if isinstance(reason, ConnectionRefusedError):
            raise PromError(
                f"{name}: Connection refused: nothing listens there (is Prometheus running at that "
                "address and port?)",
                kind="unreachable",
            ) from exc
        if isinstance(reason, socket.gaierror) or getattr(reason, "errno", None) in _NO_ROUTE:
            raise PromError(f"{name}: cannot connect: {reason}", kind="unreachable") from exc
        raise PromError(f"{name}: {exc}") from exc
    if len(raw) > max_bytes:
        raise PromError(f"{url}: response larger than {max_bytes} bytes{what}")
    return raw


class PromClient:
    """Instant queries and active alerts of ``url`` (``http(s)://host:port[/prefix]``); each request
    within ``timeout`` seconds, all of them within ``deadline`` when one is given."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        deadline: Deadline | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(
                f"the Prometheus URL must be http(s)://host:port[/prefix] (e.g. http://127.0.0.1:9090), "
                f"got {url!r}"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.deadline = deadline

    def within(self, deadline: Deadline | None) -> PromClient:
        """The same client for one command (a frame, an explanation): its requests share ``deadline``."""
        bounded = copy.copy(self)
        bounded.deadline = deadline
        return bounded

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """The instant vector of ``expr`` at Unix time ``at`` (default: now); PromError on failure."""
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(float(at))
        body = self._call(
            "/api/v1/query",
            data=urllib.parse.urlencode(params).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            what=f" (query: {expr})",
        )
        result = body.get("data")
        if not isinstance(result, dict) or result.get("resultType") != "vector":
            kind = result.get("resultType") if isinstance(result, dict) else None
            raise PromError(f"{self.url}: expected a vector, got {kind} (query: {expr})")
        samples = []
        for item in result.get("result") or ():
            try:
                labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
                samples.append(Sample(labels, float(item["value"][1])))
            except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
                raise PromError(f"{self.url}: malformed sample {str(item)[:200]} (query: {expr})") from exc
        return samples

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The range query's series, as the API returns them (``[{metric, values}]``); PromError on
        failure. The caller bounds how many it keeps: ``max_bytes`` already bounds the answer."""
        params = {"query": expr, "start": repr(float(start)), "end": repr(float(end)), "step": f"{step:g}"}
        body = self._call(
            "/api/v1/query_range",
            data=urllib.parse.urlencode(params).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            what=f" (query: {expr})",
        )
        result = body.get("data")
        if not isinstance(result, dict) or result.get("resultType") != "matrix":
            kind = result.get("resultType") if isinstance(result, dict) else None
            raise PromError(f"{self.url}: expected a matrix, got {kind} (query: {expr})")
        return [item for item in result.get("result") or () if isinstance(item, dict)]

    def alerts(self) -> list[dict[str, Any]]:
        """The active (pending and firing) alerts, as the API returns them; PromError on failure."""
        body = self._call("/api/v1/alerts", what="")
        data = body.get("data")
        raw = data.get("alerts") if isinstance(data, dict) else None
        if not isinstance(raw, list):
            raise PromError(f"{self.url}/api/v1/alerts: no alert list in the response")
        return [item for item in raw if isinstance(item, dict)]

    def recording_rules(self) -> set[str]:
        """Names of the recording rules the server evaluates (``/api/v1/rules``); PromError on failure."""
        body = self._call("/api/v1/rules?type=record", what="")
        data = body.get("data")
        groups = data.get("groups") if isinstance(data, dict) else None
        if not isinstance(groups, list):
            raise PromError(f"{self.url}/api/v1/rules: no rule groups in the response")
        names = set()
        for group in groups:
            for rule in (group.get("rules") or ()) if isinstance(group, dict) else ():
                if (
                    isinstance(rule, dict)
                    and rule.get("type") == "recording"
                    and isinstance(rule.get("name"), str)
                ):
                    names.add(rule["name"])
        return names

    def _call(
        self, path: str, *, what: str, data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        try:
            raw = fetch(
                self.url + path,
                timeout=self.timeout,
                max_bytes=self.max_bytes,
                deadline=self.deadline,
                data=data,
                headers={"Accept": "application/json", **(headers or {})},
                name=self.url,
                what=what,
            )
        except urllib.error.HTTPError as exc:
            raise PromError(f"{self.url}: HTTP {exc.code}: {_error_text(exc)}{what}") from exc
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise PromError(f"{self.url}{path}: not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise PromError(f"{self.url}{path}: not a JSON object")
        if body.get("status") != "success":
            raise PromError(f"{self.url}: {body.get('errorType')}: {body.get('error')}{what}")
        return body


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(64 * 1024))
        return f"{body.get('errorType')}: {body.get('error')}"
    except Exception:
        return str(exc.reason)


def finite(value: float | None) -> float | None:
    """``value`` unless it is None, NaN or infinite (0/0 in PromQL)."""
    return value if value is not None and math.isfinite(value) else None
