"""Paging benchmark: fault-to-page latency with the production rules and the shipped Alertmanager config.

What runs, all real processes on loopback:

- Prometheus 2.x loading the committed ``alerts/babysitter-rules.yaml`` and ``alerts/babysitter-alerts.yaml``
  (the default profile, with their group intervals), scraping every node agent every 15 s with a 10 s
  timeout as ``exporters/prometheus-scrape.yml`` does, and no ``evaluation_interval`` (the shipped scrape
  config sets none, so groups without their own interval run at Prometheus's 1 m default);
- Alertmanager 0.25 with ``exporters/alertmanager.yml`` as shipped (routes, group_wait, group_interval,
  inhibitions); only the two webhook URLs point at receivers in this process;
- ``--hosts`` node agents (``babysitter node-agent --simulate 2``, production defaults otherwise:
  collector timeout 10 s, checkpoint sentinel every 30 s verifying the newest 3);
- one training process (``python -m babysitter.demo.trainer``, a tiny GPT on CPU with the tracker and
  its default watchdog) registered with host 0's agent.

Faults, after a warm-up, each timed from the line its own process logs when it happens:

- Xid 79 (then the GPU falls off the bus) on one GPU of every host, staggered so they land at
  different phases of the scrape and evaluation cycles (goal: page within 30 s; 60 s before issue 34);
- a lost GPU on host 0 (goal: under 5 min);
- a hang of the training loop (the process still answers scrapes, as in a stuck collective; goal:
  under max(2 min, 12 x the step time) since issue 34, max(5 min, 10 x) before);
- the newest checkpoint deleted from disk, after the hang (so no newer save replaces it; goal: under 5 min).

Latency is the receive time of the first notification on the pager webhook carrying the fault's alert
and labels, minus the fault's time. The run is bounded (``--timeout`` after the faults) and every
process it starts is stopped. Results are appended to ``--out`` (markdown).

Usage: python benchmarks/bench_paging.py [--hosts 3] [--warmup 60] [--timeout 420]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from babysitter.demo.pager import Page, PagerServer
from babysitter.demo.stack import Stack, write_json

REPO = Path(__file__).resolve().parents[1]
RULES = [REPO / "alerts/babysitter-rules.yaml", REPO / "alerts/babysitter-alerts.yaml"]
ALERTMANAGER = REPO / "exporters/alertmanager.yml"
SCRAPE = REPO / "exporters/prometheus-scrape.yml"
CLUSTER = "bench"
RUN = "bench"
#: Seconds between the faults of the hosts' Xid 79s: spreads them over the 15 s scrape/evaluation phase.
XID_STAGGER = 7.0
_LOGTIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def _scrape_timing() -> tuple[str, str]:
    """Interval and timeout of the shipped babysitter-node job (what the benchmark scrapes with)."""
    for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]:
        if job["job_name"] == "babysitter-node":
            return str(job["scrape_interval"]), str(job["scrape_timeout"])
    raise SystemExit(f"no babysitter-node job in {SCRAPE}")


def _alertmanager_config(pager: str, chat: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER.read_text())
    for receiver in config["receivers"]:
        name = receiver["name"]
        # Every pager route (pager, pager-training...) pages; the heartbeat's dead man's switch and the
        # remediator's webhook are not what this measures: they get no destination (a null receiver).
        url = pager if name.startswith("pager") else chat if name.startswith("chat") else None
        for key in [k for k in receiver if k.endswith("_configs")]:
            del receiver[key]
        if url is not None:
            receiver["webhook_configs"] = [{"url": url, "send_resolved": True}]
    return config


def _logged_at(path: Path, needle: str) -> float | None:
    """Unix time of the first log line containing ``needle`` (the children log local time, ms)."""
    if not path.exists():
        return None
    for line in path.read_text(errors="replace").splitlines():
        if needle in line:
            match = _LOGTIME.match(line)
            if match:
                stamp = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
                return stamp + int(match.group(2)) / 1000
    return None


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    data = urllib.parse.urlencode({"query": expr}).encode()
    with urllib.request.urlopen(f"{prom}/api/v1/query", data=data, timeout=10) as response:  # noqa: S310
        return list(json.load(response)["data"]["result"])


def _wait(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"bench_paging: {what} not seen within {timeout:g} s")


def _first_page(pages: list[Page], name: str, labels: dict[str, str]) -> Page | None:
    for page in pages:
        if (
            page.status == "firing"
            and page.name == name
            and all(page.labels.get(k) == v for k, v in labels.items())
        ):
            return page
    return None


def _machine() -> str:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    versions = []
    for binary in ("prometheus", "prometheus-alertmanager"):
        path = shutil.which(binary) or binary
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
        versions.append((out.stdout or out.stderr).splitlines()[0])
    return (
        f"{model}, {os.cpu_count()} logical CPUs (shared), Python {platform.python_version()}, "
        + ", ".join(versions)
    )


def run(hosts: int, warmup: float, timeout: float, workdir: Path) -> dict[str, Any]:
    interval, scrape_timeout = _scrape_timing()
    stack = Stack(workdir, grace=10)
    pager = PagerServer(lambda page: None).start()
    chat = PagerServer(lambda page: None).start()
    try:
        t0 = time.time()
        run_dir, registry = workdir / "run", workdir / "registry"
        run_dir.mkdir()
        registry.mkdir()
        # Faults: the trainer hangs at `hang_at` s after t0; the Xid 79s follow 10 s later, one host
        # every XID_STAGGER s; host 0 loses another GPU after them; the checkpoint goes after the hang.
        hang_at = warmup
        xid_at = [hang_at + 10 + XID_STAGGER * i for i in range(hosts)]
        lost_at = xid_at[-1] + XID_STAGGER
        addresses = []
        for host in range(hosts):
            events: list[dict[str, Any]] = [{"at": xid_at[host], "gpu": 1, "event": "xid79"}]
            if host == 0:
                events.append({"at": lost_at, "gpu": 0, "event": "lost"})
            # The simulator's clock starts when the agent does: shift by the time spent until now.
            shift = time.time() - t0
            for event in events:
                event["at"] = round(event["at"] - shift, 3)
            scenario = write_json(workdir / f"scenario{host}.json", {"events": events})
            reg = registry if host == 0 else workdir / f"registry{host}"
            reg.mkdir(exist_ok=True)
            argv = [sys.executable, "-m", "babysitter", "--log-level", "info", "node-agent"]
            argv += ["--listen-address", "127.0.0.1:0", "--port-file", str(workdir / f"agent{host}.addr")]
            argv += ["--simulate", "2", "--scenario", str(scenario), "--registry-dir", str(reg)]
            argv += ["--simulate-kernel-log", str(workdir / f"kern{host}.log")]
            argv += ["--storage-path", str(run_dir)]
            if host == 0:
                argv += ["--checkpoint-run-dir", str(run_dir)]
            stack.start(f"agent{host}", argv)
        for host in range(hosts):
            port_file = workdir / f"agent{host}.addr"
            _wait(f"agent {host} port file", lambda p=port_file: p.exists() and p.read_text().strip(), 60)
            addresses.append((workdir / f"agent{host}.addr").read_text().strip())
        stack.start(
            "trainer",
            [
                sys.executable, "-m", "babysitter.demo.trainer",
                "--run-dir", str(run_dir), "--registry-dir", str(registry),
                "--run", RUN, "--cluster", CLUSTER, "--t0", repr(t0),
                "--events", json.dumps([{"at": hang_at, "event": "hang", "seconds": timeout + 60}]),
                "--pace", "0.2", "--checkpoint-interval", "15",
            ],
        )  # fmt: skip
        am_config = write_json(workdir / "alertmanager.yml", _alertmanager_config(pager.url, chat.url))
        am_bin = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager") or "alertmanager"
        am_port = stack.start_server(
            "alertmanager",
            lambda port: [
                am_bin, f"--config.file={am_config}", f"--storage.path={workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn",
            ],
        )  # fmt: skip
        prom_config = write_json(
            workdir / "prometheus.yml",
            {
                # No evaluation_interval, as in exporters/prometheus-scrape.yml: groups without their
                # own interval run at Prometheus's default (1 m).
                "global": {"scrape_interval": interval, "scrape_timeout": scrape_timeout},
                "scrape_configs": [
                    {
                        "job_name": "babysitter-node",
                        "honor_labels": True,
                        "scrape_interval": interval,
                        "scrape_timeout": scrape_timeout,
                        "static_configs": [{"targets": addresses, "labels": {"cluster": CLUSTER}}],
                    }
                ],
                "rule_files": [str(p) for p in RULES],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            },
        )
        prom_bin = shutil.which("prometheus") or "prometheus"
        prom_port = stack.start_server(
            "prometheus",
            lambda port: [
                prom_bin, f"--config.file={prom_config}", f"--storage.tsdb.path={workdir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
            ],
        )  # fmt: skip
        prom = f"http://127.0.0.1:{prom_port}"
        _wait(
            "training steps in Prometheus", lambda: _query(prom, f'train_steps_total{{run="{RUN}"}} > 0'), 90
        )
        if time.time() - t0 > hang_at:
            raise SystemExit(f"bench_paging: warm-up too short ({warmup:g} s): raise --warmup")
        ckpt_dir = run_dir / "checkpoints"
        # The hang: wait for the trainer's log line, then delete its newest checkpoint.
        trainer_log = stack.log_path("trainer")
        _wait("the hang", lambda: _logged_at(trainer_log, "hanging for") is not None, hang_at + 60)
        hang = _logged_at(trainer_log, "hanging for")
        step_times = _query(prom, f'rate(train_step_duration_seconds_sum{{run="{RUN}"}}[1m]) / '
                                  f'rate(train_step_duration_seconds_count{{run="{RUN}"}}[1m])')  # fmt: skip
        step_seconds = float(step_times[0]["value"][1]) if step_times else float("nan")
        time.sleep(3)
        saved = sorted(ckpt_dir.glob("step-*.pt"))
        if not saved:
            raise SystemExit("bench_paging: the trainer saved no checkpoint before the hang")
        newest = saved[-1]
        newest.unlink()
        deleted = time.time()
        ckpt_step = str(int(newest.stem.split("-")[1]))

        faults: list[dict[str, Any]] = []
        for host in range(hosts):
            at = None
            instance = addresses[host]
            faults.append(
                {
                    "fault": f"Xid 79, host {host} GPU 1",
                    "alert": "GpuXidCritical",
                    "labels": {"instance": instance, "gpu": "1", "xid": "79"},
                    "log": (stack.log_path(f"agent{host}"), "GPU 1 xid79"),
                    "at": at,
                    "goal": 30.0,  # issue 34: a hard GPU fault pages within 30 s (issue 16: 60 s)
                }
            )
        faults.append(
            {
                "fault": "GPU 0 lost, host 0",
                "alert": "GpuDown",
                "labels": {"instance": addresses[0], "gpu": "0"},
                "log": (stack.log_path("agent0"), "GPU 0 lost"),
                "at": None,
                "goal": 300.0,
            }
        )
        faults.append(
            {
                "fault": "training loop hangs (process answers)",
                "alert": "TrainingStalled",
                "labels": {"run": RUN},
                "log": None,
                "at": hang,
                # issue 34: within 2 minutes for steps under 10 s (stall threshold max(60 s, 6 steps))
                "goal": max(120.0, 12 * step_seconds),
            }
        )
        faults.append(
            {
                "fault": f"newest checkpoint (step {ckpt_step}) deleted",
                "alert": "CheckpointMissing",
                "labels": {"run": RUN},  # one alert per run; its summary names the step
                "log": None,
                "at": deleted,
                "goal": 300.0,
            }
        )

        def done() -> bool:
            pages = pager.snapshot()
            return all(_first_page(pages, f["alert"], f["labels"]) is not None for f in faults)

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not done():
            time.sleep(1.0)
        pages = pager.snapshot()
        rows = []
        for fault in faults:
            if fault["log"] is not None:
                fault["at"] = _logged_at(*fault["log"])
            page = _first_page(pages, fault["alert"], fault["labels"])
            latency = page.received - fault["at"] if page is not None and fault["at"] is not None else None
            rows.append(
                {
                    "fault": fault["fault"],
                    "alert": fault["alert"],
                    "goal_s": round(fault["goal"], 1),
                    "latency_s": None if latency is None else round(latency, 1),
                    "met": latency is not None and latency < fault["goal"],
                }
            )
        return {
            "rows": rows,
            "step_seconds": step_seconds,
            "pager": sorted({(p.name, p.severity) for p in pages if p.status == "firing"}),
            "chat": sorted({(p.name, p.severity) for p in chat.snapshot() if p.status == "firing"}),
            "scrape": f"{interval} (timeout {scrape_timeout})",
            "hosts": hosts,
            "elapsed_s": round(time.time() - t0, 1),
        }
    finally:
        pager.close()
        chat.close()
        stack.close()


def report(result: dict[str, Any], machine: str, when: str) -> str:
    lines = [
        f"## {when}",
        "",
        f"Machine: {machine}. {result['hosts']} simulated hosts (2 GPUs each), one CPU training process "
        f"(mean step {result['step_seconds']:.2f} s before the hang), scrape every {result['scrape']}, "
        f"the committed production rules, exporters/alertmanager.yml as shipped. Run took "
        f"{result['elapsed_s']:.0f} s.",
        "",
        "| fault | alert | fault to page | goal | met |",
        "|---|---|---:|---:|---|",
    ]
    for row in result["rows"]:
        latency = "no page" if row["latency_s"] is None else f"{row['latency_s']:.1f} s"
        met = "yes" if row["met"] else "NO"
        lines.append(f"| {row['fault']} | {row['alert']} | {latency} | < {row['goal_s']:.0f} s | {met} |")
    lines += [
        "",
        "Reached the pager: " + ", ".join(f"{name} ({sev})" for name, sev in result["pager"]) + ".",
        "Reached chat: " + ", ".join(f"{name} ({sev})" for name, sev in result["chat"]) + ".",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3, help="simulated hosts, each with an Xid 79")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds of training before the faults")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds to wait for the pages")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/paging.md")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    for binary in ("prometheus",):
        if shutil.which(binary) is None:
            raise SystemExit(f"bench_paging: {binary} not installed")
    workdir = Path(tempfile.mkdtemp(prefix="bench-paging-"))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:
        result = run(args.hosts, args.warmup, args.timeout, workdir)
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    text = report(result, _machine(), when)
    print(text)
    with args.out.open("a") as out:
        out.write(text + "\n")
    return 0 if all(row["met"] for row in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
