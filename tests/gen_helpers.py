"""Helpers for the tests of generated monitoring (dashboards, rules, promtool tests)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.catalog import ALL
from babysitter.generate.rules import recording_rules

__all__ = [
    "GRAFANA_VARIABLES",
    "REPO",
    "AlertmanagerServer",
    "LiveStack",
    "WebhookReceiver",
    "agent_job",
    "alertmanager_config",
    "dashboard_exprs",
    "has_data",
    "known_series_names",
    "load_yaml",
    "promtool",
    "referenced_names",
    "require_promtool",
    "substitute_grafana",
]

REPO = Path(__file__).resolve().parents[1]
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

#: What Grafana substitutes for its built-in and our template variables, for running panel queries
#: outside Grafana: every selection matches everything, ranges are short enough for a short test run.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__range_s": "600",
    "$__range": "10m",
    "$__interval": "15s",
    "$cluster": ".*",
    "$run": ".*",
    "$instance": ".*",
    "$gpu": ".*",
}

_NAME = re.compile(r"(?<![A-Za-z0-9_:\"'$.])([a-z_][a-z0-9_]*(?::[a-z0-9_]+)*)(?=\s*(?:\{|\[|\)|$|\s|,))")
_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "quantile",
    "topk",
    "bottomk",
    "stddev",
    "stdvar",
    "count_values",
    "rate",
    "increase",
    "irate",
    "delta",
    "changes",
    "time",
    "vector",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "abs",
    "label_replace",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "quantile_over_time",
    "sum_over_time",
    "count_over_time",
    "label_values",
    "le",
    "inf",
    "nan",
}


def require_promtool() -> None:
    """Skip when promtool is missing (CI installs Debian's prometheus package)."""
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool not installed (apt-get install prometheus)")


def promtool(args: Sequence[str], cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run promtool with an argv list; never a shell."""
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def substitute_grafana(expr: str) -> str:
    """``expr`` with Grafana's variables replaced as :data:`GRAFANA_VARIABLES` says (longest first)."""
    for key in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(key, GRAFANA_VARIABLES[key])
    return expr


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels", []))


def dashboard_exprs(model: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of a dashboard model, variables' and annotations'
    queries included (``variable NAME``, ``annotation NAME``)."""
    found = [
        (panel["title"], target["expr"])
        for panel in _walk_panels(model["panels"])
        for target in panel.get("targets", [])
    ]
    found += [(f"annotation {item['name']}", item["expr"]) for item in model["annotations"]["list"]]
    for variable in model["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(
                r"label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)", variable["query"]["query"]
            )
            if match is None:
                raise ValueError(f"variable {variable['name']}: not a label_values(selector, label) query")
            found.append((f"variable {variable['name']}", match.group(1)))
    return found


def has_data(prom: Any, expr: str, instant: bool, start: float) -> bool:
    """Whether the query returns at least one finite sample (range queries from ``start`` to now)."""
    import math
    import time
    import urllib.parse

    if instant:
        values = [sample["value"][1] for sample in prom.query(expr)]
    else:
        from promkit import _get_json

        params = {"query": expr, "start": repr(start), "end": repr(time.time()), "step": "2"}
        body = _get_json(f"{prom.url}/api/v1/query_range?{urllib.parse.urlencode(params)}")
        assert body.get("status") == "success", (expr, body)
        values = [value for series in body["data"]["result"] for _, value in series["values"]]
    return any(math.isfinite(float(value)) for value in values)


def known_series_names() -> set[str]:
    """Every series name the catalog and the recording rules define (histograms and summaries with
    their suffixes)."""
    names = {"up"}
    for spec in ALL:
        names.add(spec.name)
        if spec.kind == "histogram":
            names.update(f"{spec.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        if spec.kind == "summary":
            names.update(f"{spec.name}{suffix}" for suffix in ("_sum", "_count"))
    from babysitter.generate.alerts.monitoring import FOREIGN_SERIES
    from babysitter.generate.config import GenerateConfig

    names.update(record for record, _ in recording_rules(GenerateConfig()))
    names.update(FOREIGN_SERIES)  # the rule engines' and Alertmanager's own, which the runbooks query
    return names


def referenced_names(expr: str) -> set[str]:
    """Identifiers in ``expr`` that look like series names (PromQL keywords and labels filtered out)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_matchers = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_by = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_matchers
    )
    names = {match.group(1) for match in _NAME.finditer(without_by)}
    return {
        name for name in names if name not in _PROMQL_WORDS and not re.fullmatch(r"[0-9a-z]*[0-9][hms]", name)
    }


def agent_job(generated: Path, address: str) -> dict[str, Any]:
    """The generated per-rack agent's node job (its drop list and limits) from ``generated``'s
    ``exporters/prometheus-agent.yml``, pointed at one host and scraping every second."""
    config = yaml.safe_load((generated / "exporters/prometheus-agent.yml").read_text())
    job = dict(config["scrape_configs"][0])
    job.pop("file_sd_configs")
    job.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[{"targets": [address]}])
    return job


def load_yaml(path: Path) -> Any:
    """Parse a YAML file."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# --- live stack: real trainers, a simulated node agent, Prometheus (and Alertmanager) -------------------

TESTS_DIR = Path(__file__).resolve().parent
CLUSTER = "c1"

#: A real CPU training loop with the tracker (tiny GPT), one process per rank; saves a checkpoint
#: every ``ckpt_every`` steps and loads one at step 150 (as a resume would, once Prometheus scrapes).
TRAINER = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import babysitter
from tinygpt import TinyConfig, TinyGPT, batches, palm_flops_per_token, train_step
run_dir, reg, step_sleep, ckpt_every = sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
rank = int(os.environ.get("RANK", "0"))
torch.manual_seed(rank)
cfg = TinyConfig()
model = TinyGPT(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
seq, batch = 32, 4
# LIVE_REPLICA_EVERY: the ranks join a gloo group (a file store) and run the replica check. They are not
# replicas of each other (separate seeds, no gradient all-reduce), so both are named: panels get data.
replica_every = int(os.environ.get("LIVE_REPLICA_EVERY", "0")) or None
if replica_every:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + os.environ["LIVE_STORE"], rank=rank,
                            world_size=int(os.environ["WORLD_SIZE"]))
nan_at = int(os.environ.get("LIVE_NAN_AT", "0"))  # rank 1's loss is NaN at this step (0: never)
# LIVE_SLOW "A:B": rank 0's steps A..B-1 take 0.15 s longer (a fail-slow stretch for the slowdown panels).
slow_from, slow_to = (int(x) for x in os.environ.get("LIVE_SLOW", "0:0").split(":"))
t = babysitter.watch(model, run="live", tokens_per_step=batch * seq, samples_per_step=batch,
                     flops_per_token=palm_flops_per_token(model, seq), peak_flops=2e10, port=0,
                     registry_dir=reg, run_dir=run_dir, labels={"cluster": sys.argv[6]},
                     flush_interval=0.2, mfu_window=10.0, replica_check_every=replica_every)
# A CPU rank has no GPU: it stands in for the simulated node's GPU <rank> (what watch() reads from
# torch and NVML on a CUDA rank; tests/test_rank_gpu.py tests that path), so the rank-to-GPU joins
# have data.
from babysitter.labels import normalize_pci_bus_id
from babysitter.node.gpu.fake import fake_gpus
gpu = fake_gpus(rank + 1)[rank]
t.gpu = {"uuid": gpu.uuid, "pci_bus_id": normalize_pci_bus_id(gpu.pci_bus_id)}
for x, y in t.data(batches(cfg, batch, seq, seed=rank)):
    loss = train_step(model, opt, x, y)
    t.step(loss=float("nan") if rank == 1 and t.steps + 1 == nan_at else loss)
    if t.steps == 150:
        with t.checkpoint_load(step=0):
            time.sleep(0.05)
    if t.steps % ckpt_every == 0:
        path = os.path.join(run_dir, f"ckpt-{t.global_step}-rank{rank}.pt")
        with t.checkpoint_save(step=t.global_step, nbytes=4096, path=path):
            with open(path, "wb") as f:
                f.write(bytes(4096))
            time.sleep(0.05)
    time.sleep(step_sleep + (0.15 if rank == 0 and slow_from <= t.steps < slow_to else 0.0))
"""


class LiveStack:
    """Trainers (subprocesses, one per rank) + ``babysitter node-agent --simulate`` + Prometheus.

    The agent serves the trainers (found through the registration directory), so Prometheus has one
    target, job ``babysitter-node`` with the target label ``cluster``, scraped as
    exporters/prometheus-scrape.yml does (no ``honor_labels``: the target's ``cluster`` wins over the
    trainers' own, which is dropped).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        rule_files: Sequence[Path],
        scenario: list[dict[str, Any]],
        ranks: int = 1,
        alertmanager: str | None = None,
        step_sleep: float = 0.05,
        ckpt_every: int = 25,
        extra_storage: Sequence[Path] = (),
        trainer_env: dict[str, str] | None = None,
        sysfs: Path | None = None,
        procfs: Path | None = None,
    ) -> None:
        self.workdir = workdir
        self.sysfs, self.procfs = sysfs, procfs
        self.reg = workdir / "reg"
        self.run_dir = workdir / "run"
        self.storage = workdir / "ckpt-storage"
        for folder in (self.reg, self.run_dir, self.storage):
            folder.mkdir()
        self.rule_files = list(rule_files)
        self.scenario = scenario
        self.ranks = ranks
        self.alertmanager = alertmanager
        self.step_sleep = step_sleep
        self.ckpt_every = ckpt_every
        self.extra_storage = list(extra_storage)
        self.trainer_env = dict(trainer_env or {})
        self.trainers: list[subprocess.Popen[bytes]] = []
        self.agent: subprocess.Popen[bytes] | None = None
        self.prom: Any = None
        self._logs: list[Any] = []

    def _log(self, name: str) -> Any:
        handle = (self.workdir / name).open("wb")
        self._logs.append(handle)
        return handle

    def __enter__(self) -> LiveStack:
        import json
        import os
        import sys

        from node_helpers import read_port_file
        from promkit import PrometheusServer

        try:
            scenario = self.workdir / "scenario.json"
            scenario.write_text(json.dumps({"events": self.scenario}))
            argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "2"]
            argv += ["--scenario", str(scenario), "--port", "0", "--port-file", str(self.workdir / "addr")]
            argv += ["--registry-dir", str(self.reg), "--simulate-kernel-log", str(self.workdir / "kern.log")]
            argv += ["--collector-timeout", "5", "--trainer-timeout", "0.5"]
            for path in (self.storage, *self.extra_storage):
                argv += ["--storage-path", str(path)]
            argv += ["--storage-interval", "1", "--storage-size", "4096"]
            # The trainers save every few seconds; verify enough of them that a deleted one stays
            # checked until the test has seen the page (a real job keeps its last few, saved hours apart).
            argv += ["--checkpoint-run-dir", str(self.run_dir), "--checkpoint-interval", "1"]
            argv += ["--checkpoint-keep-last", "100", "--checkpoint-reverify-interval", "1"]
            if self.sysfs is not None:  # a fake host's fabric (babysitter.node.fabric.fake)
                argv += ["--path.sysfs", str(self.sysfs), "--fabric-rescan-interval", "5"]
            if self.procfs is not None:
                argv += ["--path.procfs", str(self.procfs)]
            self.agent = subprocess.Popen(argv, stdout=self._log("agent.log"), stderr=subprocess.STDOUT)
            for rank in range(self.ranks):
                env = {
                    **os.environ,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(self.ranks),
                    # The checkpoint advisor's fallback rate, so its panels have advice to show.
                    "BABYSITTER_CLUSTER_RATE": "100/1000",
                    "LIVE_STORE": str(self.workdir / "gloo-store"),
                    **self.trainer_env,
                }
                args = [
                    str(TESTS_DIR),
                    str(self.run_dir),
                    str(self.reg),
                    str(self.step_sleep),
                    str(self.ckpt_every),
                ]
                self.trainers.append(
                    subprocess.Popen(
                        [sys.executable, "-c", TRAINER, *args, CLUSTER],
                        env=env,
                        stdout=self._log(f"trainer{rank}.log"),
                        stderr=subprocess.STDOUT,
                    )
                )
            address = read_port_file(self.workdir / "addr", timeout=60)
            job = {
                "job_name": "babysitter-node",
                "static_configs": [{"targets": [address], "labels": {"cluster": CLUSTER}}],
                "metric_relabel_configs": [{"action": "labeldrop", "regex": "exported_.*"}],
            }
            self.prom = PrometheusServer(
                self.workdir,
                scrape_interval="1s",
                evaluation_interval="1s",
                rule_files=self.rule_files,
                alertmanager=self.alertmanager,
                extra_scrape_configs=[job],
            ).__enter__()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self.prom is not None:
            self.prom.__exit__(None, None, None)
        procs = [*self.trainers, *([self.agent] if self.agent else [])]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped trainer must be able to exit
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for handle in self._logs:
            handle.close()

    def newest_checkpoint(self, timeout: float = 30.0, before: Path | None = None) -> Path:
        """Rank 0's newest checkpoint file (the sentinel verifies only the newest few of a run); with
        ``before``, the newest one older than that."""
        import time

        def step(path: Path) -> int:
            return int(path.name.split("-")[1])

        deadline = time.monotonic() + timeout
        while True:
            saved = [
                p for p in self.run_dir.glob("ckpt-*-rank0.pt") if before is None or step(p) < step(before)
            ]
            if saved:
                return max(saved, key=step)
            if time.monotonic() > deadline:
                raise AssertionError(f"no checkpoint saved in {timeout} s: {self.log_tail('trainer0.log')}")
            time.sleep(0.5)

    def log_tail(self, name: str, chars: int = 2000) -> str:
        """The end of one of the stack's logs (agent.log, trainer0.log, prometheus.log)."""
        path = self.workdir / name
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


class WebhookReceiver:
    """An Alertmanager webhook receiver on 127.0.0.1 that records every notification by URL path."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        received: list[tuple[str, dict[str, Any]]] = []
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with lock:
                    received.append((self.path, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.received = received
        self._lock = lock
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def alerts(self, path: str) -> list[dict[str, Any]]:
        """Every firing alert delivered to ``path`` so far."""
        with self._lock:
            return [
                alert
                for where, body in self.received
                if where == path
                for alert in body.get("alerts", [])
                if alert.get("status") == "firing"
            ]

    def pages(self) -> list[dict[str, Any]]:
        """Every firing alert delivered to a pager so far: infra's (``/pager``) or a team's
        (``/pager-<team>``, routed by the alert's ``team`` label)."""
        with self._lock:
            paths = {where for where, _ in self.received}
        return [
            a
            for where in sorted(paths)
            if re.fullmatch(r"/pager(-[\w-]+)?", where)
            for a in self.alerts(where)
        ]


def alertmanager_config(receiver: str) -> str:
    """The example Alertmanager config with every receiver's webhook pointed at ``receiver/<name>`` and
    short grouping delays (every route: the pager route sets its own production timings)."""
    config = yaml.safe_load((REPO / "exporters/alertmanager.yml").read_text())
    routes = [config["route"]]
    while routes:
        route = routes.pop()
        route.update(group_wait="1s", group_interval="2s", repeat_interval="1h")
        routes += route.get("routes", [])
    for item in config["receivers"]:
        item["webhook_configs"] = [{"url": f"{receiver}/{item['name']}", "send_resolved": True}]
    return str(yaml.safe_dump(config))


class AlertmanagerServer:
    """A real Alertmanager on a loopback port, clustering off, with the given config text."""

    def __init__(self, workdir: Path, config: str) -> None:
        from promkit import ALERTMANAGER, free_port, require_binary

        require_binary(ALERTMANAGER, "alertmanager")
        self.binary = ALERTMANAGER
        self.workdir = workdir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(config)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def __enter__(self) -> AlertmanagerServer:
        import time
        import urllib.request

        data = self.workdir / "am-data"
        data.mkdir()
        self._log = (self.workdir / "alertmanager.log").open("wb")
        self._proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.path={data}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",  # no gossip port on 0.0.0.0
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"alertmanager exited: {(self.workdir / 'alertmanager.log').read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError("alertmanager did not become ready in 30 s")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
