"""What each rule costs, in samples: every rule of two rule sets evaluated over the same fleet's data.

Rule evaluation times on a shared 2-core machine swing several times over from one minute to the
next (``benchmarks/results/fleet.md``), too much to compare two versions of the rules by. This counts
what Prometheus itself counts as a query's work instead: the samples it loads
(``stats.samples.totalQueryableSamples`` of ``/api/v1/query?stats=all``) and the most it holds at once
(``peakSamples``), which do not depend on the machine's load.

The load generator (``benchmarks/fleet_loadgen.py``: this checkout's exporters replayed for ``--hosts``
hosts of 8 GPUs and 8 ranks, one job spanning the fleet) is scraped every 15 s by a Prometheus that
evaluates ``--rules`` (this checkout's, so their records exist); after ``--warmup`` every recording
and alert rule expression of ``--rules`` and of ``--baseline`` is evaluated as an instant query at one
timestamp, and the samples are summed per rule group (group names differ between versions: a group
missing on one side is shown as 0). The median of ``--repeat`` evaluation times is reported beside
them, as an indication only (the two sets evaluated in turns, so that the machine's load weighs on
both alike).

Usage: python benchmarks/bench_rule_samples.py --hosts 256 --baseline OLD/alerts [--rules alerts]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fleet import INTERVAL, _free_port  # noqa: E402

FILES = ("babysitter-rules.yaml", "babysitter-alerts.yaml")


def _query(url: str, expr: str, *, at: float, stats: bool = False) -> dict[str, Any]:
    params = {"query": expr, "time": repr(at), **({"stats": "all"} if stats else {})}
    data = urllib.parse.urlencode(params).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=data, timeout=300) as response:  # noqa: S310
        body: dict[str, Any] = json.loads(response.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body


def _rules(directory: Path) -> list[tuple[str, str, str]]:
    """``(group, record or alert name, expr)`` of every rule in the directory's two rule files."""
    out = []
    for name in FILES:
        for group in yaml.safe_load((directory / name).read_text())["groups"]:
            for rule in group["rules"]:
                out.append((group["name"], rule.get("record") or rule["alert"], rule["expr"]))
    return out


def _cost(url: str, expr: str, at: float) -> tuple[int, int, float]:
    """Samples loaded, peak samples and evaluation seconds of one instant query at ``at``."""
    stats = _query(url, expr, stats=True, at=at)["data"]["stats"]
    samples = stats["samples"]
    return (
        int(samples["totalQueryableSamples"]),
        int(samples["peakSamples"]),
        float(stats["timings"]["evalTotalTime"]),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=256)
    parser.add_argument("--warmup", type=float, default=300.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rules", type=Path, default=REPO / "alerts", help="directory of this checkout's")
    parser.add_argument("--baseline", type=Path, required=True, help="directory of the rules compared")
    args = parser.parse_args()
    sets = {"baseline": _rules(args.baseline), "this": _rules(args.rules)}
    with tempfile.TemporaryDirectory(prefix="bench-rule-samples-") as tmp:
        work = Path(tmp)
        targets = work / "targets.json"
        procs: list[subprocess.Popen[bytes]] = []
        try:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(REPO / "benchmarks/fleet_loadgen.py"),
                        *("--hosts", str(args.hosts), "--targets-file", str(targets)),
                        *("--workdir", str(work / "capture")),
                    ],
                    stdout=(work / "loadgen.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
            deadline = time.monotonic() + 180
            while not targets.exists():
                if procs[0].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((work / "loadgen.log").read_text()[-2000:])
                time.sleep(0.5)
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            config = {
                "global": {"scrape_interval": f"{INTERVAL:g}s", "evaluation_interval": f"{INTERVAL:g}s"},
                "rule_files": [str(args.rules / name) for name in FILES],
                "scrape_configs": [
                    {
                        "job_name": "babysitter-node",
                        "scrape_timeout": "12s",
                        "file_sd_configs": [{"files": [str(targets)]}],
                    },
                    {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
                ],
            }
            (work / "prometheus.yml").write_text(json.dumps(config))
            procs.append(
                subprocess.Popen(
                    [
                        shutil.which("prometheus") or "/usr/bin/prometheus",
                        f"--config.file={work / 'prometheus.yml'}",
                        f"--storage.tsdb.path={work / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=(work / "prometheus.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
            time.sleep(args.warmup)
            at = time.time()
            series = _query(url, "prometheus_tsdb_head_series", at=at)
            # The two sets in turns (baseline first, then this first, ...), so that a change in the
            # machine's load weighs on both alike; each rule's time is its median over the turns.
            costs: dict[tuple[str, int], tuple[int, int, list[float]]] = {}
            for turn in range(args.repeat):
                for side in ("baseline", "this") if turn % 2 == 0 else ("this", "baseline"):
                    for i, (_group, _name, expr) in enumerate(sets[side]):
                        samples, peak, seconds = _cost(url, expr, at)
                        costs.setdefault((side, i), (samples, peak, []))[2].append(seconds)
            groups: dict[str, dict[str, list[float]]] = {}
            for (side, i), (samples, peak, times) in costs.items():
                row = groups.setdefault(sets[side][i][0], {}).setdefault(side, [0, 0, 0.0, 0])
                row[0] += samples
                row[1] = max(row[1], peak)
                row[2] += statistics.median(times)
                row[3] += 1
        finally:
            for proc in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print(_report(args, groups, series))
    return 0


def _report(args: Any, groups: dict[str, dict[str, list[float]]], series: dict[str, Any]) -> str:
    active = series["data"]["result"][0]["value"][1] if series["data"]["result"] else "?"
    lines = [
        f"{args.hosts} hosts ({args.hosts * 8} ranks), {active} active series, after {args.warmup:g} s; "
        f"baseline {args.baseline}, this {args.rules}",
        "",
        "| rule group | rules (baseline / this) | samples loaded (baseline / this) | peak samples | "
        f"eval time, median of {args.repeat} (baseline / this) |",
        "|---|---|---|---|---|",
    ]
    total = {"baseline": [0, 0, 0.0, 0], "this": [0, 0, 0.0, 0]}
    for group in sorted(groups):
        row = {side: groups[group].get(side, [0, 0, 0.0, 0]) for side in ("baseline", "this")}
        for side, sums in total.items():
            sums[0] += row[side][0]
            sums[2] += row[side][2]
            sums[3] += row[side][3]
        b, t = row["baseline"], row["this"]
        lines.append(
            f"| `{group}` | {b[3]:g} / {t[3]:g} | {b[0]:,.0f} / {t[0]:,.0f} | {b[1]:,.0f} / {t[1]:,.0f} | "
            f"{b[2] * 1000:.1f} / {t[2] * 1000:.1f} ms |"
        )
    b, t = total["baseline"], total["this"]
    lines.append(
        f"| all | {b[3]:g} / {t[3]:g} | {b[0]:,.0f} / {t[0]:,.0f} | "
        f"| {b[2] * 1000:.1f} / {t[2] * 1000:.1f} ms |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
