"""Node agent overhead: CPU time per scrape and per second, and /metrics render time.

Setup: the agent in this process with N simulated GPUs (the real NVML collector over the fake NVML,
the Xid collector's threads) and M real trackers (``babysitter.watch`` in subprocesses, stepping)
registered on the host. Measured in this process only (the trackers' own CPU is not the agent's):

- per scrape: process CPU time and wall time of ``Agent.render()`` (collect every collector, merge,
  render the exposition), averaged over many scrapes;
- render only: ``generate_latest`` of already-collected families (the exposition cost alone);
- idle: process CPU per second with no scrape (background threads: simulator ticker, Xid readers);
- per second at a 15 s scrape interval: idle + per-scrape / 15.

Usage: python benchmarks/bench_node_agent.py [--gpus 8] [--trainers 8] [--scrapes 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.registry import Collector

from babysitter import registration
from babysitter.node.config import AgentConfig
from babysitter.node.daemon import build
from machine import cpu_model

TRACKER = textwrap.dedent(
    """
    import sys, time
    import babysitter
    t = babysitter.watch(run="bench", tokens_per_step=4096, flops_per_token=6e9, peak_flops=1e15,
                         port=0, registry_dir=sys.argv[1], ledger=False)
    while True:
        time.sleep(0.05)
        t.step()
    """
)


class _Frozen(Collector):
    def __init__(self, families: list[object]) -> None:
        self.families = families

    def collect(self):  # type: ignore[no-untyped-def]
        return self.families


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--trainers", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=60)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=None, help="append a markdown result section here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        reg = Path(tmp) / "reg"
        procs = []
        for rank in range(args.trainers):  # ranks of one job, as torchrun would start them
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.trainers)}
            procs.append(subprocess.Popen([sys.executable, "-c", TRACKER, str(reg)], env=env))
        try:
            deadline = time.monotonic() + 60
            while len(registration.list_endpoints(reg)) < args.trainers:
                if time.monotonic() > deadline:
                    raise SystemExit("trackers did not register within 60 s")
                time.sleep(0.2)
            config = AgentConfig(simulate=args.gpus, registry_dir=reg, kmsg_path="")
            running = build(config)
            agent = running.agent
            try:
                body = agent.render()  # warm up: GPM priming, connection setup, imports
                body = agent.render()
                cpu, wall = [], []
                for _ in range(args.scrapes):
                    c0, w0 = time.process_time(), time.perf_counter()
                    body = agent.render()
                    cpu.append(time.process_time() - c0)
                    wall.append(time.perf_counter() - w0)
                families = list(agent.collect())
                registry = _Frozen(families)
                render = []
                for _ in range(args.scrapes):
                    w0 = time.perf_counter()
                    generate_latest(registry)  # type: ignore[arg-type]
                    render.append(time.perf_counter() - w0)
                c0, w0 = time.process_time(), time.perf_counter()
                time.sleep(args.idle_seconds)
                idle = (time.process_time() - c0) / (time.perf_counter() - w0)
            finally:
                running.close()
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()

    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    per_scrape_cpu = statistics.median(cpu)
    rows = [
        ("agent CPU per scrape (median)", f"{per_scrape_cpu * 1e3:.1f} ms"),
        ("agent CPU per scrape (p90)", f"{sorted(cpu)[int(0.9 * len(cpu))] * 1e3:.1f} ms"),
        ("scrape wall time (median)", f"{statistics.median(wall) * 1e3:.1f} ms"),
        ("render only, generate_latest (median)", f"{statistics.median(render) * 1e3:.2f} ms"),
        ("idle CPU (background threads)", f"{idle * 100:.2f} % of one core"),
        (
            "CPU per second at a 15 s scrape interval",
            f"{(idle + per_scrape_cpu / 15) * 100:.2f} % of one core",
        ),
        ("/metrics size", f"{len(body) / 1024:.0f} KiB, {series} series"),
    ]
    header = (
        f"## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {args.gpus} simulated GPUs, "
        f"{args.trainers} trainers\n\n"
        f"Machine: {cpu_model()}, {os.cpu_count()} logical CPUs (shared with other jobs), "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}.\n"
        f"Command: `python benchmarks/bench_node_agent.py --gpus {args.gpus} --trainers {args.trainers} "
        f"--scrapes {args.scrapes}`\n\n| measure | value |\n|---|---|\n"
    )
    text = header + "".join(f"| {k} | {v} |\n" for k, v in rows) + "\n"
    print(text)
    if args.out is not None:
        with args.out.open("a") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
