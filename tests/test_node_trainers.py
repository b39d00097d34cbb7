"""Local trainers: registered endpoints are fetched over loopback and re-served; failures stay local."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from babysitter import registration
from babysitter.catalog import node as N
from babysitter.node.agent import Agent
from babysitter.node.workloads.trainers import TrainersCollector
from node_helpers import parse_exposition, scrape, wait_for


class Trainer:
    """An in-process metrics endpoint registered like a tracker would register it."""

    def __init__(self, directory: Path, run: str, rank: int, steps: float) -> None:
        self.registry = CollectorRegistry()
        counter = Counter("train_steps", "steps", ["run", "rank"], registry=self.registry)
        counter.labels(run, str(rank)).inc(steps)
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        port = self.server.server_port
        pid = os.getpid()
        self.endpoint = registration.Endpoint(
            pid=pid,
            start_time=registration.process_start_time(pid),
            url=f"http://127.0.0.1:{port}/metrics",
            run=run,
            rank=rank,
            local_rank=rank,
        )
        # Same pid for several endpoints: registration file names are unique per pid and port.
        self.path = registration.register(directory, self.endpoint)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(name="reg")
def _reg(tmp_path: Path) -> Path:
    return tmp_path / "registry"


@pytest.fixture(name="trainers")
def _trainers(reg: Path) -> Iterator[TrainersCollector]:
    collector = TrainersCollector(reg, timeout=2.0)
    yield collector
    collector.close()


def test_no_registry_dir_is_fine(trainers: TrainersCollector) -> None:
    """A host with no trainer yet (no directory) reports zero trainers, no error."""
    s = scrape(trainers)
    assert s.value(N.TRAINERS.name) == 0
    assert s.find(N.TRAINER_SCRAPE_SUCCESS.name) == []


def test_registered_endpoints_are_reserved(reg: Path, trainers: TrainersCollector) -> None:
    """Two ranks' metrics appear in the agent's /metrics under one family, each with its own success."""
    a, b = Trainer(reg, "run-a", 0, 5), Trainer(reg, "run-a", 1, 7)
    try:
        text = Agent([trainers]).render().decode()
        s = parse_exposition(text)
        assert s.value("train_steps_total", run="run-a", rank="0") == 5
        assert s.value("train_steps_total", run="run-a", rank="1") == 7
        assert text.count("# TYPE train_steps_total counter") == 1
        assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="run-a", rank="1") == 1
        assert s.value(N.TRAINERS.name) == 2
        assert s.value(N.TRAINER_SCRAPE_DURATION.name, run="run-a", rank="0") > 0
    finally:
        a.stop()
        b.stop()


def test_endpoint_that_stops_answering(
    reg: Path, trainers: TrainersCollector, caplog: pytest.LogCaptureFixture
) -> None:
    """A live process whose endpoint fails gets success 0 and one log line; the others are served."""
    good, bad = Trainer(reg, "good", 0, 1), Trainer(reg, "bad", 0, 2)
    bad.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="babysitter.node.workloads.trainers"):
            scrape(trainers)
            s = scrape(trainers)
        assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="bad", rank="0") == 0
        assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="good", rank="0") == 1
        assert s.value("train_steps_total", run="good") == 1
        lines = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
        assert len(lines) == 1
        assert "run=bad" in lines[0]
        assert s.value(N.TRAINER_REGISTRATIONS_DROPPED.name) == 0
    finally:
        good.stop()


def test_oversized_response_is_a_failure(reg: Path) -> None:
    """A response larger than the limit counts as a failed fetch (bounded memory per trainer)."""
    t = Trainer(reg, "big", 0, 1)
    try:
        small = TrainersCollector(reg, max_bytes=50)
        assert scrape(small).value(N.TRAINER_SCRAPE_SUCCESS.name, run="big") == 0
        small.close()
    finally:
        t.stop()


_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from prometheus_client import CollectorRegistry, Gauge, start_http_server
    from babysitter import registration
    reg = CollectorRegistry()
    Gauge("train_step", "step", ["run", "rank"], registry=reg).labels("doomed", "3").set(42)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    pid = os.getpid()
    registration.register(Path(sys.argv[1]), registration.Endpoint(
        pid=pid, start_time=registration.process_start_time(pid),
        url=f"http://127.0.0.1:{server.server_port}/metrics", run="doomed", rank=3, local_rank=3))
    time.sleep(120)
    """
)


def test_trainer_that_died_is_dropped_with_one_log_line(
    reg: Path, trainers: TrainersCollector, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL a registered trainer: its registration is dropped, counted, and logged once."""
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(reg)])
    try:
        wait_for(lambda: registration.list_endpoints(reg), timeout=30)
        s = scrape(trainers)
        assert s.value("train_step", run="doomed", rank="3") == 42
        proc.kill()
        proc.wait(timeout=10)
        with caplog.at_level(logging.WARNING, logger="babysitter.node.workloads.trainers"):
            s = scrape(trainers)
            s2 = scrape(trainers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert s.value(N.TRAINER_REGISTRATIONS_DROPPED.name) == 1
    assert s2.value(N.TRAINER_REGISTRATIONS_DROPPED.name) == 1
    assert s.value(N.TRAINERS.name) == 0
    assert s.find("train_step") == []
    assert list(reg.glob("*.json")) == []
    lines = [r.getMessage() for r in caplog.records if "exited" in r.getMessage()]
    assert len(lines) == 1
    assert "run=doomed rank=3" in lines[0]


def test_proxy_environment_is_ignored(
    reg: Path, trainers: TrainersCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loopback fetches never go through an HTTP proxy from the environment."""
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    t = Trainer(reg, "p", 0, 3)
    try:
        collector = TrainersCollector(reg)
        assert scrape(collector).value(N.TRAINER_SCRAPE_SUCCESS.name, run="p") == 1
        collector.close()
    finally:
        t.stop()


def test_trainer_cannot_speak_for_the_agent(
    reg: Path, trainers: TrainersCollector, caplog: pytest.LogCaptureFixture
) -> None:
    """A registered process exporting gpu_up (the agent's namespace) has that family dropped, once logged."""
    t = Trainer(reg, "spoof", 0, 1)
    Gauge("gpu_up", "fake", ["gpu"], registry=t.registry).labels("0").set(1)
    try:
        with caplog.at_level(logging.WARNING, logger="babysitter.node.workloads.trainers"):
            s = scrape(trainers)
            scrape(trainers)
        assert s.find("gpu_up") == []
        assert s.value("train_steps_total", run="spoof") == 1
        assert len([r for r in caplog.records if "reserved for the node agent" in r.getMessage()]) == 1
    finally:
        t.stop()


def test_endpoint_count_is_bounded(reg: Path) -> None:
    """At most max_endpoints registrations are fetched per scrape."""
    servers = [Trainer(reg, f"r{i}", i, 1) for i in range(3)]
    try:
        collector = TrainersCollector(reg, max_endpoints=2)
        s = scrape(collector)
        assert len(s.find(N.TRAINER_SCRAPE_SUCCESS.name)) == 2
        assert len(s.find("train_steps_total")) == 2
        collector.close()
    finally:
        for t in servers:
            t.stop()


def test_https_trainer_is_verified_against_the_ca_file(reg: Path, tmp_path: Path) -> None:
    """A tracker serving HTTPS is fetched when the agent has its CA, and fails as tls without it."""
    import babysitter

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    tracker = babysitter.watch(
        run="tls", port=0, registry_dir=reg, tls=babysitter.TLSConfig(str(cert), str(key)), peak_flops=1e12
    )
    trusting, unverified = TrainersCollector(reg, ca_file=str(cert)), TrainersCollector(reg)
    try:
        tracker.step()
        s = scrape(trusting)
        assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="tls") == 1
        assert s.value("train_steps_total", run="tls", rank="0") == 1
        bad = scrape(unverified)
        assert bad.value(N.TRAINER_SCRAPE_SUCCESS.name, run="tls") == 0
        assert bad.value(N.TRAINER_SCRAPE_ERRORS.name, run="tls", reason="tls") == 1
    finally:
        tracker.close()


def test_a_trainer_that_unregistered_and_exited_before_the_next_scrape_did_not_die(
    reg: Path, trainers: TrainersCollector
) -> None:
    """A tracker closed (its registration removed) and the process exited right after, between two
    scrapes, as a training script that ends does: not counted as a trainer that died without closing.
    Before, the agent saw the registration gone and the pid dead and counted it (TrainingProcessExited
    named every host of a job whose ranks had all closed cleanly, in the campaign's faults)."""
    script = _SCRIPT.replace(
        "time.sleep(120)", "sys.stdin.readline(); registration.unregister(path); os._exit(0)"
    ).replace("registration.register(", "path = registration.register(")
    proc = subprocess.Popen([sys.executable, "-c", script, str(reg)], stdin=subprocess.PIPE)
    try:
        wait_for(lambda: registration.list_endpoints(reg), timeout=30)
        assert scrape(trainers).value("train_step", run="doomed", rank="3") == 42
        assert proc.stdin is not None
        proc.stdin.write(b"\n")
        proc.stdin.close()
        proc.wait(timeout=10)
        s = scrape(trainers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert s.value(N.TRAINER_REGISTRATIONS_DROPPED.name) == 0
    assert s.value(N.TRAINERS.name) == 0
