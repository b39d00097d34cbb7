"""The trainers collector against hostile local users (issue 12, points 1-5).

Every test here failed on the code before the fix: a bad registration file broke every scrape, a
drip-feeding endpoint disabled the collector, a redirect made the agent fetch and re-serve another
URL, one registration could overwrite another run's series, and one endpoint could inject 120,000.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from babysitter import registration
from babysitter.catalog import node as N
from babysitter.node.agent import Agent
from babysitter.node.workloads.trainers import TrainersCollector
from node_helpers import Scrape, scrape
from unpriv import popen_as_nobody, public_tmp, run_as_nobody

UID = str(os.geteuid())


@pytest.fixture(name="public_tmp")
def _public_tmp() -> Iterator[Path]:
    yield from public_tmp()


class Trainer:
    """An in-process endpoint registered like a tracker: serves train_steps_total{run,rank}."""

    def __init__(
        self, directory: Path, run: str, rank: int, steps: float, serves: tuple[str, str] | None = None
    ):
        self.registry = CollectorRegistry()
        counter = Counter("train_steps", "steps", ["run", "rank"], registry=self.registry)
        served_run, served_rank = serves or (run, str(rank))
        counter.labels(served_run, served_rank).inc(steps)
        self.server, _ = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        pid = os.getpid()
        self.endpoint = registration.Endpoint(
            pid,
            registration.process_start_time(pid),
            f"http://127.0.0.1:{self.server.server_port}/metrics",
            run,
            rank,
            rank,
        )
        self.path = registration.register(directory, self.endpoint)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RawServer:
    """A loopback TCP server whose every connection is handled by ``handler(conn)`` on a thread."""

    def __init__(self, handler) -> None:  # type: ignore[no-untyped-def]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stopped = threading.Event()
        self.handler = handler
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            self.handler(conn, self.stopped)
        except OSError:
            pass
        finally:
            conn.close()

    def register(self, directory: Path, run: str, rank: int = 0) -> Path:
        pid = os.getpid()
        ep = registration.Endpoint(
            pid,
            registration.process_start_time(pid),
            f"http://127.0.0.1:{self.port}/metrics",
            run,
            rank,
            rank,
        )
        return registration.register(directory, ep)

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()


@pytest.fixture(name="reg")
def _reg(tmp_path: Path) -> Path:
    return tmp_path / "registry"


@pytest.fixture(name="trainers")
def _trainers(reg: Path) -> Iterator[TrainersCollector]:
    collector = TrainersCollector(reg, timeout=1.0)
    yield collector
    collector.close()


def _skipped(s: Scrape) -> dict[str, float]:
    return {
        labels["reason"]: value
        for name, labels in s.series()
        if name == N.TRAINER_REGISTRATIONS_SKIPPED.name
        for value in s.find(name, reason=labels["reason"])
    }


def _errors(s: Scrape, run: str) -> dict[str, float]:
    return {
        labels["reason"]: s.value(N.TRAINER_SCRAPE_ERRORS.name, run=run, reason=labels["reason"])
        for name, labels in s.series(run=run)
        if name == N.TRAINER_SCRAPE_ERRORS.name
    }


# ---------------------------------------------------------------------------------------------- point 1


def _hostile_entries(directory: Path) -> dict[str, str]:
    """Write bad registrations into ``directory``; the reason each must be skipped for."""
    good = {"schema": 1, "pid": os.getpid(), "start_time": registration.process_start_time(os.getpid())}
    good |= {"url": "http://127.0.0.1:9/metrics", "run": "x", "rank": 0, "local_rank": 0}
    files = {
        "a.json": ("[]", "malformed"),
        "b.json": ('"a string"', "malformed"),
        "c.json": ("null", "malformed"),
        "d.json": (json.dumps({**good, "pid": -1}), "malformed"),
        "e.json": (json.dumps({**good, "pid": 2**70}), "malformed"),
        "f.json": (json.dumps({**good, "start_time": float("nan")}), "malformed"),
        "g.json": (json.dumps({**good, "run": "a\nb"}), "malformed"),
        "h.json": (json.dumps({**good, "url": "http://127.0.0.1@evil.example:80/metrics"}), "malformed"),
        "i.json": (json.dumps({**good, "url": "http://10.0.0.1:9450/metrics"}), "forbidden_target"),
        "j.json": ("[" * 15000, "malformed"),
        "k.json": ("x" * 20000, "too_large"),
    }
    for name, (text, _) in files.items():
        (directory / name).write_text(text)
    (directory / "m.json").write_bytes(b"\xff\xfe\x00not utf-8")
    (directory / "n.json").mkdir()
    os.mkfifo(directory / "o.json")
    (directory / "p.json").symlink_to(directory / "a.json")
    reasons = {name: reason for name, (_, reason) in files.items()}
    return reasons | {
        "m.json": "malformed",
        "n.json": "not_regular",
        "o.json": "not_regular",
        "p.json": "not_regular",
    }


def test_bad_registration_files_cost_only_themselves(
    reg: Path, trainers: TrainersCollector, caplog: pytest.LogCaptureFixture
) -> None:
    """`[]`, a string, null, pid -1, a directory named x.json, a FIFO, a link... each is skipped,
    counted once by reason and logged once; the honest trainer next to them is served every scrape."""
    honest = Trainer(reg, "honest", 0, 5)
    try:
        expected = _hostile_entries(honest.path.parent)
        (reg / "top.json").write_text("[]")  # outside any user's directory
        (reg / "dir.json").mkdir()
        with caplog.at_level(logging.INFO, logger="babysitter"):
            first, second = scrape(trainers), scrape(trainers)
    finally:
        honest.stop()
    for s in (first, second):
        assert s.value("train_steps_total", run="honest", rank="0") == 5
    counts: dict[str, float] = {}
    for reason in expected.values():
        counts[reason] = counts.get(reason, 0) + 1
    counts["misplaced"] = 2
    assert _skipped(second) == counts
    skipped_lines = [r.getMessage() for r in caplog.records if "skipping registration" in r.getMessage()]
    assert len(skipped_lines) == len(expected) + 2  # once per file, not once per scrape
    assert len([line for line in skipped_lines if "not logged one by one" in line]) == 0


_NONROOT_AGENT = textwrap.dedent(
    """
    import json, logging, sys
    from pathlib import Path
    from babysitter.node.workloads.trainers import TrainersCollector
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("babysitter").addHandler(handler)
    logging.getLogger("babysitter").setLevel(logging.INFO)
    collector = TrainersCollector(Path(sys.argv[1]), timeout=2.0)
    scrapes = [[(s.name, s.labels, s.value) for f in collector.collect() for s in f.samples] for _ in range(3)]
    print(json.dumps({"scrapes": scrapes, "logs": [r.getMessage() for r in records]}))
    """
)


def test_non_root_agent_survives_another_users_stale_registration(public_tmp: Path) -> None:
    """An agent running as nobody cannot delete root's registration of a killed trainer: it skips it,
    counts it once as dead and logs it once, every scrape succeeds, and root's live trainer is served."""
    shared = public_tmp / "registry"
    live = Trainer(shared, "alive", 1, 3)  # first: a tracker removes its own user's dead registrations
    doomed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = registration.process_start_time(doomed.pid)
    doomed.kill()
    doomed.wait()
    stale = registration.register(
        shared, registration.Endpoint(doomed.pid, started, "http://127.0.0.1:9/metrics", "gone", 0, 0)
    )
    try:
        proc = run_as_nobody(_NONROOT_AGENT, str(shared))
    finally:
        live.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    for samples in out["scrapes"]:
        values = {(n, tuple(sorted(labels.items()))): v for n, labels, v in samples}
        assert values[("train_steps_total", (("rank", "1"), ("run", "alive")))] == 3
        assert values[(N.TRAINER_REGISTRATIONS_SKIPPED.name, (("reason", "dead"),))] == 1
    assert stale.exists()  # not nobody's to delete
    assert len([line for line in out["logs"] if str(stale) in line]) == 1


# ---------------------------------------------------------------------------------------------- point 2


def _drip(conn: socket.socket, stopped: threading.Event) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    while not stopped.is_set():
        conn.sendall(b"#")
        time.sleep(0.2)


def test_drip_feeding_endpoints_do_not_hide_the_others(reg: Path) -> None:
    """Twelve endpoints that send headers, then a byte every 0.2 s forever: each fetch is cut at its 2 s
    total deadline, every scrape completes, and the honest trainer is served each time."""
    drips = [RawServer(_drip) for _ in range(12)]
    for i, drip in enumerate(drips):
        drip.register(reg, f"drip{i}")
    honest = Trainer(reg, "honest", 0, 7)
    agent = Agent([TrainersCollector(reg, timeout=2.0)], collector_timeout=10.0)
    results: list[Scrape] = []
    worker = threading.Thread(target=lambda: results.extend(Scrape(agent.collect()) for _ in range(2)))
    try:
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive(), "a scrape did not return"
    finally:
        honest.stop()
        for drip in drips:
            drip.stop()
        agent.close()
    for s in results:
        assert s.value(N.COLLECTOR_SUCCESS.name, collector="trainers") == 1
        assert s.value("train_steps_total", run="honest", rank="0") == 7
        assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="drip3") == 0
    assert _errors(results[1], "drip3") == {"timeout": 2}


# ---------------------------------------------------------------------------------------------- point 3


def test_redirect_is_never_followed(reg: Path, trainers: TrainersCollector) -> None:
    """A registered endpoint answering 302 to another URL is a failure; the other URL is never fetched
    and nothing it serves reaches the agent's output."""
    internal_hits: list[int] = []

    def secret(conn: socket.socket, _: threading.Event) -> None:
        internal_hits.append(1)
        conn.sendall(b'HTTP/1.0 200 OK\r\n\r\nsecret_token{value="hunter2"} 1\n')

    internal = RawServer(secret)

    def redirect(conn: socket.socket, _: threading.Event) -> None:
        conn.sendall(f"HTTP/1.0 302 Found\r\nLocation: http://127.0.0.1:{internal.port}/\r\n\r\n".encode())

    redirector = RawServer(redirect)
    redirector.register(reg, "ssrf")
    try:
        s = scrape(trainers)
    finally:
        internal.stop()
        redirector.stop()
    assert "secret_token" not in s.names()
    assert internal_hits == []
    assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="ssrf") == 0
    assert _errors(s, "ssrf") == {"redirect": 1}


# ---------------------------------------------------------------------------------------------- point 4


def test_endpoint_cannot_serve_another_runs_series(reg: Path, trainers: TrainersCollector) -> None:
    """A registration named to sort first that serves train_*{run="victim"} does not replace the
    victim's series: its whole output is refused as label_mismatch."""
    victim = Trainer(reg, "victim", 0, 5)
    impostor = Trainer(reg, "aaa", 0, 999, serves=("victim", "0"))
    impostor.path.rename(impostor.path.parent / "0-first.json")
    try:
        s = scrape(trainers)
    finally:
        victim.stop()
        impostor.stop()
    assert s.find("train_steps_total", run="victim") == [5]
    assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="aaa") == 0
    assert _errors(s, "aaa") == {"label_mismatch": 1}
    assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="victim", owner_uid=UID) == 1


_IMPOSTOR = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from prometheus_client import CollectorRegistry, Counter, start_http_server
    from babysitter import registration
    reg = CollectorRegistry()
    Counter("train_steps", "steps", ["run", "rank"], registry=reg).labels("victim", "0").inc(999)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    pid = os.getpid()
    path = registration.register(Path(sys.argv[1]), registration.Endpoint(
        pid, registration.process_start_time(pid), f"http://127.0.0.1:{server.server_port}/metrics",
        "victim", 0, 0))
    path.rename(path.parent / "0-first.json")
    print("ready", flush=True)
    time.sleep(120)
    """
)


def test_another_user_cannot_take_over_a_run(public_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As nobody, register run=victim rank=0 (served first in file-name order) next to root's real one:
    the run belongs to the user who registered it first, the impostor is dropped, counted, logged."""
    shared = public_tmp / "registry"
    victim = Trainer(shared, "victim", 0, 5)
    impostor = popen_as_nobody(_IMPOSTOR, str(shared))
    collector = TrainersCollector(shared, timeout=2.0)
    try:
        assert impostor.stdout is not None
        assert impostor.stdout.readline().strip() == "ready", (
            impostor.stderr.read() if impostor.stderr else ""
        )
        with caplog.at_level(logging.WARNING, logger="babysitter"):
            s = scrape(collector)
            scrape(collector)
    finally:
        impostor.kill()
        impostor.wait()
        victim.stop()
    assert s.find("train_steps_total", run="victim") == [5]
    assert s.value(N.TRAINER_SCRAPE_SUCCESS.name, run="victim", rank="0", owner_uid=UID) == 1
    assert s.find(N.TRAINER_SCRAPE_SUCCESS.name, owner_uid="65534") == []
    assert _skipped(s) == {"conflict": 1}
    conflict = [r.getMessage() for r in caplog.records if "(conflict)" in r.getMessage()]
    assert len(conflict) == 1
    assert "uid 65534" in conflict[0]


# ---------------------------------------------------------------------------------------------- point 5


def test_series_flood_is_refused_per_endpoint(reg: Path, trainers: TrainersCollector) -> None:
    """An endpoint serving 120,000 series fails as too_many_series; nothing of it is served and the
    honest trainer is."""
    body = "".join(f'bulk_x{{run="flood",rank="0",i="{i}"}} 1\n' for i in range(120_000)).encode()

    def flood(conn: socket.socket, _: threading.Event) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + body)

    flooder = RawServer(flood)
    flooder.register(reg, "flood")
    honest = Trainer(reg, "honest", 0, 2)
    bounded = TrainersCollector(reg, timeout=5.0, max_bytes=64 * 1024 * 1024)
    try:
        s = scrape(bounded)
    finally:
        flooder.stop()
        honest.stop()
    assert s.find("bulk_x") == []
    assert s.value("train_steps_total", run="honest") == 2
    assert _errors(s, "flood") == {"too_many_series": 1}
    small = TrainersCollector(reg, timeout=5.0)  # the default byte cap (512 KiB) stops it earlier
    flooder2 = RawServer(flood)
    flooder2.register(reg, "flood2")
    try:
        assert _errors(scrape(small), "flood2") == {"too_large": 1}
    finally:
        flooder2.stop()


def test_every_reason_is_in_the_metric_help() -> None:
    """The reason label values the code can produce are the ones the catalog (and docs/metrics.md) list."""
    from babysitter.node.workloads.trainers import ERRORS

    for reason in registration.SKIP_REASONS:
        assert reason in N.TRAINER_REGISTRATIONS_SKIPPED.help
    for reason in ERRORS:
        assert reason in N.TRAINER_SCRAPE_ERRORS.help
