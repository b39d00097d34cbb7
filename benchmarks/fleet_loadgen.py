"""A fleet of simulated hosts for a real Prometheus: N node agents' expositions from a few processes.

What one host serves is captured once from the real exporters of this checkout: ``babysitter
node-agent --simulate 8`` (8 simulated H100s, a storage probe, the checkpoint sentinel) serving two
real trackers (rank 0 with its ledger, and rank 1) that stepped and saved a checkpoint. Host ``i``
then replays that capture with its own identity: GPU ``uuid``/``pci_bus_id`` made unique, and eight
ranks ``8i..8i+7`` of one job spanning the fleet (the rank-0 set of series for global rank 0, the
rank-1 set for every other rank). Counters grow at the rates they had in the capture, timestamps
follow the clock, GPU gauges jitter by a percent, so ``rate()``, the stall rules and compression see
realistic data. Series counts follow the exporters: when the catalog changes, so does the load.

Each worker process serves a slice of the hosts on one loopback port; host ``i`` is
``/metrics?host=i``. ``--targets-file`` writes the file_sd JSON Prometheus reads: one target per
host (``instance="host-0007:9946"``), ``job="babysitter-node"``, ``cluster="bench"``.

Usage: python benchmarks/fleet_loadgen.py --hosts 256 --processes 2 --targets-file targets.json
(runs until SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import http.server
import json
import math
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Template", "capture_template", "serve"]

_COUNTER_SUFFIXES = ("_total", "_sum", "_count", "_bucket")
#: GPU readings that move with the load (the rest, sizes and limits, stay put).
_JITTER = {
    "gpu_power_watts",
    "gpu_temperature_celsius",
    "gpu_utilization_ratio",
    "gpu_tensor_active_ratio",
    "gpu_memory_used_bytes",
}


@dataclass
class _Sample:
    name: str
    labels: dict[str, str]
    value: float
    kind: str  # counter | gauge | timestamp | age


@dataclass
class Template:
    """One host's exposition, split by who exports it; ``age`` is how long the capture ran."""

    types: dict[str, tuple[str, str]]  # family name -> (type, help)
    family_of: dict[str, str]  # sample name -> family name
    host: list[_Sample]  # the agent's own series and its GPUs'
    rank0: list[_Sample]
    rank: list[_Sample]
    age: float
    captured: float


def _kind(name: str, family_type: str) -> str:
    if name.endswith("_timestamp_seconds"):
        return "timestamp"
    if family_type in ("counter", "histogram", "summary") and name.endswith(_COUNTER_SUFFIXES):
        return "counter"
    return "gauge"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
        return str(response.read().decode())


def capture_template(workdir: Path, gpus: int = 8) -> Template:
    """Run the real exporters briefly and split their exposition into host, rank-0 and rank parts."""
    import babysitter

    reg, run_dir, storage = workdir / "reg", workdir / "run", workdir / "storage"
    for folder in (reg, run_dir, storage):
        folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    trackers = []
    for rank in (0, 1):
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="16")
        trackers.append(
            babysitter.watch(
                run="fleet",
                tokens_per_step=8 * 4096,
                flops_per_token=6 * 8e9,
                device="NVIDIA H100 80GB HBM3",
                dtype="bf16",
                port=0,
                registry_dir=reg,
                run_dir=run_dir if rank == 0 else None,
                labels={"cluster": "bench"},
                flush_interval=0.2,
            )
        )
    argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", str(gpus)]
    argv += ["--port", "0", "--port-file", str(workdir / "addr"), "--registry-dir", str(reg)]
    argv += ["--storage-path", str(storage), "--checkpoint-run-dir", str(run_dir)]
    argv += ["--simulate-kernel-log", str(workdir / "kern.log")]
    with (workdir / "agent.log").open("wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        for step in range(1, 41):
            for tracker in trackers:
                tracker.step(loss=2.0)
            if step % 20 == 0:
                for rank, tracker in enumerate(trackers):
                    path = run_dir / f"ckpt-{step}-rank{rank}.pt"
                    with tracker.checkpoint_save(step=step, nbytes=64, path=str(path)):
                        path.write_bytes(bytes(64))
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while not (workdir / "addr").exists() or not (workdir / "addr").read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError("node agent did not start")
            time.sleep(0.2)
        url = f"http://{(workdir / 'addr').read_text().strip()}/metrics"
        time.sleep(3)  # storage probe and sentinel have run
        text = _get(url)
        text = _get(url)
    finally:
        agent.terminate()
        agent.wait(timeout=20)
        for tracker in trackers:
            tracker.close()
    return _split(text, age=time.time() - started)


def _split(text: str, age: float) -> Template:
    types: dict[str, tuple[str, str]] = {}
    family_of: dict[str, str] = {}
    host: list[_Sample] = []
    rank0: list[_Sample] = []
    rank: list[_Sample] = []
    for family in text_string_to_metric_families(text):
        ftype = family.type
        # The text format names a counter's TYPE line after its _total sample.
        exposed = f"{family.name}_total" if ftype == "counter" else family.name
        types[exposed] = (ftype, family.documentation)
        for s in family.samples:
            family_of[s.name] = exposed
            sample = _Sample(s.name, dict(s.labels), float(s.value), _kind(s.name, ftype))
            who = s.labels.get("rank")
            if who is None:
                host.append(sample)
            elif who == "0":
                rank0.append(sample)
            elif who == "1":
                rank.append(sample)
    return Template(types, family_of, host, rank0, rank, age, time.time())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} " if inner else f"{name} "


class _Host:
    """Host ``index``: its lines with a value slot each, rendered at most once per ``cache`` seconds."""

    def __init__(self, template: Template, index: int, ranks: int, cache: float) -> None:
        self.index = index
        self.cache = cache
        self._rng = random.Random(index)
        self._body = b""
        self._rendered = 0.0
        by_family: dict[str, list[tuple[str, _Sample]]] = {}
        tag = f"{index:04x}"
        for s in template.host:
            labels = dict(s.labels)
            if "uuid" in labels:
                labels["uuid"] = f"GPU-{tag}{labels['uuid'][8:]}"
            if "pci_bus_id" in labels:
                labels["pci_bus_id"] = f"{index % 0xFFFF:04x}{labels['pci_bus_id'][4:]}"
            by_family.setdefault(template.family_of[s.name], []).append((_line(s.name, labels), s))
        for local in range(ranks):
            global_rank = index * ranks + local
            source = template.rank0 if global_rank == 0 else template.rank
            for s in source:
                labels = {**s.labels, "rank": str(global_rank)}
                by_family.setdefault(template.family_of[s.name], []).append((_line(s.name, labels), s))
        self._families = [
            (f"# HELP {name} {template.types[name][1]}\n# TYPE {name} {template.types[name][0]}\n", lines)
            for name, lines in by_family.items()
        ]
        self._age = max(template.age, 1.0)
        self._t0 = time.time()
        self._captured = template.captured

    def body(self) -> bytes:
        now = time.time()
        if now - self._rendered < self.cache and self._body:
            return self._body
        grow = (now - self._t0 + self._age) / self._age
        shift = now - self._captured
        jitter = self._rng.uniform
        out: list[str] = []
        for header, lines in self._families:
            out.append(header)
            for prefix, s in lines:
                if s.kind == "counter":
                    value = s.value * grow
                elif s.kind == "timestamp":
                    value = s.value + shift if s.value > 0 else 0.0
                elif s.name in _JITTER:
                    value = s.value * jitter(0.99, 1.01)
                    if s.name.endswith("_ratio"):
                        value = min(value, 1.0)
                else:
                    value = s.value
                out.append(f"{prefix}{value!r}\n" if math.isfinite(value) else f"{prefix}NaN\n")
        self._body = "".join(out).encode()
        self._rendered = now
        return self._body


def serve(template: Template, hosts: range, port: int, ranks: int, cache: float) -> None:
    """Serve ``hosts`` on 127.0.0.1:``port`` until terminated."""
    table = {i: _Host(template, i, ranks, cache) for i in hosts}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            host = table.get(int(query.get("host", ["-1"])[0]))
            if host is None:
                self.send_error(404)
                return
            body = host.body()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    server.serve_forever()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--ranks-per-host", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--cache", type=float, default=10.0, help="seconds a rendered body is reused")
    parser.add_argument("--targets-file", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fleet-"))
    template = capture_template(workdir)
    per_host = len(template.host) + len(template.rank0) + (args.ranks_per_host - 1) * len(template.rank)
    print(
        f"template: host {len(template.host)} series, rank 0 {len(template.rank0)}, "
        f"rank {len(template.rank)}; "
        f"{per_host} per host with rank 0",
        flush=True,
    )
    slices = [range(i, args.hosts, args.processes) for i in range(args.processes)]
    ports = [_free_port() for _ in slices]
    workers = [
        multiprocessing.Process(
            target=serve, args=(template, hosts, port, args.ranks_per_host, args.cache), daemon=True
        )
        for hosts, port in zip(slices, ports, strict=True)
    ]
    for worker in workers:
        worker.start()
    targets = [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {"__param_host": str(i), "instance": f"host-{i:04d}:9946", "cluster": "bench"},
        }
        for hosts, port in zip(slices, ports, strict=True)
        for i in hosts
    ]
    tmp = args.targets_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(targets))
    tmp.replace(args.targets_file)
    print(f"serving {args.hosts} hosts on ports {ports}", flush=True)

    def stop(*_: object) -> None:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=5)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for worker in workers:
        worker.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
