"""OTLP/HTTP push: a receiver in the test decodes the protobuf and must see what /metrics shows."""

from __future__ import annotations

import gzip
import http.server
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from prometheus_client.parser import text_string_to_metric_families

import babysitter
from babysitter.catalog import train as T
from babysitter.training.otlp import OtlpPusher

Key = tuple[str, tuple[tuple[str, str], ...]]
# Rates over a window that ends "now": they move between two reads, even of an idle tracker.
_TIME_DEPENDENT = {T.MFU.name, T.HFU.name}


class Receiver:
    """An OTLP/HTTP metrics endpoint on 127.0.0.1 that keeps every decoded request."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.status = status
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/metrics" and self.headers["Content-Type"] == "application/x-protobuf":
                    request = ExportMetricsServiceRequest()
                    request.ParseFromString(body)
                    receiver.requests.append(request)
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _attrs(point: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((a.key, a.value.string_value) for a in point.attributes))


def decode(request: ExportMetricsServiceRequest) -> dict[Key, float]:
    """OTLP points as Prometheus samples would name them (histograms back to cumulative buckets)."""
    out: dict[Key, float] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind in ("sum", "gauge"):
                    for p in getattr(m, kind).data_points:
                        value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                        out[(m.name, _attrs(p))] = value
                elif kind == "histogram":
                    assert m.histogram.aggregation_temporality == 2  # cumulative
                    for p in m.histogram.data_points:
                        attrs = _attrs(p)
                        running = 0
                        bounds = [*p.explicit_bounds, float("inf")]
                        for bound, count in zip(bounds, p.bucket_counts, strict=True):
                            running += count
                            le = "+Inf" if bound == float("inf") else repr(float(bound))
                            out[(m.name + "_bucket", tuple(sorted((*attrs, ("le", le)))))] = running
                        out[(m.name + "_count", attrs)] = p.count
                        out[(m.name + "_sum", attrs)] = p.sum
    return out


def scrape(url: str) -> dict[Key, float]:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback test URL
        text = response.read().decode()
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_push_carries_the_same_names_labels_and_values_as_metrics(receiver: Receiver, tmp_path: Path) -> None:
    tracker = babysitter.watch(
        run="otlp", port=0, peak_flops=1e12, flops_per_token=100.0, labels={"cluster": "a"}, hang_timeout=60.0
    )
    try:
        for i in range(5):
            tracker.step(tokens=64, samples=2, loss=float(i))
        with tracker.checkpoint_save(step=5, nbytes=123):
            pass
        with tracker.phase("eval"):
            pass
        pusher = OtlpPusher(tracker, receiver.url, interval=3600)
        assert tracker.metrics_url is not None
        scraped = scrape(tracker.metrics_url)
        assert pusher.push()
        pushed = decode(receiver.requests[-1])
    finally:
        tracker.close()
    assert set(pushed) == set(scraped)  # every name and label set, nothing more
    for key, value in scraped.items():
        if key[0] in _TIME_DEPENDENT or key[0] == "train_stalled_seconds":
            continue
        assert pushed[key] == pytest.approx(value), key
    assert pushed[(T.STEPS.name, (("cluster", "a"), ("rank", "0"), ("run", "otlp")))] == 5
    resource = {
        a.key: a.value.string_value for a in receiver.requests[-1].resource_metrics[0].resource.attributes
    }
    assert resource["babysitter.run"] == "otlp" and resource["service.name"] == "babysitter"


def test_watch_pushes_periodically_and_once_more_at_close(receiver: Receiver) -> None:
    tracker = babysitter.watch(
        run="otlp2", port=-1, otlp_endpoint=receiver.url, otlp_interval=0.2, hang_timeout=None
    )
    tracker.step(tokens=8)
    deadline = threading.Event()
    for _ in range(100):
        if receiver.requests:
            break
        deadline.wait(0.05)
    assert receiver.requests, "no periodic push"
    tracker.step(tokens=8)
    tracker.close()
    last = decode(receiver.requests[-1])
    assert last[(T.TOKENS.name, (("rank", "0"), ("run", "otlp2")))] == 16  # the final push saw the last step


def test_collector_down_or_refusing_is_counted_never_raised() -> None:
    refusing = Receiver(status=400)
    tracker = babysitter.watch(run="otlp3", port=-1, hang_timeout=None)
    try:
        assert not OtlpPusher(tracker, refusing.url, timeout=2).push()
        refusing.close()
        assert not OtlpPusher(tracker, refusing.url, timeout=1).push()  # nobody listening now
        assert tracker.errors.counts()["otlp"] == 2
    finally:
        tracker.close()


def test_bad_endpoint_fails_at_setup() -> None:
    with pytest.raises(ValueError, match="OTLP endpoint"):
        babysitter.watch(run="otlp4", port=-1, otlp_endpoint="collector:4318")


def test_units_are_the_catalogs_in_ucum_and_the_resource_names_the_rank(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenTelemetry conventions: UCUM units from the catalog, service.instance.id and host.name."""
    import socket

    from babysitter import catalog

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    tracker = babysitter.watch(
        run="otlp-units", port=-1, peak_flops=1e12, flops_per_token=100.0, hang_timeout=None
    )
    try:
        for _ in range(3):
            tracker.step(tokens=64, samples=2)
        with tracker.checkpoint_save(step=3, nbytes=10):
            pass
        assert OtlpPusher(tracker, receiver.url, interval=3600).push()
    finally:
        tracker.close()
    request = receiver.requests[-1]
    units = {m.name: m.unit for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert units[T.TOKENS.name] == "{token}"
    assert units[T.STEPS.name] == "{step}"
    assert units[T.DATA_WAIT.name] == "s"
    assert units[T.CKPT_BYTES.name] == "By"
    assert units[T.PEAK_FLOPS.name] == "{flop}/s"
    assert units[T.MODEL_FLOPS.name] == "{flop}"
    assert units[T.STEP_DURATION.name + "_sum"] == "s"
    assert units[T.STEP_DURATION.name + "_count"] == "1"
    for name, unit in units.items():  # every metric the catalog lists carries the catalog's unit
        if name.endswith("_count"):
            continue
        spec = catalog.by_name(
            name.removesuffix("_sum") if name not in units or name.endswith("_sum") else name
        )
        assert unit == spec.ucum, name
    resource = {a.key: a.value.string_value for a in request.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "babysitter"
    assert resource["service.instance.id"] == "otlp-units/3"
    assert resource["host.name"] == socket.gethostname()
    assert resource["babysitter.run"] == "otlp-units" and resource["babysitter.rank"] == "3"
    assert resource["service.version"] == babysitter.__version__
