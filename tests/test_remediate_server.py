"""The webhook receiver: token, TLS and mutual TLS, bounded bodies, slow clients, metrics."""

from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from babysitter.export.server import tls_context
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.policy import parse_policy
from babysitter.remediate.server import WebhookServer
from remediate_helpers import RecordingBackend, alert, payload

TOKEN = "webhook-token-0123456789"  # noqa: S105 - a test token


def remediator(tmp: Path, backend: RecordingBackend) -> Remediator:
    policy = parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(tmp / "audit.jsonl"),
            "rails": {
                "rate_limit": {"actions": 10, "window": "10m"},
                "drain_cap": {"fraction": 0.5, "window": "1h"},
            },
            "rules": [{"match": {"alertname": "GpuDown"}, "actions": ["drain"]}],
        }
    )
    return Remediator(policy, backend, AuditLog(policy.audit_log))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[WebhookServer, RecordingBackend]]:
    backend = RecordingBackend(["n1", "n2"])
    server = WebhookServer(
        remediator(tmp_path, backend), "127.0.0.1", 0, token=TOKEN, request_timeout=2.0, max_connections=4
    ).start()
    yield server, backend
    server.close()


def post(url: str, body: bytes, headers: dict[str, str], context: ssl.SSLContext | None = None) -> int:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def good_body() -> bytes:
    return json.dumps(payload(alert("GpuDown", instance="n1:9400", gpu="2"))).encode()


def test_token_is_required_and_metrics_count_it(served: tuple[WebhookServer, RecordingBackend]) -> None:
    """No token or a wrong one: 401 and nothing happens; the right one: the host is drained."""
    server, backend = served
    assert post(server.url, good_body(), {}) == 401
    assert post(server.url, good_body(), {"Authorization": "Bearer nope"}) == 401
    assert post(server.url, good_body(), {"Authorization": f"Basic {TOKEN}"}) == 401
    assert backend.calls == []
    assert post(server.url, good_body(), {"Authorization": f"Bearer {TOKEN}"}) == 200
    assert server.wait_idle(10)
    assert backend.calls == [("drain", "n1", False)]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
    assert 'remediation_notifications_total{result="unauthorized"} 3.0' in metrics
    assert 'remediation_actions_total{action="drain",result="ok"} 1.0' in metrics
    assert "remediation_drained_nodes 1.0" in metrics


def test_bodies_are_bounded_and_checked(served: tuple[WebhookServer, RecordingBackend]) -> None:
    """Oversized, length-less, non-JSON and non-Alertmanager bodies are refused with 4xx."""
    server, backend = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert post(server.url, b"x" * (1024 * 1024 + 1), auth) == 413
    assert post(server.url, b"{not json", auth) == 400
    assert post(server.url, json.dumps({"alerts": "no"}).encode(), auth) == 400
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(f"POST /alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        assert re.match(rb"HTTP/1\.[01] 411 ", sock.recv(100))
    assert post(f"http://127.0.0.1:{server.port}/other", good_body(), auth) == 404
    assert server.notifications["rejected"] == 4 and backend.calls == []


def test_slow_clients_are_cut_off_and_others_served(served: tuple[WebhookServer, RecordingBackend]) -> None:
    """Connections that never finish their request are closed after the request timeout; at most
    max_connections are held; a prompt client is served meanwhile and afterwards."""
    server, _ = served
    slow = []
    for _ in range(8):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(b"POST /alerts HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
        slow.append(sock)
    start = time.monotonic()
    closed = 0
    for sock in slow:
        try:
            data = sock.recv(100)
        except OSError:
            data = b""
        closed += data == b""
        sock.close()
    assert closed == 8 and time.monotonic() - start < 8
    assert post(server.url, good_body(), {"Authorization": f"Bearer {TOKEN}"}) == 200


def test_idle_connections_cannot_lock_alertmanager_out(
    served: tuple[WebhookServer, RecordingBackend],
) -> None:
    """With max_connections idle connections held open (a slowloris), a notification is still served
    at once: the oldest idle connection makes room, the receiver does not turn the newcomer away."""
    server, backend = served
    idle = []
    try:
        for _ in range(4):  # the fixture's max_connections
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"POST /alerts HTTP/1.1\r\n")
            idle.append(sock)
        time.sleep(0.2)  # the receiver holds all four
        assert post(server.url, good_body(), {"Authorization": f"Bearer {TOKEN}"}) == 200
        assert server.wait_idle(10)
        assert backend.calls == [("drain", "n1", False)]
    finally:
        for sock in idle:
            sock.close()


def test_the_body_of_an_unauthenticated_request_is_never_read(
    served: tuple[WebhookServer, RecordingBackend],
) -> None:
    """A POST without the token that declares a 1 MiB body is answered 401 on its head alone."""
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"POST /alerts HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
        assert re.match(rb"HTTP/1\.[01] 401 ", sock.recv(100))
    assert server.counts()["unauthorized"] == 1


def _openssl(tmp: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    argv = [
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=127.0.0.1",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
        "-keyout",
        str(key),
        "-out",
        str(cert),
    ]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return cert, key


def test_mutual_tls(tmp_path: Path) -> None:
    """With a client CA the receiver speaks HTTPS only and wants a client certificate it signed."""
    cert, key = _openssl(tmp_path)
    backend = RecordingBackend(["n1"])
    context = tls_context(str(cert), str(key), str(cert))
    server = WebhookServer(remediator(tmp_path, backend), "127.0.0.1", 0, ssl_context=context).start()
    try:
        assert server.url.startswith("https://")
        anonymous = ssl.create_default_context(cafile=str(cert))
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            post(server.url, good_body(), {}, anonymous)
        client = ssl.create_default_context(cafile=str(cert))
        client.load_cert_chain(str(cert), str(key))
        assert post(server.url, good_body(), {}, client) == 200
        assert server.wait_idle(10)
        assert backend.calls == [("drain", "n1", False)]
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            post(server.url.replace("https", "http"), good_body(), {})
    finally:
        server.close()


def test_cli_refuses_a_readable_token_file_and_bad_addresses(tmp_path: Path, caplog: Any) -> None:
    """Setup errors exit 2 with a message naming the culprit."""
    from babysitter.cli import main

    policy = Path(__file__).resolve().parents[1] / "exporters/remediate-policy.example.yaml"
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o644)
    assert main(["remediate", "--policy", str(policy), "--token-file", str(token)]) == 2
    assert "readable by others (chmod 600 it)" in caplog.text
    assert main(["remediate", "--policy", str(policy), "--listen-address", "9097"]) == 2
    assert "expected HOST:PORT" in caplog.text
    assert main(["remediate", "--policy", str(policy), "--tls-cert", "c.pem"]) == 2
    assert "--tls-cert and --tls-key go together" in caplog.text
