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

With ``--engines prometheus victoriametrics`` (the default) VictoriaMetrics runs beside it at the same
time, on the same hosts: single-node VictoriaMetrics with the shipped flags
(``exporters/central/victoriametrics/victoria-metrics.default``) scraping the same targets every 15 s
(its own scraper, ``-promscrape.config``: the one flag the benchmark adds), and vmalert with the shipped
flags (``vmalert.default``; evaluation interval 15 s like Prometheus's here) on the same rule files. Its
measures come from both processes' ``/metrics`` and the OS: series seen this hour
(``vm_cache_entries{type="storage/hour_metric_ids"}``), rows inserted per second, the peak RSS of
VictoriaMetrics and of vmalert, their CPU, each rule group's slowest evaluation
(``vmalert_iteration_duration_seconds{quantile="1"}``, over the summary's sliding window, which reaches
back into the warm-up) and mean evaluation over the measurement (its ``_sum``/``_count``; Prometheus's is
the mean of its last durations sampled every 15 s), missed iterations, and the scorecard
queries' times (``nocache=1``, as vmalert asks). The report puts them side by side as ratios.

Every run is bounded in time (``--warmup`` + ``--measure``) and memory (a server is stopped when
its RSS passes ``--max-rss-gib``), and every process it starts is stopped. Results go to
``--out`` (markdown, appended) and ``--json``; the fit of each measure against the host count and
its projection to 2,048 hosts (16,384 GPUs) are computed over the sizes of one invocation.

Usage: python benchmarks/bench_fleet.py --hosts 64 128 256 [--warmup 240] [--measure 120]
       [--engines prometheus victoriametrics]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
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
sys.path.insert(0, str(REPO / "tests"))  # vmkit: VictoriaMetrics and vmalert with the shipped flags
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


def _metrics(url: str) -> dict[str, float]:
    """A process's own ``/metrics`` as ``{'name{labels}': value}`` (the labels as exposed)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:  # noqa: S310 - loopback
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key.replace(" ", "")] = float(value)
            except ValueError:
                continue
    return out


def _summed(metrics: dict[str, float], prefix: str) -> float:
    return sum(value for key, value in metrics.items() if key.startswith(prefix))


def _mean_iteration(before: dict[str, float], after: dict[str, float], group: str) -> float:
    """vmalert's mean evaluation time of ``group`` between two reads of its ``/metrics``."""

    def total(metrics: dict[str, float], suffix: str) -> float:
        return sum(
            v
            for k, v in metrics.items()
            if k.startswith(f'vmalert_iteration_duration_seconds_{suffix}{{group="{group}"')
        )

    count = total(after, "count") - total(before, "count")
    return (total(after, "sum") - total(before, "sum")) / count if count else float("nan")


class _VictoriaMetrics:
    """VictoriaMetrics scraping the fleet and vmalert on the rules, with the shipped flags."""

    def __init__(self, workdir: Path, targets: Path) -> None:
        from vmkit import VictoriaMetricsServer, VmalertServer

        scrape = workdir / "vm-scrape.yml"
        job = {
            "job_name": "babysitter-node",
            "honor_labels": True,
            "scrape_interval": f"{INTERVAL:g}s",
            "scrape_timeout": "12s",
            "file_sd_configs": [{"files": [str(targets)]}],
        }
        scrape.write_text(json.dumps({"scrape_configs": [job]}))
        (workdir / "vm").mkdir()
        (workdir / "vmalert").mkdir()
        # Production VictoriaMetrics receives remote write; here it scrapes like the Prometheus beside it.
        self.vm = VictoriaMetricsServer(workdir / "vm", extra=[f"-promscrape.config={scrape}"])
        self.vmalert_dir = workdir / "vmalert"
        self.vmalert: Any = None
        self._vmalert_cls = VmalertServer

    def start(self) -> None:
        self.vm.start()
        # The benchmark's Prometheus evaluates every 15 s; so does vmalert here (shipped: 30 s).
        self.vmalert = self._vmalert_cls(
            self.vmalert_dir,
            self.vm,
            RULES,
            "127.0.0.1:9",
            override={"-evaluationInterval": f"{INTERVAL:g}s"},
        )
        self.vmalert.start()

    def stop(self) -> None:
        if self.vmalert is not None:
            self.vmalert.stop()
        self.vm.stop()


def run_size(
    hosts: int, warmup: float, measure: float, max_rss_gib: float, workdir: Path, *, engines: list[str]
) -> dict[str, Any]:
    """One fleet size, start to stop; the measured values."""
    workdir.mkdir(parents=True, exist_ok=True)
    targets = workdir / "targets.json"
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    vm: _VictoriaMetrics | None = None
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
        if "victoriametrics" in engines:
            vm = _VictoriaMetrics(workdir, targets)
            vm.start()
        pp, lp = psutil.Process(prom.pid), psutil.Process(loadgen.pid)
        vp = [psutil.Process(vm.vm.pid), psutil.Process(vm.vmalert.pid)] if vm is not None else []
        started = time.monotonic()
        peak_rss = 0
        vm_peak = [0, 0]

        def watch(until: float) -> None:
            nonlocal peak_rss
            while time.monotonic() < until:
                if prom.poll() is not None:
                    raise RuntimeError(
                        f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}"
                    )
                rss = pp.memory_info().rss
                peak_rss = max(peak_rss, rss)
                for i, proc in enumerate(vp):
                    vm_peak[i] = max(vm_peak[i], proc.memory_info().rss)
                if max(rss, *vm_peak) > max_rss_gib * 2**30:
                    raise RuntimeError(f"a server's RSS passed the {max_rss_gib} GiB bound")
                time.sleep(1.0)

        watch(started + warmup)
        cpu0 = (_cpu(pp), _cpu(lp), time.monotonic(), *(_cpu(p) for p in vp))
        vm0 = (_metrics(vm.vm.url), _metrics(vm.vmalert.url)) if vm is not None else None
        groups: dict[str, float] = {}
        group_samples: dict[str, list[float]] = {}
        intervals: dict[str, float] = {}
        vm_groups: dict[str, float] = {}
        series: list[float] = []
        vm_series: list[float] = []
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
                group_samples.setdefault(name, []).append(float(item["value"][1]))
            for item in _query(url, "prometheus_rule_group_interval_seconds")["data"]["result"]:
                intervals[item["metric"]["rule_group"].rsplit(";", 1)[-1]] = float(item["value"][1])
            if vm is not None:
                vm_series.append(
                    _metrics(vm.vm.url).get('vm_cache_entries{type="storage/hour_metric_ids"}', 0.0)
                )
                for key, value in _metrics(vm.vmalert.url).items():
                    match = re.match(
                        r'vmalert_iteration_duration_seconds\{group="([^"]+)".*quantile="1"\}', key
                    )
                    if match:
                        vm_groups[match.group(1)] = max(vm_groups.get(match.group(1), 0.0), value)
        cpu1 = (_cpu(pp), _cpu(lp), time.monotonic(), *(_cpu(p) for p in vp))
        seconds = cpu1[2] - cpu0[2]
        held = f"{int((time.monotonic() - started) // 60)}m"
        scorecard = {}
        vm_scorecard = {}
        for name, expr in _scorecard_queries(held).items():
            t0 = time.perf_counter()
            body = _query(url, expr, stats=True)
            took = time.perf_counter() - t0
            samples = body.get("data", {}).get("stats", {}).get("samples", {}).get("totalQueryableSamples")
            scorecard[name] = {"seconds": took, "samples": samples}
            if vm is not None:
                t0 = time.perf_counter()
                vm.vm.query(expr)
                vm_scorecard[name] = {"seconds": time.perf_counter() - t0}
        missed = _scalar(url, "sum(prometheus_rule_group_iterations_missed_total)")
        up = _scalar(url, 'sum(up{job="babysitter-node"})')
        # The largest metric (series per name): VictoriaMetrics refuses a query over more than
        # -search.maxUniqueTimeseries (300,000 on 1.79.5) series.
        widest = _query(url, 'topk(1, count by (__name__) ({job="babysitter-node"}))')["data"]["result"]
        head = series[-1]
        result: dict[str, Any] = {
            "hosts": hosts,
            "gpus": hosts * 8,
            "targets_up": up,
            "active_series": head,
            "samples_per_second": sum(rates) / len(rates),
            "prometheus_rss_bytes": peak_rss,
            "bytes_per_series": peak_rss / head if head else None,
            "prometheus_cpu_cores": (cpu1[0] - cpu0[0]) / seconds,
            "loadgen_cpu_cores": (cpu1[1] - cpu0[1]) / seconds,
            "max_scrape_seconds": max(scrape),
            "rule_groups": {
                name: {
                    "seconds": took,
                    "mean_seconds": sum(group_samples[name]) / len(group_samples[name]),
                    "interval": intervals.get(name, INTERVAL),
                }
                for name, took in sorted(groups.items())
            },
            "rule_iterations_missed": missed,
            "scorecard_window": held,
            "scorecard": scorecard,
            "widest_metric": {
                "name": widest[0]["metric"].get("__name__", "") if widest else "",
                "series": float(widest[0]["value"][1]) if widest else 0.0,
            },
        }
        if vm is not None and vm0 is not None:
            vm1 = (_metrics(vm.vm.url), _metrics(vm.vmalert.url))
            rows = _summed(vm1[0], "vm_rows_inserted_total") - _summed(vm0[0], "vm_rows_inserted_total")
            vm_head = vm_series[-1]
            result["victoriametrics"] = {
                "active_series": vm_head,
                "rows_per_second": rows / seconds,
                "rss_bytes": vm_peak[0],
                "vmalert_rss_bytes": vm_peak[1],
                "bytes_per_series": vm_peak[0] / vm_head if vm_head else None,
                "cpu_cores": (cpu1[3] - cpu0[3]) / seconds,
                "vmalert_cpu_cores": (cpu1[4] - cpu0[4]) / seconds,
                "rule_groups": {
                    name: {
                        "seconds": took,
                        "mean_seconds": _mean_iteration(vm0[1], vm1[1], name),
                        "interval": intervals.get(name, INTERVAL),
                    }
                    for name, took in sorted(vm_groups.items())
                },
                "rule_iterations_missed": _summed(vm1[1], "vmalert_iteration_missed_total"),
                "scorecard": vm_scorecard,
            }
        return result
    finally:
        if vm is not None:
            vm.stop()
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


_FIT_HEADER = (
    "| measure | a | b per host | k | fit at 2,048 hosts | largest size x 2,048/largest |",
    "|---|---|---|---|---|---|",
)


def _fit_rows(xs: list[float], measures: list[tuple[str, list[float], str]]) -> list[str]:
    """One row per measure: the linear fit, its log-log slope, and both projections to 2,048 hosts."""
    rows = []
    for title, ys, fmt in measures:
        a, b, k = fit(xs, ys)
        scaled = ys[-1] * PROJECT_HOSTS / xs[-1]
        rows.append(
            f"| {title} | {a:,.1f} | {b:,.3f} | {k:.2f} | {fmt.format(a + b * PROJECT_HOSTS)} "
            f"| {fmt.format(scaled)} |"
        )
    return rows


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
    vm = ""
    if shutil.which("dpkg-query"):
        done = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"],
            capture_output=True,
            text=True,
            check=False,
        )
        vm = f", victoria-metrics package {done.stdout.strip()}" if done.returncode == 0 else ""
    return (
        f"{model}, {os.cpu_count()} logical CPUs (shared), {mem:.0f} GiB RAM, Python "
        f"{platform.python_version()}, {version}{vm}"
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
        f"Command: `nice -n 10 python benchmarks/bench_fleet.py --hosts {' '.join(map(str, hosts))}` "
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
            *_FIT_HEADER,
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
        lines += _fit_rows(xs, measures)
    if all("victoriametrics" in r for r in results):
        lines += _victoriametrics_report(results)
    return "\n".join(lines) + "\n"


def _victoriametrics_report(results: list[dict[str, Any]]) -> list[str]:
    """VictoriaMetrics + vmalert beside Prometheus: their own table, the ratios, the projection."""
    hosts = [r["hosts"] for r in results]
    vms = [r["victoriametrics"] for r in results]
    lines = [
        "",
        "VictoriaMetrics (shipped flags, scraping the same hosts at the same time) and vmalert (shipped "
        "flags, the same rule files, every 15 s):",
        "",
        "| measure | " + " | ".join(f"{h} hosts" for h in hosts) + " |",
        "|---|" + "---|" * len(hosts),
    ]

    def row(title: str, values: list[str]) -> None:
        lines.append(f"| {title} | " + " | ".join(values) + " |")

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "-"

    row("series this hour (vm_cache_entries hour_metric_ids)", [f"{v['active_series']:,.0f}" for v in vms])
    row("rows inserted/s (scrapes + vmalert's results)", [f"{v['rows_per_second']:,.0f}" for v in vms])
    row("VictoriaMetrics peak RSS", [f"{v['rss_bytes'] / 2**20:,.0f} MiB" for v in vms])
    row("vmalert peak RSS", [f"{v['vmalert_rss_bytes'] / 2**20:,.0f} MiB" for v in vms])
    row("VictoriaMetrics RSS per series", [f"{v['bytes_per_series'] / 1024:.2f} KiB" for v in vms])
    row("VictoriaMetrics CPU", [f"{v['cpu_cores']:.2f} cores" for v in vms])
    row("vmalert CPU", [f"{v['vmalert_cpu_cores']:.2f} cores" for v in vms])
    for group in vms[0]["rule_groups"]:
        row(
            f"rule group `{group}` (slowest; mean)",
            [
                f"{v['rule_groups'][group]['seconds'] * 1000:.1f} ms; "
                f"{v['rule_groups'][group]['mean_seconds'] * 1000:.1f} ms"
                for v in vms
            ],
        )
    row("rule iterations missed", [f"{v['rule_iterations_missed']:.0f}" for v in vms])
    for name in vms[0]["scorecard"]:
        row(f"scorecard `{name}`", [f"{v['scorecard'][name]['seconds'] * 1000:.0f} ms" for v in vms])
    lines += [
        "",
        "VictoriaMetrics over Prometheus (below 1: VictoriaMetrics uses less), same hosts, same moment:",
        "",
        "| ratio | " + " | ".join(f"{h} hosts" for h in hosts) + " |",
        "|---|" + "---|" * len(hosts),
    ]
    row(
        "memory per active series (VM + vmalert RSS / Prometheus RSS, per series)",
        [
            ratio(
                (v["rss_bytes"] + v["vmalert_rss_bytes"]) / v["active_series"],
                r["prometheus_rss_bytes"] / r["active_series"],
            )
            for r, v in zip(results, vms, strict=True)
        ],
    )
    row(
        "CPU (VM + vmalert / Prometheus)",
        [
            ratio(v["cpu_cores"] + v["vmalert_cpu_cores"], r["prometheus_cpu_cores"])
            for r, v in zip(results, vms, strict=True)
        ],
    )
    for group in vms[0]["rule_groups"]:
        row(
            f"`{group}` mean evaluation",
            [
                ratio(
                    v["rule_groups"][group]["mean_seconds"],
                    r["rule_groups"].get(group, {}).get("mean_seconds"),
                )
                for r, v in zip(results, vms, strict=True)
            ],
        )
    for name in vms[0]["scorecard"]:
        row(
            f"scorecard `{name}` query",
            [
                ratio(v["scorecard"][name]["seconds"], r["scorecard"][name]["seconds"])
                for r, v in zip(results, vms, strict=True)
            ],
        )
    widest = results[-1]["widest_metric"]
    lines += [
        "",
        f"Widest metric at {hosts[-1]} hosts: `{widest['name']}`, {widest['series']:,.0f} series "
        f"({widest['series'] * PROJECT_HOSTS / hosts[-1]:,.0f} at {PROJECT_HOSTS} hosts; VictoriaMetrics "
        "refuses a query over more than -search.maxUniqueTimeseries, 300,000 on 1.79.5).",
    ]
    if len(results) >= 2:
        lines += [
            "",
            f"VictoriaMetrics's fit and projection to {PROJECT_HOSTS} hosts ({PROJECT_HOSTS * 8:,} GPUs), "
            "as above:",
            "",
            *_FIT_HEADER,
        ]
        xs = [float(h) for h in hosts]
        measures: list[tuple[str, list[float], str]] = [
            ("series", [v["active_series"] for v in vms], "{:,.0f}"),
            ("VictoriaMetrics RSS (MiB)", [v["rss_bytes"] / 2**20 for v in vms], "{:,.0f}"),
            ("vmalert RSS (MiB)", [v["vmalert_rss_bytes"] / 2**20 for v in vms], "{:,.0f}"),
            (
                "VictoriaMetrics + vmalert CPU (cores)",
                [v["cpu_cores"] + v["vmalert_cpu_cores"] for v in vms],
                "{:.2f}",
            ),
        ]
        for group in vms[0]["rule_groups"]:
            measures.append(
                (
                    f"`{group}` mean eval (ms)",
                    [v["rule_groups"][group]["mean_seconds"] * 1000 for v in vms],
                    "{:,.0f}",
                )
            )
        lines += _fit_rows(xs, measures)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--warmup", type=float, default=240.0)
    parser.add_argument("--measure", type=float, default=120.0)
    parser.add_argument("--max-rss-gib", type=float, default=8.0)
    parser.add_argument("--max-load", type=float, default=None, help="refuse to start above this 1-min load")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/fleet.md")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=("prometheus", "victoriametrics"),
        default=["prometheus", "victoriametrics"],
        help="Prometheus always runs; victoriametrics adds VictoriaMetrics and vmalert beside it",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    if args.max_load is not None and load_before[0] > args.max_load:
        print(f"load average {load_before[0]:.2f} is above {args.max_load}; not running", file=sys.stderr)
        return 3
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for hosts in args.hosts:
            print(f"{hosts} hosts ...", flush=True)
            result = run_size(
                hosts,
                args.warmup,
                args.measure,
                args.max_rss_gib,
                Path(tmp) / str(hosts),
                engines=args.engines,
            )
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
