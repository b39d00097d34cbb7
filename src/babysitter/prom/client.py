"""The one client of Prometheus' HTTP API that babysitter's readers share (urllib only, no dependency).

``babysitter top``, ``babysitter scorecard`` and the remediator's job map ask Prometheus through it;
it works against Prometheus and the servers that speak its API (Thanos Query, Mimir,
VictoriaMetrics). Queries are POSTed as a form, so a long scorecard expression never meets a URL
length limit. Every response is read up to ``max_bytes``, and every failure (unreachable, an HTTP
error, a body too large or not JSON, a rejected query, a result that is not a vector) is a
:class:`PromError` whose message names the server and, for a rejected query, the query.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_MAX_BYTES", "PromClient", "PromError", "Sample", "finite"]

#: The largest response read by default: a frame of ``babysitter top`` over thousands of hosts fits.
DEFAULT_MAX_BYTES = 32 * 1024 * 1024


class PromError(RuntimeError):
    """Prometheus could not be reached, or rejected a query (the message says which and why)."""


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector: its labels and value (NaN for NaN)."""

    labels: dict[str, str]
    value: float


class PromClient:
    """Instant queries and active alerts of ``url`` (``http(s)://host:port[/prefix]``)."""

    def __init__(self, url: str, *, timeout: float = 60.0, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
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

    def alerts(self) -> list[dict[str, Any]]:
        """The active (pending and firing) alerts, as the API returns them; PromError on failure."""
        body = self._call("/api/v1/alerts", what="")
        data = body.get("data")
        raw = data.get("alerts") if isinstance(data, dict) else None
        if not isinstance(raw, list):
            raise PromError(f"{self.url}/api/v1/alerts: no alert list in the response")
        return [item for item in raw if isinstance(item, dict)]

    def _call(
        self, path: str, *, what: str, data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        request = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
            self.url + path, data=data, headers={"Accept": "application/json", **(headers or {})}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - scheme checked in __init__
                raw = response.read(self.max_bytes + 1)
        except urllib.error.HTTPError as exc:
            raise PromError(f"{self.url}: HTTP {exc.code}: {_error_text(exc)}{what}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PromError(f"{self.url}: {exc}") from exc
        if len(raw) > self.max_bytes:
            raise PromError(f"{self.url}{path}: response larger than {self.max_bytes} bytes{what}")
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
