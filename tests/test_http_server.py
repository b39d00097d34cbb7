"""The bounded metrics server: deadlines, eviction of idle connections, and what it answers."""

from __future__ import annotations

import gzip
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from babysitter.export.server import MetricsServer, Request, Response, tls_context
from node_helpers import wait_for


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("alpha", "a", registry=registry).set(1)
    Gauge("beta", "b", registry=registry).set(2)
    return registry


@pytest.fixture(name="server")
def _server() -> Iterator[MetricsServer]:
    server = MetricsServer(_registry(), "127.0.0.1", 0, request_timeout=0.5, max_connections=4).start()
    yield server
    server.close()


def _connect(server: MetricsServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _raw(server: MetricsServer, request: bytes) -> bytes:
    with _connect(server) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_half_sent_request_is_cut_at_the_read_deadline(server: MetricsServer) -> None:
    """A client that sends half a request is disconnected after request_timeout, not held forever."""
    with _connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        assert sock.recv(1) == b""  # closed by the server (the socket timeout is 10 s)
    wait_for(lambda: server.connections == 0)


def test_oldest_idle_connection_makes_room(server: MetricsServer) -> None:
    """Beyond max_connections idle connections, the oldest are closed and a new scrape is answered."""
    idle = [_connect(server) for _ in range(10)]
    try:
        wait_for(lambda: server.connections <= 4)
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read()
        assert b"alpha 1.0" in body
        idle[0].settimeout(10)
        assert idle[0].recv(1) == b""  # the oldest was evicted
    finally:
        for sock in idle:
            sock.close()


def test_oversized_and_garbage_requests_are_refused(server: MetricsServer) -> None:
    """A request head over 8 KiB is dropped; a malformed request line gets 400; POST gets 405."""
    assert _raw(server, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n") == b""
    assert _raw(server, b"\xff\xfe garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert _raw(server, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")


def test_head_gzip_and_name_filter(server: MetricsServer) -> None:
    """HEAD sends headers only; gzip when accepted; name[] restricts the families."""
    head = _raw(server, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert head.endswith(b"\r\n\r\n")
    zipped = _raw(server, b"GET /metrics?name[]=beta HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")
    headers, body = zipped.split(b"\r\n\r\n", 1)
    assert b"Content-Encoding: gzip" in headers
    text = gzip.decompress(body)
    assert b"beta 2.0" in text
    assert b"alpha" not in text


def test_closed_server_releases_the_port() -> None:
    """After close() the port can be bound again and nothing answers."""
    server = MetricsServer(_registry(), "127.0.0.1", 0).start()
    port = server.port
    server.close()
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_idle_handshake_is_cut_and_tls_scrape_works(tmp_path: Path) -> None:
    """A client that never starts its TLS handshake is cut at the deadline; a real one is served."""
    cert, key = _self_signed(tmp_path)
    server = MetricsServer(
        _registry(), "127.0.0.1", 0, ssl_context=tls_context(str(cert), str(key)), request_timeout=0.5
    ).start()
    try:
        with _connect(server) as idle:
            assert idle.recv(1) == b""
        context = ssl.create_default_context(cafile=str(cert))
        body = urllib.request.urlopen(
            f"https://127.0.0.1:{server.port}/metrics", timeout=10, context=context
        ).read()
        assert b"alpha 1.0" in body
    finally:
        server.close()


def test_tls_context_names_the_missing_file(tmp_path: Path) -> None:
    """A missing certificate is an error naming it, before anything is served."""
    with pytest.raises(OSError, match=r"nope\.pem"):
        tls_context(str(tmp_path / "nope.pem"), str(tmp_path / "nope.key"))


class _Echo:
    """A handler that refuses heads without ``X-Key: k``, echoes POST bodies, leaves GET to metrics."""

    max_body = 64 * 1024

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def check(self, request: Request) -> Response | None:
        if request.method == "POST" and request.headers.get("x-key") != "k":
            return Response(401, b"no\n")
        return None

    def answer(self, request: Request) -> Response | None:
        if request.method != "POST":
            return None
        self.bodies.append(request.body)
        return Response(200, b"got " + str(len(request.body)).encode() + b"\n")


@pytest.fixture(name="echo")
def _echo() -> Iterator[tuple[MetricsServer, _Echo]]:
    handler = _Echo()
    server = MetricsServer(
        _registry(), "127.0.0.1", 0, request_timeout=0.5, max_connections=4, handler=handler
    ).start()
    yield server, handler
    server.close()


def test_a_handler_gets_the_body_however_it_is_split(echo: tuple[MetricsServer, _Echo]) -> None:
    """A POST body sent in pieces after its head reaches the handler whole; GET still serves metrics."""
    server, handler = echo
    body = bytes(range(256)) * 100
    with _connect(server) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nX-Key: k\r\nContent-Length: 25600\r\n\r\n" + body[:10])
        time.sleep(0.05)
        sock.sendall(body[10:9000])
        time.sleep(0.05)
        sock.sendall(body[9000:])
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"got 25600\n")
    assert handler.bodies == [body]
    assert b"alpha 1.0" in _raw(server, b"GET /metrics HTTP/1.1\r\n\r\n")


def test_a_handler_refuses_heads_and_bodies_it_will_not_read(echo: tuple[MetricsServer, _Echo]) -> None:
    """Refused by check(), too large, chunked or of no plain length: answered on the head, the body
    never reaches the handler; a client still sending the body it declared gets the answer (not a
    reset); a body that stops short is cut at the request deadline."""
    server, handler = echo
    assert _raw(server, b"POST /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc").startswith(b"HTTP/1.1 401 ")
    big = 200 * 1024
    too_large = b"POST /x HTTP/1.1\r\nX-Key: k\r\nContent-Length: %d\r\n\r\n" % big + b"x" * big
    assert _raw(server, too_large).startswith(b"HTTP/1.1 413 ")
    chunked = b"POST /x HTTP/1.1\r\nX-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    assert _raw(server, chunked).startswith(b"HTTP/1.1 411 ")
    assert _raw(server, b"POST /x HTTP/1.1\r\nX-Key: k\r\nContent-Length: -1\r\n\r\n").startswith(
        b"HTTP/1.1 411 "
    )
    with _connect(server) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nX-Key: k\r\nContent-Length: 100\r\n\r\nonly this")
        assert sock.recv(1) == b""  # cut at the deadline, no answer
    assert handler.bodies == []
    wait_for(lambda: server.connections == 0)
