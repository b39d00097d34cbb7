"""Slowloris: idle and half-sent connections beyond the file-descriptor limit never stop a scrape.

The tracker and the node agent each run in a subprocess whose RLIMIT_NOFILE is lowered to 128; the
test opens 300 connections that never finish their request (some send nothing, some half a request
line), then scrapes. A thread-per-connection server runs out of descriptors (EMFILE) and stops
accepting; a bounded server evicts the oldest idle connections and answers.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_helpers import read_port_file

FD_LIMIT = 128
IDLE_CONNECTIONS = 300

_LIMIT = textwrap.dedent(
    f"""
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT}))
    """
)

_TRACKER = _LIMIT + textwrap.dedent(
    """
    import sys, time
    import babysitter
    t = babysitter.watch(port=0, registry_dir=sys.argv[1], ledger=False, hang_timeout=None, run="loris")
    t.step(tokens=1)
    print(t.metrics_url, flush=True)
    time.sleep(600)
    """
)

_AGENT = _LIMIT + textwrap.dedent(
    """
    import sys
    from babysitter.cli import main
    sys.exit(main(["node-agent", "--port", "0", "--port-file", sys.argv[1], "--gpu-backend", "none",
                   "--no-collector.xid", "--no-collector.trainers"]))
    """
)


@contextlib.contextmanager
def _process(args: list[str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _flood(host: str, port: int) -> list[socket.socket]:
    """Open IDLE_CONNECTIONS connections; every other one sends half a request line and stops."""
    held: list[socket.socket] = []
    failures = 0
    for i in range(IDLE_CONNECTIONS):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.connect((host, port))
            if i % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            # Past the descriptor limit a server that stopped accepting has a full backlog: the
            # flood has done its work (stopping early keeps a failing run short).
            sock.close()
            failures += 1
            if failures >= 5 and len(held) >= FD_LIMIT:
                break
            continue
        held.append(sock)
    return held


def _scrape_while_flooded(url: str) -> str:
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    held = _flood(host, int(port))
    try:
        with urllib.request.urlopen(url, timeout=20) as response:  # noqa: S310 (loopback test URL)
            return str(response.read().decode())
    finally:
        for sock in held:
            sock.close()


def test_tracker_serves_under_more_idle_connections_than_descriptors(tmp_path: Path) -> None:
    """The tracker's endpoint answers a scrape while 300 idle connections exceed its 128-fd limit."""
    with _process([sys.executable, "-c", _TRACKER, str(tmp_path / "reg")]) as proc:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
        body = _scrape_while_flooded(url)
        assert 'train_steps_total{rank="0",run="loris"} 1.0' in body
        # and again, after the flood: nothing leaked
        with urllib.request.urlopen(url, timeout=20) as response:  # noqa: S310
            assert b"train_steps_total" in response.read()


def test_agent_serves_under_more_idle_connections_than_descriptors(tmp_path: Path) -> None:
    """The node agent's endpoint answers a scrape while 300 idle connections exceed its 128-fd limit."""
    port_file = tmp_path / "port"
    with _process([sys.executable, "-c", _AGENT, str(port_file)]) as proc:
        try:
            address = read_port_file(port_file, timeout=60)
        except AssertionError:
            proc.kill()
            pytest.fail(f"agent did not start: {proc.communicate()[1][-2000:]}")
        body = _scrape_while_flooded(f"http://{address}/metrics")
        assert "babysitter_collector_success" in body
