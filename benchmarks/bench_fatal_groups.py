"""What the fast rule groups cost: the hard faults' alerts evaluated over 6 h of one fleet's counters.

The hard GPU faults' group and the fatal AER group are evaluated every ``fatal_eval_interval`` (5 s),
three times as often as the other paging groups, so that a GPU or the PCIe link under it pages within
30 s. Their counters' rules look back 6 h (``last_over_time(...[6h] offset 15m)``: the value before
the window, robust to a young series and a reset), so each evaluation loads every sample of those 6 h.
A live fleet benchmark (``bench_fleet.py``, ``bench_rule_samples.py``) holds minutes of data, not 6 h;
this one backfills them.

One host's series are captured from the real node agent of this checkout (``--simulate 8`` on an
HGX-like fake sysfs tree: 8 GPUs, a NIC beside each), the families the measured rules read are kept,
and ``--hosts`` copies of them (GPU identities and the instance made unique) are written as 6 h 20 m
of 15 s samples, backfilled with ``promtool tsdb create-blocks-from openmetrics`` and served by a real
Prometheus. Each alert of the measured groups is evaluated as an instant query at the end,
``--repeat`` times; Prometheus's own count of its work (``stats.samples.totalQueryableSamples``) does
not depend on the machine's load, the evaluation time does. Samples per second is samples per
evaluation over the group's interval: what the rule costs the server, steadily.

Usage: python benchmarks/bench_fatal_groups.py --hosts 16 [--rules alerts]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from babysitter.catalog import ALL

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests"))  # the scorecard tests' backfill, the agents' port file
from bench_rule_samples import _cost  # noqa: E402
from machine import cpu_model  # noqa: E402
from node_helpers import read_port_file  # noqa: E402
from test_scorecard_helpers import backfilled_prometheus  # noqa: E402

#: The groups measured: the two fast ones, the fabric group the AER alerts were in before, and the
#: other groups that read the same counters over ``memory`` (the fabric records, the GPU group's Xids).
GROUPS = (
    "babysitter-gpu-fatal.alerts",
    "babysitter-fabric-fatal.alerts",
    "babysitter-fabric.alerts",
    "babysitter-fabric.rules",
    "babysitter-gpu.alerts",
)
#: A group without ``interval`` runs at the server's evaluation_interval: exporters/prometheus-scrape.yml
#: sets none, so Prometheus's default, 1 m.
DEFAULT_INTERVAL = 60.0
SCRAPE = 15.0
SPAN = 6 * 3600 + 20 * 60


def _capture(work: Path) -> str:
    """One host's exposition from the real node agent over a fake HGX sysfs tree."""
    from babysitter.node.fabric.fake import FakeSysfs
    from babysitter.node.gpu.fake import fake_gpus

    fs = FakeSysfs(work / "sys", work / "proc")
    fs.dgx(8, uuids=tuple(g.uuid for g in fake_gpus(8, host=1)), memory_controllers=2)
    (work / "registry").mkdir()
    argv = [sys.executable, "-m", "babysitter", "node-agent", "--listen-address", "127.0.0.1:0"]
    argv += ["--port-file", str(work / "addr"), "--simulate", "8", "--simulate-host", "1"]
    argv += ["--registry-dir", str(work / "registry"), "--path.sysfs", str(work / "sys")]
    argv += ["--path.procfs", str(work / "proc")]
    with (work / "agent.log").open("wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://{read_port_file(work / 'addr', timeout=60)}/metrics"
        time.sleep(2)
        with urllib.request.urlopen(url, timeout=30) as response:
            return str(response.read().decode())
    finally:
        agent.terminate()
        agent.wait(timeout=20)


def _alerts(rules: Path) -> list[tuple[str, str, str, float]]:
    """``(group, alert or record, expr, interval seconds)`` of every rule in the measured groups."""
    out: list[tuple[str, str, str, float]] = []
    for name in ("babysitter-rules.yaml", "babysitter-alerts.yaml"):
        for group in yaml.safe_load((rules / name).read_text())["groups"]:
            if group["name"] in GROUPS:
                interval = float(str(group.get("interval", f"{DEFAULT_INTERVAL:g}s")).rstrip("s"))
                out.extend(
                    (group["name"], r.get("alert") or r["record"], r["expr"], interval)
                    for r in group["rules"]
                )
    return out


def _series(exposition: str, families: set[str]) -> list[tuple[str, str, float]]:
    """``(name, labels inside the braces, value)`` of the samples of ``families``."""
    out = []
    for line in exposition.splitlines():
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if match and match.group(1) in families:
            out.append((match.group(1), match.group(2) or "", float(match.group(3))))
    return out


def _openmetrics(path: Path, series: list[tuple[str, str, float]], hosts: int, end: float) -> int:
    """Write ``hosts`` copies of ``series`` over SPAN at SCRAPE spacing; returns the samples written."""
    names = sorted({name for name, _, _ in series})
    steps = int(SPAN / SCRAPE)
    written = 0
    with path.open("w") as out:
        for name in names:
            base = name.removesuffix("_total")
            kind = "counter" if name.endswith("_total") else "gauge"
            out.write(f"# TYPE {base} {kind}\n")
            for host in range(hosts):
                for sname, labels, value in series:
                    if sname != name:
                        continue
                    mine = re.sub(r'uuid="GPU-....', f'uuid="GPU-{host:04x}', labels)
                    own = f'cluster="bench",instance="host-{host:04d}:9400",job="babysitter-node"'
                    full = f"{own},{mine}" if mine else own
                    for step in range(steps):
                        out.write(f"{name}{{{full}}} {value!r} {end - SPAN + step * SCRAPE:.3f}\n")
                    written += steps
        out.write("# EOF\n")
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rules", type=Path, default=REPO / "alerts")
    args = parser.parse_args()
    alerts = _alerts(args.rules)
    exprs = " ".join(a[2] for a in alerts)
    families = {m.name for m in ALL if re.search(rf"\b{re.escape(m.name)}\b", exprs)}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-fatal-groups-") as tmp:
        work = Path(tmp)
        (work / "capture").mkdir()
        series = _series(_capture(work / "capture"), families)
        per_family = {f: sum(1 for s in series if s[0] == f) for f in sorted(families)}
        end = (time.time() // 3600 - 2) * 3600  # whole hours, before the head block's range
        written = _openmetrics(work / "data.om", series, args.hosts, end)
        started = time.monotonic()
        with backfilled_prometheus(work, [work / "data.om"]) as url:
            backfill = time.monotonic() - started
            rows = []
            for group, name, expr, interval in alerts:
                costs = [_cost(url, expr, end) for _ in range(args.repeat)]
                samples = costs[0][0]
                if any(c[0] != samples for c in costs):
                    raise RuntimeError(f"{name}: samples differ between evaluations: {costs}")
                rows.append((group, name, interval, samples, statistics.median(c[2] for c in costs)))
    print(_report(args, per_family=per_family, written=written, backfill=backfill, rows=rows, load=load))
    return 0


def _report(
    args: argparse.Namespace,
    *,
    per_family: dict[str, int],
    written: int,
    backfill: float,
    rows: list[tuple[str, str, float, int, float]],
    load: tuple[float, float, float],
) -> str:
    families = ", ".join(f"`{f}` {n}" for f, n in per_family.items())
    lines = [
        f"Machine: {cpu_model()}, {os.cpu_count()} logical CPUs (shared), load average {load[0]:.1f} "
        "at start.",
        f"Command: `python benchmarks/bench_fatal_groups.py --hosts {args.hosts} --repeat {args.repeat}"
        + ("" if args.rules == REPO / "alerts" else f" --rules {args.rules}")
        + "`.",
        "",
        f"One host's series of the families the measured rules read (the real node agent, 8 simulated "
        f"H100s, 8 NICs): {families}. {args.hosts} hosts, {SPAN / 3600:.2f} h at {SCRAPE:g} s: "
        f"{written:,} samples, backfilled and served in {backfill:.0f} s.",
        "",
        "| group | rule | interval | samples per evaluation | per host | per host per second | "
        "evaluation, median (ms) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    groups: dict[str, list[float]] = {}
    for group, name, interval, samples, seconds in rows:
        per_host = samples / args.hosts
        lines.append(
            f"| `{group}` | {name} | {interval:g} s | {samples:,} | {per_host:,.0f} | "
            f"{per_host / interval:,.0f} | {seconds * 1000:.1f} |"
        )
        total = groups.setdefault(group, [interval, 0.0, 0.0])
        total[1] += per_host / interval
        total[2] += seconds
    lines += [
        "",
        "Per group: a group's rules run one after another, so its evaluation must end within its "
        "interval; the hosts at which it would fill the interval, extrapolated linearly from this run:",
        "",
        "| group | interval | samples per host per second | evaluation per host (ms) | hosts to fill "
        "the interval |",
        "|---|---:|---:|---:|---:|",
    ]
    for group, (interval, per_second, seconds) in groups.items():
        per_host_ms = seconds * 1000 / args.hosts
        lines.append(
            f"| `{group}` | {interval:g} s | {per_second:,.0f} | {per_host_ms:.2f} | "
            f"{interval * 1000 / per_host_ms:,.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
