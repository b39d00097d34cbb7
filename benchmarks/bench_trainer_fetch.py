"""What fetching the registered trainers costs: the agent's Fetcher against a bare selectors loop.

The trainers collector fetches every registered rank at every scrape; after the parser and the renderer
were made fast (benchmarks/results/node_agent.md, issue 24), its fetch round was the largest cost left
(on asyncio then; on one selectors loop since). This measures the agent's
:class:`~babysitter.node.workloads.fetch.Fetcher` and, as a floor, the least a fetch can cost in Python:
one non-blocking ``selectors`` loop over plain-HTTP sockets (no TLS, no deadline per endpoint, no
response checks). Same endpoints, same process, interleaved. Run it with ``PYTHONPATH=<old>/src`` for
the Fetcher of another checkout.

Usage: python benchmarks/bench_trainer_fetch.py [--trainers 8] [--rounds 60]
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from babysitter import registration
from babysitter.node.workloads.fetch import Fetcher
from bench_node_agent import TRACKER
from machine import cpu_model


def _bare(urls: list[str]) -> dict[str, bytes]:
    """GET every URL over one selectors loop; the bodies (with their HTTP heads) by URL."""
    sel = selectors.DefaultSelector()
    for url in urls:
        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex((host, int(port)))
        sel.register(sock, selectors.EVENT_WRITE, [url, b""])
    out: dict[str, bytes] = {}
    deadline = time.monotonic() + 2.0
    while len(out) < len(urls) and time.monotonic() < deadline:
        for key, events in sel.select(0.5):
            sock, state = key.fileobj, key.data
            if events & selectors.EVENT_WRITE:
                sock.send(b"GET /metrics HTTP/1.0\r\nHost: x\r\nConnection: close\r\n\r\n")  # type: ignore[union-attr]
                sel.modify(sock, selectors.EVENT_READ, state)
                continue
            chunk = sock.recv(65536)  # type: ignore[union-attr]
            if chunk:
                state[1] += chunk
            else:
                sel.unregister(sock)
                sock.close()  # type: ignore[union-attr]
                out[state[0]] = state[1]
    sel.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        reg = Path(tmp) / "reg"
        procs = []
        for rank in range(args.trainers):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.trainers)}
            procs.append(subprocess.Popen([sys.executable, "-c", TRACKER, str(reg)], env=env))
        try:
            while len(registration.list_endpoints(reg)) < args.trainers:
                time.sleep(0.2)
            urls = [e.url for e in registration.list_endpoints(reg)]
            fetcher = Fetcher(timeout=2.0, max_bytes=512 * 1024)
            ways = {
                "Fetcher": lambda: fetcher.fetch_all(urls),
                "bare selectors loop": lambda: _bare(urls),
            }
            cpu: dict[str, list[float]] = {name: [] for name in ways}
            for fetch in ways.values():
                fetch()
            for _ in range(args.rounds):
                for name, fetch in ways.items():
                    c0 = time.process_time()
                    fetch()
                    cpu[name].append(time.process_time() - c0)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    print(
        f"Machine: {cpu_model()}, {os.cpu_count()} logical CPUs (shared). {args.trainers} trainers, "
        f"{args.rounds} rounds.\n\n| fetch of every trainer | CPU per round (median) |\n|---|---|"
    )
    for name, values in cpu.items():
        print(f"| {name} | {statistics.median(values) * 1e3:.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
