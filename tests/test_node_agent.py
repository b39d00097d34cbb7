"""The agent core: collector health, isolation of failing and hung collectors, merging, HTTP serving."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from babysitter.catalog import node as N
from babysitter.catalog import selfmon as S
from babysitter.node.agent import Agent, Server, merge_families
from babysitter.node.gpu.collector import GpuCollector
from babysitter.node.gpu.fake import FakeNvml, fake_gpus
from node_helpers import Scrape, parse_exposition


class Static:
    """A collector returning fixed families."""

    def __init__(self, name: str, families: list[Metric]) -> None:
        self.name = name
        self.families = families
        self.closed = False

    def collect(self) -> Iterable[Metric]:
        return self.families

    def close(self) -> None:
        self.closed = True


class Broken:
    """A collector that always raises."""

    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> Iterable[Metric]:
        self.calls += 1
        raise RuntimeError("disk on fire")

    def close(self) -> None:
        raise RuntimeError("close failed too")


class Hung:
    """A collector that blocks until released (like NVML on a GPU that fell off the bus)."""

    name = "hung"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> Iterable[Metric]:
        self.calls += 1
        self.release.wait(10)
        return []

    def close(self) -> None:
        self.release.set()


def gauge(name: str, value: float, **labels: str) -> Metric:
    family = GaugeMetricFamily(name, "help", labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def agent_scrape(agent: Agent) -> Scrape:
    return parse_exposition(agent.render().decode())


class TestCollectorHealth:
    def test_failing_collector_does_not_fail_the_scrape(self, caplog: pytest.LogCaptureFixture) -> None:
        """An exception marks only its collector failed; the other's metrics and health are served."""
        good = Static("good", [gauge("x_value", 3.0)])
        broken = Broken()
        agent = Agent([good, broken])
        with caplog.at_level(logging.WARNING, logger="babysitter.node.agent"):
            s = agent_scrape(agent)
            agent_scrape(agent)
        assert s.value("x_value") == 3.0
        assert s.value(N.COLLECTOR_SUCCESS.name, collector="good") == 1
        assert s.value(N.COLLECTOR_SUCCESS.name, collector="broken") == 0
        assert s.value(N.COLLECTOR_DURATION.name, collector="broken") >= 0
        assert broken.calls == 2
        lines = [r.getMessage() for r in caplog.records if "collector broken failed" in r.getMessage()]
        assert lines == ["babysitter: collector broken failed: RuntimeError: disk on fire"]
        agent.close()  # a failing close() is logged, not raised
        assert good.closed

    def test_hung_collector_times_out_and_is_not_restarted(self) -> None:
        """A collector past its deadline is reported failed; while it hangs no second run starts."""
        hung = Hung()
        agent = Agent([hung, Static("good", [gauge("y_value", 1.0)])], collector_timeout=0.2)
        start = time.monotonic()
        s = agent_scrape(agent)
        assert time.monotonic() - start < 5
        assert s.value(N.COLLECTOR_SUCCESS.name, collector="hung") == 0
        assert s.value(N.COLLECTOR_DURATION.name, collector="hung") >= 0.2
        assert s.value("y_value") == 1
        s = agent_scrape(agent)
        assert s.value(N.COLLECTOR_SUCCESS.name, collector="hung") == 0
        assert hung.calls == 1
        hung.release.set()
        time.sleep(0.1)
        assert agent_scrape(agent).value(N.COLLECTOR_SUCCESS.name, collector="hung") == 1
        assert hung.calls == 2
        agent.close()

    def test_stuck_collector_does_not_block_close(self) -> None:
        """close() gives up on a collector stuck in collect() and close() instead of hanging shutdown."""
        stuck = Hung()
        stuck.close = lambda: stuck.release.wait(30)  # type: ignore[method-assign]
        agent = Agent([stuck], collector_timeout=0.1)
        agent_scrape(agent)
        start = time.monotonic()
        agent.close(timeout=0.2)
        assert time.monotonic() - start < 2
        stuck.release.set()

    def test_build_and_backend_info(self) -> None:
        """The agent exports its build info and which GPU backend it uses."""
        s = agent_scrape(Agent([], backend="nvml", driver_version="570.1"))
        assert s.value(S.BUILD_INFO.name) == 1
        assert s.value(N.NODE_INFO.name, backend="nvml", driver_version="570.1") == 1

    def test_duplicate_collector_names_rejected(self) -> None:
        """Two collectors with one name would make their health series ambiguous: setup error."""
        with pytest.raises(ValueError, match="unique"):
            Agent([Static("a", []), Static("a", [])])


class TestMerge:
    def test_same_family_from_two_sources_is_one_family(self) -> None:
        """Ranks exporting the same family end up under one HELP/TYPE with all their series."""
        a = CounterMetricFamily("train_steps", "steps", labels=["rank"])
        a.add_metric(["0"], 5)
        b = CounterMetricFamily("train_steps", "steps", labels=["rank"])
        b.add_metric(["1"], 7)
        merged = merge_families([a, b])
        assert len(merged) == 1
        assert sorted(s.value for s in merged[0].samples) == [5, 7]

    def test_duplicates_and_type_clashes_dropped(self) -> None:
        """An identical series twice, or a family re-declared with another type, is dropped."""
        merged = merge_families(
            [gauge("z", 1.0, a="1"), gauge("z", 2.0, a="1"), CounterMetricFamily("z", "h", 3)]
        )
        assert [(m.name, m.type) for m in merged] == [("z", "gauge")]
        assert [s.value for s in merged[0].samples] == [1.0]

    def test_info_merges_with_parsed_gauge_of_the_same_exposed_name(self) -> None:
        """The agent's build_info (info) and a trainer's (parsed back as a gauge) share one family."""
        info = InfoMetricFamily("babysitter_build", "h", labels=[])
        info.add_metric([], {"version": "1"})
        parsed = gauge("babysitter_build_info", 1.0, run="r", version="1")
        merged = merge_families([info, parsed])
        assert len(merged) == 1
        text = Agent([Static("s", [info, parsed])]).render().decode()
        assert text.count("# TYPE babysitter_build_info") == 1


class TestServing:
    def test_serves_and_releases_the_port(self) -> None:
        """The server binds an ephemeral loopback port, serves /metrics, and stop() releases it."""
        gpu = GpuCollector(FakeNvml(fake_gpus(2)))
        gpu.start()
        agent = Agent([gpu], backend="simulated")
        server = Server.start(agent, "127.0.0.1", 0)
        try:
            assert server.port > 0
            assert server.url == f"http://127.0.0.1:{server.port}/metrics"
            with urllib.request.urlopen(server.url, timeout=5) as response:  # noqa: S310
                s = parse_exposition(response.read().decode())
            assert s.value(N.GPU_UP.name, gpu="1") == 1
        finally:
            server.stop()
            agent.close()
        with pytest.raises(OSError):
            urllib.request.urlopen(server.url, timeout=2)  # noqa: S310

    @pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
    def test_tls(self, tmp_path: Path) -> None:
        """With a certificate and key the agent serves HTTPS only."""
        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        argv += ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
        subprocess.run(
            [*argv, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60
        )
        agent = Agent([Static("s", [gauge("tls_value", 4.0)])])
        server = Server.start(agent, "127.0.0.1", 0, certfile=str(cert), keyfile=str(key))
        try:
            import ssl

            context = ssl.create_default_context(cafile=str(cert))
            with urllib.request.urlopen(server.url, timeout=5, context=context) as response:  # noqa: S310
                assert parse_exposition(response.read().decode()).value("tls_value") == 4
            assert server.url.startswith("https://")
        finally:
            server.stop()


@pytest.mark.prometheus
def test_exposition_passes_promtool_lint(tmp_path: Path) -> None:
    """The agent's /metrics (simulated GPUs, one lost, an NVML error) passes `promtool check metrics`."""
    from babysitter.node.config import AgentConfig
    from babysitter.node.daemon import build
    from promkit import PROMTOOL, require_binary

    require_binary(PROMTOOL, "promtool")
    running = build(AgentConfig(simulate=3, registry_dir=tmp_path / "reg", kmsg_path=""))
    try:
        assert running.simulator is not None
        running.simulator.nvml.gpu(2).lost = True
        running.simulator.nvml.gpu(1).errors["nvmlDeviceGetPowerUsage"] = 999
        running.agent.render()
        body = running.agent.render()
    finally:
        running.close()
    assert b'gpu_up{gpu="2"' in body
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
