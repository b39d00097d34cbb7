"""OTLP/HTTP push of a tracker's metrics, for sites that run an OpenTelemetry Collector.

The metrics are exactly the ones ``/metrics`` serves: every push collects the tracker's Prometheus
registry (the same families, names and labels) and converts them to OpenTelemetry's data model -
counters to cumulative monotonic sums named like the Prometheus sample (``train_steps_total``),
gauges and info metrics (value 1) to gauges, histograms to explicit-bucket histograms, summaries
to cumulative ``_sum``/``_count`` sums plus a gauge per quantile (the Python SDK has no summary
type) - then sends
them with opentelemetry-sdk's OTLP/HTTP exporter (protobuf). One path renders both exports, so they
cannot drift apart. Names are the catalog's (what ``docs/metrics.md`` lists), units the catalog's in
UCUM (``s``, ``By``, ``1``, ``{token}``, ``{flop}/s``), and the resource says which process sent
them: ``service.instance.id`` (``<run>/<rank>``: stable across restarts, so a backend's ``instance``
label does not churn), ``host.name``, ``babysitter.run`` and ``babysitter.rank``.

Pushes run on their own daemon thread, never on the training or housekeeping thread: a slow or
absent Collector delays only the next push. Failures are counted in
``babysitter_internal_errors_total{where="otlp"}`` and logged once. Needs
``opentelemetry-exporter-otlp-proto-http`` (checked at setup).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from babysitter import catalog
from babysitter._version import __version__
from babysitter.training.tracker import Tracker

__all__ = ["OtlpPusher", "families_to_metrics_data", "resource_attributes"]

log = logging.getLogger("babysitter")

_SCOPE = "babysitter"
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def _endpoint(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"OTLP endpoint must be an http(s) URL such as http://collector:4318, got {url!r}")
    if parsed.path.rstrip("/").endswith("/v1/metrics"):
        return url
    return url.rstrip("/") + "/v1/metrics"


def _unit(family: Any) -> str:
    """The family's catalog unit in UCUM; "" for a family the catalog does not list."""
    for name in (family.name, family.name + "_total", family.name + "_info"):
        try:
            return catalog.by_name(name).ucum
        except KeyError:
            continue
    return ""


def resource_attributes(run: str, rank: int, host: str | None = None) -> dict[str, str]:
    """The OTLP resource of one training rank (OpenTelemetry's service and host conventions)."""
    return {
        "service.name": "babysitter",
        "service.version": __version__,
        "service.instance.id": f"{run}/{rank}",
        "host.name": host if host is not None else socket.gethostname(),
        "babysitter.run": run,
        "babysitter.rank": str(rank),
    }


def families_to_metrics_data(
    families: Iterable[Any],
    *,
    start_time: float,
    now: float | None = None,
    resource: Mapping[str, str] | None = None,
) -> Any:
    """prometheus_client metric families -> an OpenTelemetry ``MetricsData`` with the same names."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    t_start = int(start_time * 1e9)
    t_now = int((time.time() if now is None else now) * 1e9)
    cumulative = AggregationTemporality.CUMULATIVE
    metrics: list[Any] = []
    for family in families:
        unit = _unit(family)
        if family.type == "histogram":
            metrics.append(_histogram(family, t_start, t_now, unit))
            continue
        by_name: dict[str, list[Any]] = {}
        for sample in family.samples:
            point = NumberDataPoint(
                attributes=dict(sample.labels),
                start_time_unix_nano=t_start,
                time_unix_nano=t_now,
                value=sample.value,
            )
            by_name.setdefault(sample.name, []).append(point)
        for name, points in by_name.items():
            cumulative_sample = (family.type == "counter" and name.endswith("_total")) or (
                family.type == "summary" and name.endswith(("_sum", "_count"))
            )
            if cumulative_sample:
                data: Any = Sum(data_points=points, aggregation_temporality=cumulative, is_monotonic=True)
            else:
                data = Gauge(data_points=points)
            # A summary's _count counts observations; its _sum and quantiles have the family's unit.
            sample_unit = "1" if family.type == "summary" and name.endswith("_count") else unit
            metrics.append(Metric(name=name, description=family.documentation, unit=sample_unit, data=data))
    scope = ScopeMetrics(scope=InstrumentationScope(_SCOPE, __version__), metrics=metrics, schema_url="")
    attrs = {"service.name": "babysitter", **(resource or {})}
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(resource=Resource.create(attrs), scope_metrics=[scope], schema_url="")
        ]
    )


def _histogram(family: Any, t_start: int, t_now: int, unit: str) -> Any:
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram, HistogramDataPoint, Metric

    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample in family.samples:
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        entry = series.setdefault(
            tuple(sorted(labels.items())), {"labels": labels, "buckets": [], "sum": 0.0}
        )
        if sample.name.endswith("_bucket"):
            entry["buckets"].append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_sum"):
            entry["sum"] = sample.value
        elif sample.name.endswith("_count"):
            entry["count"] = sample.value
    points = []
    for entry in series.values():
        cumulative = sorted(entry["buckets"])
        bounds = [le for le, _ in cumulative if le != float("inf")]
        counts: list[int] = []
        previous = 0.0
        for _, value in cumulative:
            counts.append(int(value - previous))
            previous = value
        total = int(entry.get("count", previous))
        points.append(
            HistogramDataPoint(
                attributes=entry["labels"],
                start_time_unix_nano=t_start,
                time_unix_nano=t_now,
                count=total,
                sum=entry["sum"],
                bucket_counts=counts,
                explicit_bounds=bounds,
                min=None,  # type: ignore[arg-type]  # unknown from Prometheus buckets; left unset in the protobuf
                max=None,  # type: ignore[arg-type]
            )
        )
    data = Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
    return Metric(name=family.name, description=family.documentation, unit=unit, data=data)


class OtlpPusher:
    """Pushes one tracker's metrics to an OTLP/HTTP endpoint every ``interval`` seconds.

    Args:
        tracker: the tracker whose Prometheus registry is pushed (set by ``watch()``).
        endpoint: the Collector's OTLP/HTTP URL (``http://host:4318``; ``/v1/metrics`` is appended).
        interval: seconds between pushes.
        headers: extra HTTP headers (authentication).
        timeout: seconds per push request.
    """

    def __init__(
        self,
        tracker: Tracker,
        endpoint: str,
        *,
        interval: float = 15.0,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ValueError(f"OTLP push interval must be a positive number of seconds, got {interval!r}")
        self.url = _endpoint(endpoint)
        try:
            import requests
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError as exc:
            from babysitter._install import pip_install_extra

            raise ValueError(
                "OTLP export needs the opentelemetry-exporter-otlp-proto-http package "
                f"({pip_install_extra('otlp')})"
            ) from exc
        session = requests.Session()
        # A loopback Collector (a sidecar) must not go through the site's HTTP proxy.
        session.trust_env = urllib.parse.urlsplit(self.url).hostname not in _LOOPBACK
        self._exporter = OTLPMetricExporter(
            endpoint=self.url, headers=dict(headers or {}), timeout=timeout, session=session
        )
        self.tracker = tracker
        self.interval = float(interval)
        self.timeout = float(timeout)
        self.pushes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        cfg = tracker.config
        self._resource = resource_attributes(cfg.run, cfg.rank.rank)

    def start(self) -> OtlpPusher:
        """Start the push thread; the tracker's close pushes once more and stops it."""
        self.tracker.add_close_hook(self.close)
        self._thread = threading.Thread(target=self._loop, name="babysitter-otlp", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.push()

    def push(self) -> bool:
        """Collect and send once; True on success. Never raises."""
        try:
            registry = self.tracker.registry
            if registry is None:
                return False
            data = families_to_metrics_data(
                registry.collect(), start_time=self.tracker.start_time, resource=self._resource
            )
            result = self._exporter.export(data)
            if getattr(result, "name", "") != "SUCCESS":
                self.tracker.errors.record(
                    "otlp", f"push to {self.url} failed ({getattr(result, 'name', result)})"
                )
                return False
            self.pushes += 1
            return True
        except Exception as exc:
            self.tracker.errors.record("otlp", exc)
            return False

    def close(self) -> None:
        """Stop the thread and push a last time (so short runs are not lost)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.timeout + 1.0)
        self.push()
        try:
            self._exporter.shutdown()
        except Exception as exc:
            self.tracker.errors.record("otlp", exc)
