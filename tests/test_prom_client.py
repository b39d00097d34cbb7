"""One Prometheus HTTP API client for every reader: its error contract, and the job map on a real Prometheus.

The error cases (a body over the limit, a malformed sample, a rejected query, an alert list that is not
one) cannot be had from a healthy Prometheus, so a loopback stub serves them; what a reader gets from
real data is checked against a real Prometheus scraping a real exposition.
"""

from __future__ import annotations

import ast
import http.server
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.export.http import serve
from babysitter.generate.config import GenerateConfig
from babysitter.generate.ranks import RankRecords
from babysitter.prom import PromClient, PromError
from babysitter.remediate.backends.base import BackendError
from babysitter.remediate.jobmap import PrometheusJobMap
from babysitter.views.top import PrometheusSource
from promkit import PROMETHEUS, PrometheusServer, require_binary

SRC = Path(__file__).resolve().parent.parent / "src" / "babysitter"
_READ_API = re.compile(
    r"/api/v1/(query|query_range|query_exemplars|series|labels?|alerts|rules|targets|metadata)\b"
)

Reply = tuple[int, bytes]


@pytest.fixture(name="stub")
def _stub() -> Iterator[Callable[[Callable[[str, dict[str, str]], Reply]], str]]:
    """A loopback HTTP server answering every request with ``reply(path, form)``; yields a starter."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(reply: Callable[[str, dict[str, str]], Reply]) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, form: dict[str, str]) -> None:
                status, body = reply(self.path.split("?")[0], {"method": self.command, **form})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                query = urllib.parse.urlsplit(self.path).query
                self._answer(dict(urllib.parse.parse_qsl(query)))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self._answer(dict(urllib.parse.parse_qsl(self.rfile.read(length).decode())))

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _vector(*items: dict[str, Any]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": list(items)}}).encode()


def test_every_reader_asks_prometheus_through_the_one_client() -> None:
    """Only babysitter/prom/client.py spells a read path of the API: top, scorecard and the job map go
    through it (a remote_write URL such as Mimir's ``/api/v1/push`` is a destination, not a read)."""
    spelled = sorted(
        {
            str(path.relative_to(SRC))
            for path in SRC.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _READ_API.search(node.value)
        }
    )
    assert spelled == ["prom/client.py"]


class TestClient:
    def test_queries_are_posted_and_samples_parsed(self, stub: Any) -> None:
        """The query goes as a form (no URL length limit); NaN and Inf come back as floats."""
        seen: list[dict[str, str]] = []

        def reply(path: str, form: dict[str, str]) -> Reply:
            seen.append({"path": path, **form})
            return 200, _vector(
                {"metric": {"run": "a"}, "value": [1.0, "0.5"]},
                {"metric": {"run": "b"}, "value": [1.0, "NaN"]},
                {"metric": {}, "value": [1.0, "+Inf"]},
            )

        samples = PromClient(stub(reply), timeout=5).query("up" + " " * 20_000, at=123.0)
        assert seen == [
            {"path": "/api/v1/query", "method": "POST", "query": "up" + " " * 20_000, "time": "123.0"}
        ]
        assert [s.labels for s in samples] == [{"run": "a"}, {"run": "b"}, {}]
        assert (
            samples[0].value == 0.5
            and samples[1].value != samples[1].value
            and samples[2].value == float("inf")
        )

    @pytest.mark.parametrize(
        ("status", "body", "message"),
        [
            (
                400,
                b'{"status":"error","errorType":"bad_data","error":"parse error"}',
                "HTTP 400: bad_data: parse error",
            ),
            (
                200,
                b'{"status":"error","errorType":"timeout","error":"query timed out"}',
                "timeout: query timed out",
            ),
            (200, b"<html>proxy error</html>", "not JSON"),
            (200, b'["a list"]', "not a JSON object"),
            (
                200,
                b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
                "expected a vector, got matrix",
            ),
            (
                200,
                b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}',
                "malformed sample",
            ),
            (
                200,
                b'{"status":"success","data":{"resultType":"vector","result":[{"value":[1,"x"]}]}}',
                "malformed",
            ),
        ],
    )
    def test_every_failure_is_a_prom_error_naming_the_server(
        self, stub: Any, status: int, body: bytes, message: str
    ) -> None:
        """Rejected queries, proxies' HTML, other result types and malformed samples: PromError, no traceback."""
        url = stub(lambda _path, _form: (status, body))
        with pytest.raises(PromError, match=message) as info:
            PromClient(url, timeout=5).query("up")
        assert url in str(info.value)

    def test_a_body_over_the_limit_is_refused(self, stub: Any) -> None:
        """At most max_bytes are read: a runaway answer cannot fill the reader's memory."""
        big = _vector(*({"metric": {"instance": f"n{i}"}, "value": [1, "1"]} for i in range(2000)))
        url = stub(lambda _path, _form: (200, big))
        assert len(PromClient(url, timeout=5, max_bytes=len(big)).query("up")) == 2000
        with pytest.raises(PromError, match=f"response larger than {len(big) - 1} bytes"):
            PromClient(url, timeout=5, max_bytes=len(big) - 1).query("up")

    def test_alerts(self, stub: Any) -> None:
        """Active alerts as the API lists them; a response without a list is an error."""
        alert = {"labels": {"alertname": "GpuDown"}, "state": "firing", "activeAt": "2026-01-01T00:00:00Z"}
        answers = {
            "/api/v1/alerts": json.dumps({"status": "success", "data": {"alerts": [alert, "junk"]}}).encode()
        }
        url = stub(lambda path, _form: (200, answers[path]))
        assert PromClient(url, timeout=5).alerts() == [alert]
        answers["/api/v1/alerts"] = b'{"status":"success","data":{}}'
        with pytest.raises(PromError, match="no alert list"):
            PromClient(url, timeout=5).alerts()

    @pytest.mark.parametrize("url", ["file:///etc/passwd", "127.0.0.1:9090", "http://", "ftp://host/"])
    def test_only_http_urls(self, url: str) -> None:
        """The URL is checked when the client is made, not at the first query."""
        with pytest.raises(ValueError, match="http"):
            PromClient(url)


def test_top_and_the_job_map_report_a_rejected_query_their_own_way(stub: Any) -> None:
    """top shows the client's error as a line of the frame; the job map raises BackendError."""
    url = stub(
        lambda _path, _form: (422, b'{"status":"error","errorType":"execution","error":"too many samples"}')
    )
    frame = PrometheusSource(url, timeout=5).frame()
    assert frame.runs == () and frame.nodes == () and frame.alerts is None
    assert any("execution: too many samples" in e and url in e for e in frame.errors)
    with pytest.raises(BackendError, match=r"Prometheus query failed: .*too many samples"):
        PrometheusJobMap(url, lookback=3600, timeout=5).runs_on("n1:9400")


@pytest.mark.prometheus
def test_the_job_map_on_a_real_prometheus(tmp_path: Path) -> None:
    """Host -> jobs (all, or the alert's GPU), host -> runs, run -> hosts, from what Prometheus scraped."""
    require_binary(PROMETHEUS, "prometheus")
    registry = CollectorRegistry()
    jobs = Gauge(N.GPU_JOB.name, N.GPU_JOB.help, ["gpu", "uuid", "hpc_job"], registry=registry)
    jobs.labels("0", "GPU-a", "4242").set(1)
    jobs.labels("1", "GPU-b", "4243").set(1)
    steps = Counter(T.STEPS.name.removesuffix("_total"), T.STEPS.help, ["run", "rank"], registry=registry)
    steps.labels("r1", "0").inc()
    endpoint = serve(registry, addr="127.0.0.1", port=0)
    try:
        instance = f"127.0.0.1:{endpoint.port}"
        with PrometheusServer(tmp_path, targets=[instance], scrape_interval="1s") as prom:
            prom.wait_for(f"{T.STEPS.name} > 0")
            job_map = PrometheusJobMap(prom.url, lookback=3600, timeout=10)
            assert job_map.jobs_on(instance) == ["4242", "4243"]
            assert job_map.jobs_on(instance, {"uuid": "GPU-b", "gpu": "0"}) == ["4243"], "uuid wins over gpu"
            assert job_map.jobs_on(instance, {"gpu": "0"}) == ["4242"]
            assert job_map.runs_on(instance) == ["r1"]
            assert job_map.instances_of("r1") == [instance]
            assert job_map.jobs_on("elsewhere:9400") == [] and job_map.instances_of("r2") == []
    finally:
        endpoint.close()


@pytest.mark.prometheus
def test_the_job_map_leaves_out_ranks_that_do_not_speak_for_their_run(tmp_path: Path) -> None:
    """Run -> hosts and run -> jobs (through its ranks' GPUs) on a real Prometheus: host A runs ranks 0
    and 1 of r1 (jobs 4242, 4243); host B serves rank 9 of r1 on a GPU of job 5555, and the rules'
    excluded list (recorded here from a gauge the test sets) names it. B is not r1's host, 5555 not its
    job; before the list names it, it is both."""
    require_binary(PROMETHEUS, "prometheus")
    excluded = RankRecords(GenerateConfig()).excluded
    registries = {name: CollectorRegistry() for name in ("a", "b")}
    jobs = {
        name: Gauge(N.GPU_JOB.name, N.GPU_JOB.help, ["gpu", "uuid", "hpc_job"], registry=registry)
        for name, registry in registries.items()
    }
    info = {
        name: Gauge(T.INFO.name, T.INFO.help, ["run", "rank", "uuid"], registry=registry)
        for name, registry in registries.items()
    }
    steps = {
        name: Counter(T.STEPS.base_name, T.STEPS.help, ["run", "rank"], registry=registry)
        for name, registry in registries.items()
    }
    for rank, uuid, job in (("0", "GPU-a", "4242"), ("1", "GPU-b", "4243")):
        jobs["a"].labels(rank, uuid, job).set(1)
        info["a"].labels("r1", rank, uuid).set(1)
        steps["a"].labels("r1", rank).inc()
    jobs["b"].labels("0", "GPU-c", "5555").set(1)
    info["b"].labels("r1", "9", "GPU-c").set(1)
    steps["b"].labels("r1", "9").inc()
    listed = Gauge(
        "test_excluded", "what the rule records", ["run", "rank", "reason"], registry=registries["b"]
    )
    rules = tmp_path / "rules.yml"
    rules.write_text(
        json.dumps({"groups": [{"name": "t", "rules": [{"record": excluded, "expr": "test_excluded"}]}]})
    )
    endpoints = {name: serve(registry, addr="127.0.0.1", port=0) for name, registry in registries.items()}
    try:
        a, b = (f"127.0.0.1:{endpoints[name].port}" for name in ("a", "b"))
        with PrometheusServer(tmp_path, targets=[a, b], scrape_interval="1s", rule_files=[rules]) as prom:
            prom.wait_for(f"count({T.STEPS.name}) == 3")
            job_map = PrometheusJobMap(prom.url, lookback=3600, timeout=10)
            assert job_map.instances_of("r1") == sorted([a, b])
            assert job_map.jobs_of("r1") == ["4242", "4243", "5555"]
            listed.labels("r1", "9", "undeclared").set(1)
            prom.wait_for(f"{excluded} == 1")
            assert job_map.instances_of("r1") == [a]
            assert job_map.jobs_of("r1") == ["4242", "4243"]
            assert job_map.jobs_of("r2") == [] and job_map.instances_of("r2") == []
    finally:
        for endpoint in endpoints.values():
            endpoint.close()
