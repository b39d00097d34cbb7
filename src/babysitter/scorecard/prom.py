"""A minimal client of Prometheus' HTTP query API (urllib only: the scorecard adds no dependency).

Works against Prometheus and the servers that speak its API (Thanos Query, Mimir, VictoriaMetrics).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

__all__ = ["PromClient", "PromError", "Sample"]


class PromError(RuntimeError):
    """Prometheus could not be reached, or rejected a query (the message says which and why)."""


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector: its labels and value (NaN for NaN)."""

    labels: dict[str, str]
    value: float


class PromClient:
    """Instant queries against ``url`` (``http(s)://host:port[/prefix]``)."""

    def __init__(self, url: str, *, timeout: float = 60.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"--prometheus must be an http(s) URL, got {url!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """The instant vector of ``expr`` at Unix time ``at`` (default: now); PromError on failure."""
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(float(at))
        data = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
            f"{self.url}/api/v1/query",
            data=data,
            headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - scheme checked in __init__
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise PromError(f"{self.url}: HTTP {exc.code}: {_error_text(exc)} (query: {expr})") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PromError(f"{self.url}: {exc}") from exc
        if body.get("status") != "success":
            raise PromError(f"{self.url}: {body.get('errorType')}: {body.get('error')} (query: {expr})")
        result = body.get("data", {})
        if result.get("resultType") != "vector":
            raise PromError(f"{self.url}: expected a vector, got {result.get('resultType')} (query: {expr})")
        samples = []
        for item in result.get("result", []):
            raw = item["value"][1]
            value = float(raw) if raw not in ("NaN", "+Inf", "-Inf") else float(raw.replace("+", ""))
            samples.append(Sample(dict(item.get("metric", {})), value))
        return samples


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
        return f"{body.get('errorType')}: {body.get('error')}"
    except Exception:
        return str(exc.reason)


def finite(value: float | None) -> float | None:
    """``value`` unless it is NaN or infinite (0/0 in PromQL)."""
    return value if value is not None and math.isfinite(value) else None
