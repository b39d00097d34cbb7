"""The trainers' fetcher against loopback peers that answer well, badly, slowly or not at all.

One round fetches every URL at once on one selectors loop: each peer's failure is its own, with its
reason, and a round never outlasts its deadline, whatever the peers do. Plain HTTP and TLS (the
handshake, a body spanning many reads, a peer whose certificate the agent does not trust).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from babysitter.node.workloads.fetch import FETCH_ERRORS, Fetcher

OK = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n"
Handler = Callable[[socket.socket], None]


class Peer:
    """A loopback TCP server that runs ``handler`` on each connection (on its own thread), over TLS
    when given a server context; ``url`` is what a registration would hold."""

    def __init__(
        self,
        handler: Handler,
        tls: ssl.SSLContext | None = None,
        family: int = socket.AF_INET,
        reads: bool = True,
    ):
        self.sock = socket.socket(family)
        self.sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.handler, self.tls, self.reads = handler, tls, reads
        self.stopped = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()
        port = self.sock.getsockname()[1]
        host = "[::1]" if family == socket.AF_INET6 else "127.0.0.1"
        self.url = f"{'https' if tls else 'http'}://{host}:{port}/metrics"

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with contextlib.suppress(OSError):
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            if self.reads:
                _read_request(conn)
            self.handler(conn)
        with contextlib.suppress(OSError):
            conn.close()

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _answer(data: bytes) -> Handler:
    return lambda conn: conn.sendall(data)


def _drip(data: bytes, every: float = 0.01) -> Handler:
    def handler(conn: socket.socket) -> None:
        for i in range(len(data)):
            conn.sendall(data[i : i + 1])
            time.sleep(every)

    return handler


def _silent(conn: socket.socket) -> None:
    time.sleep(5)


@pytest.fixture
def peers() -> Iterator[Callable[..., Peer]]:
    made: list[Peer] = []

    def make(handler: Handler, **kw: object) -> Peer:
        made.append(Peer(handler, **kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for peer in made:
        peer.stop()


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("pki")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _server_context(cert: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


def _body(n: int) -> bytes:
    return b"".join(f'train_steps_total{{rank="{i}"}} {i}\n'.encode() for i in range(n))


def test_every_peer_fails_alone_with_its_reason_in_one_round(peers: Callable[..., Peer]) -> None:
    """Eleven peers in one round: the honest ones' bodies byte for byte, every other its own reason."""
    big = _body(20_000)  # ~0.6 MB: many reads
    cases = {
        "honest": (peers(_answer(OK + b"a 1\n")), None, b"a 1\n"),
        "big": (peers(_answer(OK + big)), None, big),
        "head in pieces": (peers(_drip(OK + b"b 2\n", every=0.001)), None, b"b 2\n"),
        "empty body": (peers(_answer(OK)), None, b""),
        "redirect": (
            peers(_answer(b"HTTP/1.0 302 Found\r\nLocation: http://10.0.0.1/\r\n\r\n")),
            "redirect",
            b"",
        ),
        "status": (peers(_answer(b"HTTP/1.0 500 Oops\r\n\r\n")), "http_status", b""),
        "chunked": (
            peers(_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")),
            "protocol",
            b"",
        ),
        "gzip": (
            peers(_answer(b"HTTP/1.0 200 OK\r\nContent-Encoding: gzip\r\n\r\n\x1f\x8b")),
            "protocol",
            b"",
        ),
        "not http": (peers(_answer(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")), "protocol", b""),
        "closed before the head": (peers(_answer(b"HTTP/1.0 200")), "connect", b""),
        "head too large": (
            peers(_answer(b"HTTP/1.0 200 OK\r\nX: " + b"x" * 70_000 + b"\r\n\r\n")),
            "protocol",
            b"",
        ),
    }
    fetcher = Fetcher(timeout=5.0, max_bytes=1 << 20)
    got = fetcher.fetch_all([peer.url for peer, _, _ in cases.values()])
    for (name, (_, reason, body)), fetched in zip(cases.items(), got, strict=True):
        assert (fetched.error.reason if fetched.error else None) == reason, (name, fetched.error)
        assert fetched.body == body, name
        assert fetched.seconds < 5.0, name
    assert {r for _, r, _ in cases.values() if r} <= set(FETCH_ERRORS)


def test_a_round_ends_at_its_deadline_whatever_the_peers_do(peers: Callable[..., Peer]) -> None:
    """A peer that never answers, one that drips its head and one that drips its body all time out at
    the deadline; the honest peer in the same round is fetched, and the round takes the deadline."""
    honest = peers(_answer(OK + b"a 1\n"))
    silent = peers(_silent)
    head_drip = peers(_drip(OK + b"b" * 10_000, every=0.05))
    body_drip = peers(_drip(OK + b"c 3\n" * 1000, every=0.002))
    fetcher = Fetcher(timeout=5.0, max_bytes=1 << 20)
    began = time.perf_counter()
    got = fetcher.fetch_all([honest.url, silent.url, head_drip.url, body_drip.url], timeout=0.8)
    took = time.perf_counter() - began
    assert got[0].error is None and got[0].body == b"a 1\n"
    assert [g.error.reason if g.error else None for g in got[1:]] == ["timeout"] * 3
    assert 0.8 <= took < 3.0, took


def _split(data: bytes, at: int) -> Handler:
    def handler(conn: socket.socket) -> None:
        conn.sendall(data[:at])
        time.sleep(0.05)  # two reads: the first ends at ``at``
        conn.sendall(data[at:])

    return handler


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_head_whose_end_is_split_across_reads(peers: Callable[..., Peer], cut: int) -> None:
    """The blank line that ends the head arrives in two reads (cut 1, 2 or 3 bytes before its end):
    the head is found where the reads meet, and the body is not taken for more head."""
    head = b"HTTP/1.0 200 OK\r\nX: " + b"y" * 60_000 + b"\r\n\r\n"
    peer = peers(_split(head + b"d 4\n", len(head) - cut))
    got = Fetcher(timeout=5.0, max_bytes=1 << 20).fetch_all([peer.url])
    assert got[0].error is None and got[0].body == b"d 4\n", got[0].error


def test_byte_limits_per_url(peers: Callable[..., Peer]) -> None:
    body = _body(1000)
    peer = peers(_answer(OK + body))
    fetcher = Fetcher(timeout=5.0, max_bytes=len(body))
    exact, short, capped = fetcher.fetch_all(
        [peer.url] * 3, max_bytes=[len(body), len(body) - 1, 10 * len(body)]
    )
    assert exact.error is None and exact.body == body
    assert short.error is not None and short.error.reason == "too_large"
    assert capped.error is None  # at most the fetcher's own limit, which the body fits
    over = Fetcher(timeout=5.0, max_bytes=len(body) - 1).fetch_all([peer.url], max_bytes=[10 * len(body)])
    assert over[0].error is not None and over[0].error.reason == "too_large"


def test_refused_and_forbidden_targets(peers: Callable[..., Peer]) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    got = Fetcher(timeout=2.0, max_bytes=1024).fetch_all(
        [f"http://127.0.0.1:{port}/metrics", "http://10.1.2.3:9400/metrics", "ftp://127.0.0.1:1/x"]
    )
    assert [g.error.reason if g.error else None for g in got] == ["connect", "forbidden_target", "protocol"]
    # An allowed network is fetched (refused here: nothing listens, but it was tried, not forbidden).
    allowed = Fetcher(timeout=2.0, max_bytes=1024, networks=[ipaddress.ip_network("127.0.0.0/8")])
    assert allowed.fetch_all([f"http://127.0.0.1:{port}/metrics"])[0].error.reason == "connect"  # type: ignore[union-attr]


def test_tls_peer_fetched_with_its_ca_and_refused_without(
    peers: Callable[..., Peer], cert: tuple[Path, Path]
) -> None:
    big = _body(20_000)
    peer = peers(_answer(OK + big), tls=_server_context(cert))
    plain = peers(_answer(OK + b"a 1\n"), reads=False)  # answers whatever it is sent
    trusting = Fetcher(
        timeout=5.0, max_bytes=1 << 20, ssl_context=ssl.create_default_context(cafile=str(cert[0]))
    )
    good, speaks_plain = trusting.fetch_all([peer.url, plain.url.replace("http:", "https:")])
    assert good.error is None and good.body == big  # the whole body across TLS records and reads
    assert speaks_plain.error is not None and speaks_plain.error.reason == "tls"
    untrusting = Fetcher(timeout=5.0, max_bytes=1 << 20)
    bad = untrusting.fetch_all([peer.url])[0]
    assert (
        bad.error is not None and bad.error.reason == "tls" and "CERTIFICATE_VERIFY_FAILED" in str(bad.error)
    )


def test_ipv6_loopback(peers: Callable[..., Peer]) -> None:
    try:
        peer = peers(_answer(OK + b"v6 1\n"), family=socket.AF_INET6)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    got = Fetcher(timeout=2.0, max_bytes=1024).fetch_all([peer.url])
    assert got[0].error is None and got[0].body == b"v6 1\n"


def test_no_descriptor_is_left_open() -> None:
    """Every socket of a round is closed whatever became of its fetch (timeouts included). The silent
    peer never accepts: its connections wait in its backlog, holding no descriptor of this process."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    try:
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            got = Fetcher(timeout=0.2, max_bytes=1024).fetch_all([url] * 4 + ["http://127.0.0.1:1/x"])
            assert [g.error.reason if g.error else None for g in got] == ["timeout"] * 4 + ["connect"]
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        listener.close()
