"""Naming the bad node: what reading torch's flight recorder costs, and how fast a stopped rank is named.

``loop``: four gloo ranks under torchrun in lockstep (a matmul per step, then an all_reduce of 1 MiB of
gradients, as DDP's bucket), ``watch(straggler_every=10)``, run alternately with the recorder off
(``TORCH_FR_BUFFER_SIZE=0``, ``watch(flight_recorder=False)``: the straggler exchange as before) and
on (torch records every collective, babysitter reads the counters every second and dumps the recorder
for the straggler rounds within its 1% budget). Reported: the median and mean step time of each run,
and the ratio on/off of their medians; the reader's own accounting (dumps, seconds per dump, the
fraction of wall time it measured).

``page``: the end-to-end stack of tests/test_collectives_e2e.py (four lockstep ranks, the node agent,
Prometheus with the generated rules, the example Alertmanager config): after a warm-up, rank 2 is
stopped (SIGSTOP) and the time until (a) the culprit rule names it in Prometheus and (b) the
TrainingStalled page naming it reaches the pager webhook is measured. ``--profile fast`` (1 s
scrapes, 15 s stall threshold) repeats it; ``--profile default`` runs the production windows once
(15 s scrapes, 4 min stall threshold).

    .venv/bin/python benchmarks/bench_collectives.py loop [--runs 3] [--steps 300]
    .venv/bin/python benchmarks/bench_collectives.py page [--profile fast] [--repeat 3]

Results are appended to ``--out`` (default benchmarks/results/collectives.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "collectives.md"
sys.path.insert(0, str(REPO / "tests"))


def _machine() -> str:
    return (
        f"{cpu_model()}, {os.cpu_count()} logical CPUs (shared), {platform.system()} {platform.release()}, "
        f"Python {sys.version.split()[0]}"
    )


# ------------------------------------------------------------------------------------------ loop


def worker(out: Path, steps: int, recorder: bool) -> None:
    """One rank of the ``loop`` benchmark (started by torchrun)."""
    import torch

    import babysitter

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    tracker = babysitter.watch(
        run="bench",
        port=-1,
        hang_timeout=None,
        straggler_every=10,
        flight_recorder=recorder,
        flush_interval=1.0,
    )
    import torch.distributed as dist

    dist.init_process_group("gloo")
    a, b = torch.randn(192, 192), torch.randn(192, 192)
    grads = torch.randn(256 * 1024)
    times: list[float] = []
    last = time.perf_counter()
    for step in range(steps + 30):
        for _ in range(4):
            a = torch.tanh(a @ b)
        dist.all_reduce(grads)
        grads /= dist.get_world_size()
        tracker.step()
        now = time.perf_counter()
        if step >= 30:
            times.append(now - last)
        last = now
    monitor = getattr(tracker.flight_recorder, "__self__", None)
    record = {
        "rank": rank,
        "median_step": statistics.median(times),
        "mean_step": statistics.fmean(times),
        "state": tracker.info()["flight_recorder"],
    }
    if monitor is not None:
        record.update(reads=monitor.reads, dumps=monitor.captures, cost_fraction=monitor.cost_fraction)
    tracker.close()
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


def loop(runs: int, steps: int) -> str:
    results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(runs):
        for mode in ("off", "on"):
            with tempfile.TemporaryDirectory() as tmp:
                env = {k: v for k, v in os.environ.items() if k not in ("TORCH_FR_BUFFER_SIZE",)}
                if mode == "off":
                    env["TORCH_FR_BUFFER_SIZE"] = "0"
                argv = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node",
                    "4",
                ]
                argv += [__file__, "worker", tmp, str(steps), "1" if mode == "on" else "0"]
                done = subprocess.run(argv, capture_output=True, timeout=900, env=env, check=False)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr.decode()[-3000:])
                ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(4)]
            results[mode].append(
                {
                    "median": statistics.median(r["median_step"] for r in ranks),
                    "mean": statistics.median(r["mean_step"] for r in ranks),
                    "state": sorted({r["state"] for r in ranks}),
                    "dumps": [r.get("dumps") for r in ranks],
                    "cost": [r.get("cost_fraction") for r in ranks],
                }
            )
            print(mode, results[mode][-1], flush=True)
    off = statistics.median(r["median"] for r in results["off"])
    on = statistics.median(r["median"] for r in results["on"])
    off_mean = statistics.median(r["mean"] for r in results["off"])
    on_mean = statistics.median(r["mean"] for r in results["on"])
    lines = [
        f"## Step time, recorder off and on ({_now()})",
        "",
        f"- Machine: {_machine()}",
        f"- Command: `.venv/bin/python benchmarks/bench_collectives.py loop --runs {runs} --steps {steps}`",
        "- Four gloo ranks, lockstep: 4 matmuls of 192x192 and an all_reduce of 1 MiB per step, "
        "`watch(straggler_every=10)`; the runs alternate off, on.",
        "",
        "| run | recorder | median step (ms) | mean step (ms) | train_info flight_recorder "
        "| full dumps per rank | reader's measured cost fraction |",
        "|---|---|---:|---:|---|---|---|",
    ]
    for i in range(runs):
        for mode in ("off", "on"):
            r = results[mode][i]
            cost = ", ".join(f"{c:.4f}" for c in r["cost"] if c is not None) or "-"
            dumps = ", ".join(str(d) for d in r["dumps"] if d is not None) or "-"
            state = ", ".join(r["state"])
            times = f"{r['median'] * 1e3:.2f} | {r['mean'] * 1e3:.2f}"
            lines.append(f"| {i + 1} | {mode} | {times} | {state} | {dumps} | {cost} |")
    lines += [
        "",
        f"Ratio on/off of the median step time: **{on / off:.3f}** (mean: {on_mean / off_mean:.3f}).",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ page


def page(profile: str, repeat: int) -> str:
    from babysitter.catalog import runtime as R
    from babysitter.generate import GenerateConfig, fast
    from babysitter.generate.rules import Records
    from babysitter.generate.writer import render, write
    from gen_helpers import AlertmanagerServer, WebhookReceiver, alertmanager_config
    from node_helpers import read_port_file
    from promkit import PrometheusServer

    cfg = fast() if profile == "fast" else GenerateConfig()
    scrape = "1s" if profile == "fast" else "15s"
    culprit_rule = Records(cfg).collectives.culprit
    script = REPO / "tests" / "scripts" / "collectives_train.py"
    rows: list[tuple[float, float, str]] = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            reg, run_dir, out = tmp / "reg", tmp / "run", tmp / "out"
            for folder in (reg, run_dir, out):
                folder.mkdir()
            write(tmp / "gen", render(cfg))
            rules = [tmp / "gen/alerts/babysitter-rules.yaml", tmp / "gen/alerts/babysitter-alerts.yaml"]
            logs = [(tmp / "agent.log").open("wb"), (tmp / "train.log").open("wb")]
            agent_argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "4", "--port", "0"]
            agent_argv += ["--port-file", str(tmp / "addr"), "--registry-dir", str(reg), "--no-collector.xid"]
            if profile == "fast":  # a stopped rank's fetch must give up well inside a 1 s scrape
                agent_argv += ["--collector-timeout", "5", "--trainer-timeout", "0.5"]
            agent = subprocess.Popen(agent_argv, stdout=logs[0], stderr=subprocess.STDOUT)
            torchrun = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "4",
            ]
            train = subprocess.Popen(
                [*torchrun, str(script), str(reg), str(run_dir), str(out), "2", "1", "0"],
                stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                with WebhookReceiver() as hook, AlertmanagerServer(tmp, alertmanager_config(hook.url)) as am:
                    address = read_port_file(tmp / "addr", timeout=60)
                    job = {
                        "job_name": "babysitter-node",
                        "honor_labels": True,
                        "scrape_interval": scrape,
                        "scrape_timeout": "1s" if profile == "fast" else "12s",
                        "static_configs": [{"targets": [address], "labels": {"cluster": "c1"}}],
                    }
                    with PrometheusServer(
                        tmp, rule_files=rules, alertmanager=am.address, extra_scrape_configs=[job],
                        scrape_interval=scrape, evaluation_interval=scrape,
                    ) as prom:  # fmt: skip
                        prom.wait_for(f'{R.STRAGGLER_SCORE.name}{{run="lockstep"}}', timeout=180)
                        time.sleep(60 if profile == "default" else 10)
                        pid = json.loads((out / "rank2.json").read_text())["pid"]
                        os.kill(pid, signal.SIGSTOP)
                        stopped = time.monotonic()
                        named = page_at = None
                        deadline = stopped + (900 if profile == "default" else 120)
                        while time.monotonic() < deadline and page_at is None:
                            if named is None and prom.query(f'{culprit_rule}{{run="lockstep", rank="2"}}'):
                                named = time.monotonic() - stopped
                            for alert in hook.pages():
                                if alert["labels"]["alertname"] == "TrainingStalled" and alert[
                                    "annotations"
                                ].get("culprit_hosts"):
                                    page_at = time.monotonic() - stopped
                                    text = alert["annotations"]["description"].split(" Culprit: ")[-1]
                            time.sleep(0.25)
                        if named is None or page_at is None:
                            raise RuntimeError(f"not named within the deadline: rule {named}, page {page_at}")
                        rows.append((named, page_at, text))
                        print(
                            f"named by the rule after {named:.1f} s, paged after {page_at:.1f} s: {text}",
                            flush=True,
                        )
                        os.kill(pid, signal.SIGCONT)
            finally:
                for proc, group in ((train, True), (agent, False)):
                    try:
                        os.killpg(proc.pid, signal.SIGTERM) if group else proc.terminate()
                        proc.wait(timeout=20)
                    except (OSError, subprocess.TimeoutExpired):
                        proc.kill()
                for handle in logs:
                    handle.close()
    lines = [
        f"## Stopped rank to the page naming it, profile {profile} ({_now()})",
        "",
        f"- Machine: {_machine()}",
        "- Command: `.venv/bin/python benchmarks/bench_collectives.py page "
        f"--profile {profile} --repeat {repeat}`",
        f"- Scrape and evaluation interval {scrape}; stall threshold max({cfg.stall_min_seconds} s, "
        f"{cfg.stall_step_factor:g} x the mean step); a rank counts as not answering after "
        f"{cfg.culprit_silent_for} of failed fetches.",
        "",
        "| run | culprit rule names rank 2 (s) | TrainingStalled page naming it (s) | the page says |",
        "|---|---:|---:|---|",
    ]
    for i, (named, at, text) in enumerate(rows, start=1):
        lines.append(f"| {i} | {named:.1f} | {at:.1f} | {text} |")
    lines.append("")
    return "\n".join(lines)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1")
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    loop_p = sub.add_parser("loop")
    loop_p.add_argument("--runs", type=int, default=3)
    loop_p.add_argument("--steps", type=int, default=300)
    page_p = sub.add_parser("page")
    page_p.add_argument("--profile", choices=("fast", "default"), default="fast")
    page_p.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    text = loop(args.runs, args.steps) if args.what == "loop" else page(args.profile, args.repeat)
    print(text)
    if not args.out.exists():
        args.out.write_text("# Flight recorder: cost and time to name the bad node\n\n")
    with args.out.open("a") as handle:
        handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
