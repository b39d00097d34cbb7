"""Node agent overhead: CPU time per scrape, side by side with the fabric and host collectors off and on.

Setup: an agent with N simulated GPUs (the real NVML collector over the fake NVML, the Xid collector's
threads) and M real trackers (``babysitter.watch`` in subprocesses, stepping) registered on the host.
With ``--fabric`` (the default) a second agent, built the same way, also reads a fake HGX-like sysfs
tree (babysitter.node.fabric.fake: each GPU with its single-port NIC, so N ports and 2N PCIe devices,
plus memory controllers and CPU packages). Each agent runs in a process of its own, as on a host (two
agents in one process share its caches and its threads, which made each scrape cost about a tenth
more than an agent alone: the method before 2026-12-02), and the two are scraped in turn, so both
columns come from the same minutes of the same machine. Measured in each agent's process only (the
trackers' own CPU is not the agent's):

- per scrape: process CPU time and wall time of ``Agent.render()`` (collect every collector, merge,
  render the exposition), the median over many scrapes;
- per collector: CPU of one ``collect()`` called directly (no thread), the median;
- render only: ``generate_latest`` of already-collected families (prometheus_client's renderer, for
  comparison with the agent's own);
- idle: process CPU per second with no scrape (background threads: simulator ticker, Xid readers).

Files on the fake tree are regular files, read the same way sysfs attributes are (open, read, close);
a real sysfs attribute read costs about as much in CPU (the kernel formats the value; an InfiniBand
counter may also wait on the NIC's firmware, which costs wall time, not CPU).

``--no-fabric`` runs the first agent alone, and runs against a checkout without the fabric
collectors (``PYTHONPATH=<old>/src``), for a before/after.

Usage: python benchmarks/bench_node_agent.py [--gpus 8] [--trainers 8] [--scrapes 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

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


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.2f} ms"


def _per_collector(agent: Any, rounds: int) -> dict[str, float]:
    """Median CPU seconds of each collector's collect(), called directly in turn."""
    found: dict[str, list[float]] = {}
    for _ in range(rounds):
        for runner in agent._runners:
            c0 = time.process_time()
            list(runner.collector.collect())
            found.setdefault(runner.name, []).append(time.process_time() - c0)
    return {name: statistics.median(values) for name, values in found.items()}


def _worker(spec: str) -> int:
    """One agent in this process, scraped on request: a JSON line in, a JSON line out (stdin/stdout)."""
    config = json.loads(spec)
    built = build(
        AgentConfig(
            simulate=config["gpus"],
            registry_dir=Path(config["registry"]),
            kmsg_path="",
            **(
                {"path_sysfs": config["sysfs"], "path_procfs": config["procfs"]}
                if config.get("sysfs")
                else {}
            ),
        )
    )
    agent = built.agent
    agent.render()  # warm up: GPM priming, connection setup, imports
    agent.render()
    out = sys.stdout
    try:
        for line in sys.stdin:
            ask = json.loads(line)
            if ask["do"] == "scrape":
                c0, w0 = time.process_time(), time.perf_counter()
                body = agent.render()
                answer: dict[str, Any] = {
                    "cpu": time.process_time() - c0,
                    "wall": time.perf_counter() - w0,
                    "bytes": len(body),
                    "series": sum(1 for x in body.decode().splitlines() if x and not x.startswith("#")),
                }
            elif ask["do"] == "collectors":
                answer = _per_collector(agent, ask["rounds"])
            elif ask["do"] == "generate_latest":
                registry = _Frozen(list(agent.collect()))
                times = []
                for _ in range(ask["rounds"]):
                    w0 = time.perf_counter()
                    generate_latest(registry)  # type: ignore[arg-type]
                    times.append(time.perf_counter() - w0)
                answer = {"median": statistics.median(times)}
            elif ask["do"] == "idle":
                c0, w0 = time.process_time(), time.perf_counter()
                time.sleep(ask["seconds"])
                answer = {"idle": (time.process_time() - c0) / (time.perf_counter() - w0)}
            else:
                break
            out.write(json.dumps(answer) + "\n")
            out.flush()
    finally:
        built.close()
    return 0


class _Agent:
    """An agent process (:func:`_worker`), asked and answered one JSON line at a time."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, **what: Any) -> Any:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(what) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the agent process exited ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # end of input: the worker closes its agent
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--trainers", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=60)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument(
        "--cores", type=int, default=8, help="CPU cores per package of the fake host (2 packages)"
    )
    parser.add_argument("--fabric", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=None, help="append a markdown result section here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return _worker(args.worker)

    with tempfile.TemporaryDirectory() as tmp:
        reg = Path(tmp) / "reg"
        procs = []
        for rank in range(args.trainers):  # ranks of one job, as torchrun would start them
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.trainers)}
            procs.append(subprocess.Popen([sys.executable, "-c", TRACKER, str(reg)], env=env))
        agents: dict[str, _Agent] = {}
        try:
            deadline = time.monotonic() + 60
            while len(registration.list_endpoints(reg)) < args.trainers:
                if time.monotonic() > deadline:
                    raise SystemExit("trackers did not register within 60 s")
                time.sleep(0.2)
            specs: dict[str, dict[str, Any]] = {"off": {"gpus": args.gpus, "registry": str(reg)}}
            if args.fabric:
                from babysitter.node.fabric.fake import FakeSysfs

                fake = FakeSysfs(Path(tmp) / "sys", Path(tmp) / "proc")
                fake.dgx(args.gpus, memory_controllers=2, packages=2, cores=args.cores)
                specs["on"] = {**specs["off"], "sysfs": str(fake.root), "procfs": str(fake.proc)}
            for name, spec in specs.items():
                agents[name] = _Agent(spec)
            cpu: dict[str, list[float]] = {name: [] for name in agents}
            wall: dict[str, list[float]] = {name: [] for name in agents}
            last: dict[str, dict[str, Any]] = {}
            for _ in range(args.scrapes):
                for name, agent in agents.items():  # in turn: both see the same machine load
                    got = agent.ask(do="scrape")
                    cpu[name].append(got["cpu"])
                    wall[name].append(got["wall"])
                    last[name] = got
            final = list(agents)[-1]
            per_collector = agents[final].ask(do="collectors", rounds=max(10, args.scrapes // 3))
            render = agents[final].ask(do="generate_latest", rounds=args.scrapes)["median"]
            idle = agents[final].ask(do="idle", seconds=args.idle_seconds)["idle"]
        finally:
            for agent in agents.values():
                agent.close()
            for proc in procs:
                proc.kill()
                proc.wait()

    names = list(agents)
    head = "| measure | " + " | ".join(f"collectors {n}" if args.fabric else "value" for n in names) + " |"
    rows = [
        ("agent CPU per scrape (median)", [_median_ms(cpu[n]) for n in names]),
        (
            "agent CPU per scrape (p90)",
            [f"{sorted(cpu[n])[int(0.9 * len(cpu[n]))] * 1e3:.2f} ms" for n in names],
        ),
        ("scrape wall time (median)", [_median_ms(wall[n]) for n in names]),
        ("/metrics", [f"{last[n]['bytes'] / 1024:.0f} KiB, {last[n]['series']} series" for n in names]),
    ]
    table = (
        head
        + "\n|---|"
        + "---|" * len(names)
        + "\n"
        + "".join(f"| {k} | {' | '.join(v)} |\n" for k, v in rows)
    )
    collectors = "| collector | CPU per collect() (median) |\n|---|---|\n" + "".join(
        f"| {name} | {seconds * 1e3:.2f} ms |\n" for name, seconds in per_collector.items()
    )
    extra = (
        f"render only, prometheus_client's generate_latest of the same families: {render * 1e3:.2f} ms; "
        f"idle CPU (background threads): {idle * 100:.2f} % of one core.\n"
    )
    fabric = (
        f", a fake host of {args.gpus} ports, {2 * args.gpus} PCIe devices, 2 memory controllers, "
        f"2 x {args.cores} cores"
        if args.fabric
        else ""
    )
    header = (
        f"## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {args.gpus} simulated GPUs, "
        f"{args.trainers} trainers{fabric}\n\n"
        f"Machine: {cpu_model()}, {os.cpu_count()} logical CPUs (shared with other jobs), "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}.\n"
        f"Command: `python benchmarks/bench_node_agent.py --gpus {args.gpus} --trainers {args.trainers} "
        f"--scrapes {args.scrapes}{'' if args.fabric else ' --no-fabric'}` "
        "(each agent in a process of its own)\n\n"
    )
    text = header + table + "\n" + collectors + "\n" + extra + "\n"
    print(text)
    if args.out is not None:
        with args.out.open("a") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
