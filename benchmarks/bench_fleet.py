"""Fleet benchmark: a real Prometheus with the generated rules scraping N simulated hosts.

For each fleet size the load generator (``benchmarks/fleet_loadgen.py``: the real exporters'
exposition replayed for N hosts of 8 GPUs and 8 ranks, one job spanning the fleet) is scraped every
15 s by Prometheus 2.x loading ``alerts/babysitter-rules.yaml`` and ``alerts/babysitter-alerts.yaml``
(evaluated every 15 s). After a warm-up it measures, from Prometheus' own metrics and the OS:

- active series (``prometheus_tsdb_head_series``) and samples appended per second;
- resident memory of Prometheus (peak over the measurement) and bytes per active series;
- each rule group's evaluation time (``prometheus_rule_group_last_duration_seconds``, max over the
  measurement) against its interval;
- the time and the samples (``stats=all``) of every ``babysitter scorecard`` query over the data held;
- the CPU Prometheus and the load generator used.

Every run is bounded in time (``--warmup`` + ``--measure``) and memory (Prometheus is stopped when
its RSS passes ``--max-rss-gib``), and every process it starts is stopped. Results go to
``--out`` (markdown, appended) and ``--json``; the fit of each measure against the host count and
its projection to 2,048 hosts (16,384 GPUs) are computed over the sizes of one invocation.

Usage: python benchmarks/bench_fleet.py --hosts 64 128 256 [--warmup 240] [--measure 120]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
RULES = [REPO / "alerts/babysitter-rules.yaml", REPO / "alerts/babysitter-alerts.yaml"]
INTERVAL = 15.0
PROJECT_HOSTS = 2048


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _query(url: str, expr: str, *, stats: bool = False, timeout: float = 120.0) -> dict[str, Any]:
    params = {"query": expr, **({"stats": "all"} if stats else {})}
    data = urllib.parse.urlencode(params).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=data, timeout=timeout) as response:  # noqa: S310
        body: dict[str, Any] = json.loads(response.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body


def _scalar(url: str, expr: str) -> float:
    result = _query(url, expr)["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def _cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def _scorecard_queries(window: str) -> dict[str, str]:
    from babysitter.scorecard.queries import QuerySet

    q = QuerySet(window=window, step="1m")
    names = (
        "mfu",
        "goodput",
        "gpu_hours",
        "rank_hours",
        "restarts",
        "xid_errors",
        "checkpoint_bandwidth",
        "storage_p99",
    )
    return {name: getattr(q, name)() for name in names}


def run_size(hosts: int, warmup: float, measure: float, max_rss_gib: float, workdir: Path) -> dict[str, Any]:
    """One fleet size, start to stop; the measured values."""
    workdir.mkdir(parents=True, exist_ok=True)
    targets = workdir / "targets.json"
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        log = (workdir / "loadgen.log").open("wb")
        logs.append(log)
        loadgen = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "benchmarks/fleet_loadgen.py"),
                *("--hosts", str(hosts), "--targets-file", str(targets)),
                *("--workdir", str(workdir / "capture")),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(loadgen)
        deadline = time.monotonic() + 180
        while not targets.exists():
            if loadgen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"load generator failed: {(workdir / 'loadgen.log').read_text()[-2000:]}")
            time.sleep(0.5)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        config = {
            "global": {"scrape_interval": f"{INTERVAL:g}s", "evaluation_interval": f"{INTERVAL:g}s"},
            "rule_files": [str(p) for p in RULES],
            "scrape_configs": [
                {
                    "job_name": "babysitter-node",
                    "honor_labels": True,
                    "scrape_timeout": "12s",
                    "file_sd_configs": [{"files": [str(targets)]}],
                },
                {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
            ],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))
        log = (workdir / "prometheus.log").open("wb")
        logs.append(log)
        prom = subprocess.Popen(
            [
                shutil.which("prometheus") or "/usr/bin/prometheus",
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(prom)
        pp, lp = psutil.Process(prom.pid), psutil.Process(loadgen.pid)
        started = time.monotonic()
        peak_rss = 0

        def watch(until: float) -> None:
            nonlocal peak_rss
            while time.monotonic() < until:
                if prom.poll() is not None:
                    raise RuntimeError(
                        f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}"
                    )
                rss = pp.memory_info().rss
                peak_rss = max(peak_rss, rss)
                if rss > max_rss_gib * 2**30:
                    raise RuntimeError(
                        f"prometheus RSS {rss / 2**30:.1f} GiB over the {max_rss_gib} GiB bound"
                    )
                time.sleep(1.0)

        watch(started + warmup)
        cpu0 = (_cpu(pp), _cpu(lp), time.monotonic())
        groups: dict[str, float] = {}
        intervals: dict[str, float] = {}
        series: list[float] = []
        rates: list[float] = []
        scrape: list[float] = []
        end = time.monotonic() + measure
        while time.monotonic() < end:
            watch(min(end, time.monotonic() + INTERVAL))
            series.append(_scalar(url, "prometheus_tsdb_head_series"))
            rates.append(_scalar(url, "rate(prometheus_tsdb_head_samples_appended_total[1m])"))
            scrape.append(_scalar(url, 'max(scrape_duration_seconds{job="babysitter-node"})'))
            for item in _query(url, "prometheus_rule_group_last_duration_seconds")["data"]["result"]:
                name = item["metric"]["rule_group"].rsplit(";", 1)[-1]
                groups[name] = max(groups.get(name, 0.0), float(item["value"][1]))
            for item in _query(url, "prometheus_rule_group_interval_seconds")["data"]["result"]:
                intervals[item["metric"]["rule_group"].rsplit(";", 1)[-1]] = float(item["value"][1])
        cpu1 = (_cpu(pp), _cpu(lp), time.monotonic())
        held = f"{int((time.monotonic() - started) // 60)}m"
        scorecard = {}
        for name, expr in _scorecard_queries(held).items():
            t0 = time.perf_counter()
            body = _query(url, expr, stats=True)
            seconds = time.perf_counter() - t0
            samples = body.get("data", {}).get("stats", {}).get("samples", {}).get("totalQueryableSamples")
            scorecard[name] = {"seconds": seconds, "samples": samples}
        missed = _scalar(url, "sum(prometheus_rule_group_iterations_missed_total)")
        up = _scalar(url, 'sum(up{job="babysitter-node"})')
        head = series[-1]
        return {
            "hosts": hosts,
            "gpus": hosts * 8,
            "targets_up": up,
            "active_series": head,
            "samples_per_second": sum(rates) / len(rates),
            "prometheus_rss_bytes": peak_rss,
            "bytes_per_series": peak_rss / head if head else None,
            "prometheus_cpu_cores": (cpu1[0] - cpu0[0]) / (cpu1[2] - cpu0[2]),
            "loadgen_cpu_cores": (cpu1[1] - cpu0[1]) / (cpu1[2] - cpu0[2]),
            "max_scrape_seconds": max(scrape),
            "rule_groups": {
                name: {"seconds": seconds, "interval": intervals.get(name, INTERVAL)}
                for name, seconds in sorted(groups.items())
            },
            "rule_iterations_missed": missed,
            "scorecard_window": held,
            "scorecard": scorecard,
        }
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for log in logs:
            log.close()


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x, and the log-log slope (1 = linear growth)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-12)) for y in ys]
    mlx, mly = sum(lx) / n, sum(ly) / n
    slx = sum((x - mlx) ** 2 for x in lx)
    k = sum((x - mlx) * (y - mly) for x, y in zip(lx, ly, strict=True)) / slx if slx else 0.0
    return a, b, k


def _machine() -> str:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = psutil.virtual_memory().total / 2**30
    version = subprocess.run(
        [shutil.which("prometheus") or "prometheus", "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[0]
    return (
        f"{model}, {os.cpu_count()} logical CPUs (shared), {mem:.0f} GiB RAM, Python "
        f"{platform.python_version()}, {version}"
    )


def report(
    results: list[dict[str, Any]], load_before: tuple[float, ...], load_after: tuple[float, ...]
) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    hosts = [r["hosts"] for r in results]
    lines = [
        f"## {now}, {', '.join(str(h) for h in hosts)} simulated hosts",
        "",
        f"Machine: {_machine()}.",
        f"Load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; "
        f"after: {', '.join(f'{v:.2f}' for v in load_after)}.",
        f"Command: `python benchmarks/bench_fleet.py --hosts {' '.join(map(str, hosts))}` "
        f"(scrape and rule interval {INTERVAL:g} s).",
        "",
        "| measure | " + " | ".join(f"{h} hosts ({h * 8} GPUs)" for h in hosts) + " |",
        "|---|" + "---|" * len(hosts),
    ]

    def row(title: str, values: list[str]) -> None:
        lines.append(f"| {title} | " + " | ".join(values) + " |")

    row("targets up", [f"{r['targets_up']:.0f}" for r in results])
    row("active series", [f"{r['active_series']:,.0f}" for r in results])
    row("samples/s appended", [f"{r['samples_per_second']:,.0f}" for r in results])
    row("Prometheus peak RSS", [f"{r['prometheus_rss_bytes'] / 2**20:,.0f} MiB" for r in results])
    row("RSS per active series", [f"{r['bytes_per_series'] / 1024:.1f} KiB" for r in results])
    row("Prometheus CPU", [f"{r['prometheus_cpu_cores']:.2f} cores" for r in results])
    row("load generator CPU", [f"{r['loadgen_cpu_cores']:.2f} cores" for r in results])
    row("slowest scrape", [f"{r['max_scrape_seconds'] * 1000:.0f} ms" for r in results])
    for group in results[0]["rule_groups"]:
        row(
            f"rule group `{group}`",
            [
                f"{r['rule_groups'][group]['seconds'] * 1000:.1f} ms "
                f"({r['rule_groups'][group]['seconds'] / r['rule_groups'][group]['interval']:.1%})"
                for r in results
            ],
        )
    row("rule iterations missed", [f"{r['rule_iterations_missed']:.0f}" for r in results])
    for name in results[0]["scorecard"]:
        row(
            f"scorecard `{name}` over {results[0]['scorecard_window']}",
            [
                f"{r['scorecard'][name]['seconds'] * 1000:.0f} ms, "
                f"{r['scorecard'][name]['samples'] or 0:,} samples"
                for r in results
            ],
        )
    if len(results) >= 2:
        lines += [
            "",
            f"Fit over these sizes: y = a + b x hosts, and the log-log slope k (1 = linear); projection "
            f"to {PROJECT_HOSTS} hosts ({PROJECT_HOSTS * 8:,} GPUs).",
            "",
            "| measure | a | b per host | k | fit at 2,048 hosts | largest size x 2,048/largest |",
            "|---|---|---|---|---|---|",
        ]
        xs = [float(h) for h in hosts]
        measures: list[tuple[str, list[float], str]] = [
            ("active series", [r["active_series"] for r in results], "{:,.0f}"),
            ("samples/s", [r["samples_per_second"] for r in results], "{:,.0f}"),
            ("Prometheus RSS (MiB)", [r["prometheus_rss_bytes"] / 2**20 for r in results], "{:,.0f}"),
            ("Prometheus CPU (cores)", [r["prometheus_cpu_cores"] for r in results], "{:.2f}"),
        ]
        for group in results[0]["rule_groups"]:
            measures.append(
                (
                    f"`{group}` eval (ms)",
                    [r["rule_groups"][group]["seconds"] * 1000 for r in results],
                    "{:,.0f}",
                )
            )
        for title, ys, fmt in measures:
            a, b, k = fit(xs, ys)
            scaled = ys[-1] * PROJECT_HOSTS / xs[-1]
            lines.append(
                f"| {title} | {a:,.1f} | {b:,.3f} | {k:.2f} | {fmt.format(a + b * PROJECT_HOSTS)} "
                f"| {fmt.format(scaled)} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--warmup", type=float, default=240.0)
    parser.add_argument("--measure", type=float, default=120.0)
    parser.add_argument("--max-rss-gib", type=float, default=8.0)
    parser.add_argument("--max-load", type=float, default=None, help="refuse to start above this 1-min load")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/fleet.md")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    if args.max_load is not None and load_before[0] > args.max_load:
        print(f"load average {load_before[0]:.2f} is above {args.max_load}; not running", file=sys.stderr)
        return 3
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for hosts in args.hosts:
            print(f"{hosts} hosts ...", flush=True)
            result = run_size(hosts, args.warmup, args.measure, args.max_rss_gib, Path(tmp) / str(hosts))
            print(json.dumps(result, indent=1), flush=True)
            results.append(result)
    text = report(results, load_before, os.getloadavg())
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps({"load_before": load_before, "results": results}, indent=1) + "\n")
    with args.out.open("a", encoding="utf-8") as out:
        out.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
