"""One deadline per request and one per command for every Prometheus query the CLI makes (issue 21,
point 5): a server that drips one byte every 0.2 s used to keep ``explain`` and ``scorecard`` with
``--timeout 3`` busy for 120 s and ``top --once`` for over 150 s, because urllib's timeout bounds each
read, not the request. Here the same drip, from its first byte (status line, headers, body), against
every command that asks Prometheus; each must end well within 3 x its timeout (the bound has a wide
margin: this is not a benchmark). Before the fix (486be02) none ended within the bound.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from babysitter.cli import main
from babysitter.prom import Deadline, PromClient, PromError
from babysitter.remediate.backends.base import BackendError
from babysitter.remediate.jobmap import PrometheusJobMap
from test_node_trainers_hostile import RawServer

TIMEOUT = 3.0
BOUND = 3 * TIMEOUT


class DripServer(RawServer):
    """A loopback HTTP server that answers every request one byte per ``pause`` seconds, forever."""

    RESPONSE = (
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"status":"success","data":{'
        + b" " * 100_000
    )

    def __init__(self, pause: float = 0.2) -> None:
        self.pause = pause
        self.connections = 0
        super().__init__(self._drip)
        self.url = f"http://127.0.0.1:{self.port}"

    def _drip(self, conn: socket.socket, stopped: threading.Event) -> None:
        self.connections += 1
        for byte in self.RESPONSE:
            if stopped.wait(self.pause):
                return
            conn.sendall(bytes([byte]))

    def close(self) -> None:
        self.stop()


@pytest.fixture(scope="module", name="drip")
def _drip() -> Iterator[DripServer]:
    server = DripServer()
    yield server
    server.close()


def _cli(*argv: str) -> Callable[[], object]:
    return lambda: main(list(argv))  # its output goes to pytest's capture


def test_every_command_that_asks_prometheus_ends_within_its_deadline(drip: DripServer) -> None:
    """explain, scorecard, top --once and remediate's job map, all at once against the drip: each ends
    (with an error, exit 2 or 1, or a frame saying what failed) within 3 x --timeout."""
    url, t = drip.url, f"{TIMEOUT:g}"
    commands: dict[str, Callable[[], object]] = {
        "explain": _cli("explain", "--prometheus", url, "--run", "r1", "--timeout", t),
        "scorecard": _cli("scorecard", "--prometheus", url, "--timeout", t),
        "top --once": _cli("top", "--prometheus", url, "--once", "--timeout", t),
        "top --once --metrics": _cli("top", "--metrics", f"{url}/metrics", "--once", "--timeout", t),
    }
    jobmap = PrometheusJobMap(url, lookback=600, timeout=TIMEOUT)

    def lookup() -> object:
        try:
            return jobmap.instances_of("r1")
        except BackendError as exc:
            return exc

    commands["remediate job map"] = lookup
    results: dict[str, object] = {}
    ended: dict[str, float] = {}
    start = time.monotonic()

    def run(name: str, command: Callable[[], object]) -> None:
        results[name] = command()
        ended[name] = time.monotonic() - start

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in commands.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, start + BOUND - time.monotonic()))
    late = sorted(set(commands) - set(ended))
    assert not late, f"still running after {BOUND:g} s: {late}"
    print("ended after (s):", {k: round(v, 2) for k, v in sorted(ended.items())})
    assert all(seconds < BOUND for seconds in ended.values()), ended
    assert results["explain"] == 2 and results["scorecard"] == 2
    assert results["top --once"] == 1 and results["top --once --metrics"] == 1
    assert isinstance(results["remediate job map"], BackendError)
    assert "within" in str(results["remediate job map"])


def test_a_command_deadline_bounds_all_its_requests_together(drip: DripServer) -> None:
    """A client given a command deadline gives each request what is left of it, and none at all once it
    has passed (no connection is even opened)."""
    client = PromClient(drip.url, timeout=60.0, deadline=Deadline(1.0))
    t0 = time.monotonic()
    with pytest.raises(PromError, match="within"):
        client.query("up")
    assert time.monotonic() - t0 < 5.0  # the 1 s deadline, not the 60 s timeout
    before = drip.connections
    with pytest.raises(PromError, match="deadline"):
        client.query("up")
    assert drip.connections == before
    with pytest.raises(ValueError):
        Deadline(0)


def test_a_hung_name_lookup_ends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver that never answers (getaddrinfo blocks: the one call no socket timeout reaches) costs
    the request its deadline, not the resolver's own timeouts; a failed lookup is still the resolver's
    error, and a literal address is never handed to the lookup thread."""
    real = socket.getaddrinfo
    release = threading.Event()
    looked_up: list[str] = []

    def resolver(host: str, *args: object, **kwargs: object) -> object:
        looked_up.append(f"{host}@{threading.current_thread().name}")
        if host == "hung.example":
            release.wait(30)
        if host == "nxdomain.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    try:
        client = PromClient("http://hung.example:9090", timeout=1.0)
        t0 = time.monotonic()
        with pytest.raises(PromError, match=r"within|timed out"):
            client.query("up")
        assert time.monotonic() - t0 < 5.0  # the 1 s timeout; the lookup itself would wait 30 s
    finally:
        release.set()
    with pytest.raises(PromError, match="Name or service not known"):
        PromClient("http://nxdomain.example:9090", timeout=5.0).query("up")
    looked_up.clear()
    with pytest.raises(PromError):
        PromClient("http://127.0.0.1:1", timeout=5.0).query("up")  # nothing listens there
    assert looked_up and all(entry.endswith(f"@{threading.current_thread().name}") for entry in looked_up)
