"""``babysitter demo`` end to end: start the stack, play the scenario, print pages, end with the report.

The stack: a node agent with simulated GPUs (it also serves the training process's metrics), the tiny
GPT training run (:mod:`babysitter.demo.trainer`), Prometheus loaded with the generated rules (the
fast profile, plus a slow-save threshold a CPU demo can reach; the dashboards generated with them
go to the work directory for ``--keep``), Alertmanager routing with the shipped
``exporters/alertmanager.yml`` (:mod:`babysitter.demo.routing`: every receiver pointed at the demo's
webhook, :mod:`babysitter.demo.pager`, so each line says which receiver got it) and the GPU alerts
also to ``babysitter remediate --dry-run`` (:mod:`babysitter.demo.remediation`), whose planned drain
and requeue print as they are decided. Without the Prometheus binaries the rest still runs and the
terminal says what is missing and how to install it.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from babysitter.demo.closing import FaultResult
from babysitter.demo.explainer import EXPLAINED_EVENTS, FaultExplainer
from babysitter.demo.pager import Page, PagerServer
from babysitter.demo.remediation import AuditTail, describe, remediate_policy, start_dry_run, write_job_map
from babysitter.demo.routing import RoutingError, demo_alertmanager_config, load_routing, shipped_routing
from babysitter.demo.scenario import PROCESS_EVENTS, DemoEvent, Scenario
from babysitter.demo.stack import (
    INSTALL_HINT,
    Binaries,
    Stack,
    StackError,
    find_binaries,
    prometheus_config,
    write_json,
)
from babysitter.demo.view import DemoView
from babysitter.terminal import clean

__all__ = [
    "COLLECTOR_TIMEOUT",
    "HEARTBEATS",
    "TRAINER_TIMEOUT",
    "DemoOptions",
    "FaultResult",
    "demo_generate_config",
    "match_pages",
    "node_agent_argv",
    "run_demo",
    "unscripted",
]

log = logging.getLogger(__name__)

RUN_NAME = "demo"
CLUSTER = "demo"
#: Seconds after the scenario's end to wait for the last pages (Prometheus eval + Alertmanager wait).
PAGE_GRACE = 8.0
#: Seconds the node agent waits for one trainer endpoint, and for one collector (a whole round of
#: trainer fetches); both must end before Prometheus's scrape timeout (stack.SCRAPE_TIMEOUT, 1 s).
TRAINER_TIMEOUT = 0.5
COLLECTOR_TIMEOUT = 0.8
#: Seconds the closing report waits for an explanation still being computed.
EXPLAIN_GRACE = 10.0
#: Unscripted exits of the training process tolerated before the demo gives up (a broken install).
_MAX_CRASHES = 3


@dataclass(frozen=True)
class DemoOptions:
    """What ``babysitter demo`` was asked to do."""

    scenario: Scenario
    workdir: Path | None = None
    keep: bool = False
    prometheus_bin: str | None = None
    alertmanager_bin: str | None = None
    strict: bool = False
    pace: float = 0.1
    checkpoint_interval: float = 10.0
    #: Alertmanager routing to run with (default: the shipped exporters/alertmanager.yml).
    alertmanager_config: Path | None = None


#: Alerts that fire always, by design (the dead man's switch heartbeat): never a fault's page.
HEARTBEATS = frozenset({"Watchdog"})
#: Notifications of one alert this close to its first one count as the same delivery (one per receiver).
_SAME_DELIVERY = 10.0


def demo_generate_config() -> Any:
    """The generated rules' fast profile, with a slow-save alert a CPU demo can trip (1 s over 30 s)."""
    from babysitter.generate import fast

    return replace(fast(), checkpoint_save_slow_seconds=1.0, checkpoint_slow_window="30s")


def match_pages(events: tuple[DemoEvent, ...], pages: list[Page], t0: float) -> list[FaultResult]:
    """For each fault, the first firing notification of each expected alert after it (same GPU for GPU
    faults), whatever receiver it went to, and the receivers that got it."""
    results = []
    for event in events:
        found: dict[str, float | None] = {}
        receivers: dict[str, tuple[str, ...]] = {}
        for name in event.expect:
            matching = [
                page
                for page in pages
                if page.status == "firing"
                and page.name == name
                and page.received >= t0 + event.at
                and (event.gpu is None or page.labels.get("gpu", str(event.gpu)) == str(event.gpu))
            ]
            if not matching:
                found[name] = None
                continue
            first = matching[0].received
            found[name] = first - t0 - event.at
            receivers[name] = tuple(
                sorted({p.receiver for p in matching if p.received - first <= _SAME_DELIVERY})
            )
        results.append(FaultResult(event, found, receivers))
    return results


def unscripted(events: tuple[DemoEvent, ...], pages: list[Page]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Alerts that fired though no scripted fault expects them: name -> (severity, receivers)."""
    expected = {name for event in events for name in event.expect}
    out: dict[str, tuple[str, set[str]]] = {}
    for page in pages:
        if page.status == "firing" and page.name not in expected and page.name not in HEARTBEATS:
            out.setdefault(page.name, (page.severity, set()))[1].add(page.receiver)
    return {name: (severity, tuple(sorted(r))) for name, (severity, r) in sorted(out.items())}


def node_agent_argv(
    *,
    port_file: Path,
    gpus: int,
    gpu_model: str,
    scenario: Path,
    kernel_log: Path,
    registry: Path,
    run_dir: Path,
    jobs_dir: Path,
) -> list[str]:
    """The demo's node agent. Its deadlines nest inside Prometheus's scrape timeout: one trainer's
    fetch (:data:`TRAINER_TIMEOUT`) < a collector (:data:`COLLECTOR_TIMEOUT`) < the scrape
    (:data:`~babysitter.demo.stack.SCRAPE_TIMEOUT`), so a stopped trainer is reported as one failed
    endpoint (what TrainingStalled reads) rather than failing the whole trainers collector."""
    return [
        sys.executable, "-m", "babysitter", "node-agent",
        "--listen-address", "127.0.0.1:0",
        "--port-file", str(port_file),
        "--simulate", str(gpus),
        "--gpu-model", gpu_model,
        "--scenario", str(scenario),
        "--simulate-kernel-log", str(kernel_log),
        "--registry-dir", str(registry),
        "--storage-path", str(run_dir),
        "--storage-interval", "5",
        "--checkpoint-run-dir", str(run_dir),
        "--checkpoint-interval", "5",
        "--trainer-timeout", repr(TRAINER_TIMEOUT),
        "--collector-timeout", repr(COLLECTOR_TIMEOUT),
        "--gpu-job-dir", str(jobs_dir),
    ]  # fmt: skip


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the demo (main thread only). SIGINT too: a shell starts a
    background job with SIGINT ignored, and Python then installs no Ctrl-C handler of its own, so the
    demo (or a test that starts it from such a job, as CI does) would never stop on Ctrl-C."""

    def _raise(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with suppress(ValueError, OSError):
            old[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in old.items():
            with suppress(ValueError, OSError):
                signal.signal(sig, handler)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """Ignore SIGINT, SIGTERM and SIGHUP for the duration (main thread only)."""
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with suppress(ValueError, OSError):
            old[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in old.items():
            with suppress(ValueError, OSError):
                signal.signal(sig, handler)


class _Demo:
    def __init__(self, options: DemoOptions, console: Any) -> None:
        self.o = options
        self.console = console
        self.scenario = options.scenario
        if options.workdir is not None:
            options.workdir.mkdir(parents=True, exist_ok=True)
            self.workdir = options.workdir.resolve()
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="babysitter-demo-"))
        self.run_dir = self.workdir / "run"
        self.registry = self.workdir / "registry"
        self.stack = Stack(self.workdir)
        self.binaries: Binaries = find_binaries(options.prometheus_bin, options.alertmanager_bin)
        self.pager: PagerServer | None = None
        self.prometheus_url: str | None = None
        self.alertmanager_url: str | None = None
        self.agent_address: str | None = None
        self.t0 = 0.0
        self.view: DemoView | None = None
        self.pending_pages: list[Page] = []
        self._prom_config: tuple[Path, list[Path], str | None] | None = None
        self.audit: AuditTail | None = None
        self.remediate_url: str | None = None
        self.remediate_token: Path | None = None
        self.routing_path: Path | None = None
        #: Dashboards generated for the profile the demo's rules use (None: no Prometheus).
        self.dashboards: Path | None = None
        #: What the dry-run remediator decided: ``(line, audit line)``, in order.
        self.remediations: list[tuple[str, str]] = []
        #: Explains the throttle faults on screen (None: no Prometheus).
        self.explainer: FaultExplainer | None = None
        #: Heartbeat notifications (Watchdog) received.
        self.heartbeats = 0
        #: The simulated GPU the CPU training claims in train_info: the first throttled one, else 0.
        throttled = [e.gpu for e in self.scenario.events if e.event == "throttle" and e.gpu is not None]
        self.claimed_gpu = throttled[0] if throttled else 0

    # -------------------------------------------------------------------------------- start

    def say(self, text: str, style: str | None = None) -> None:
        if self.view is not None:
            self.view.say(text, style)
        else:
            self.console.print(clean(text), style=style, highlight=False, markup=False)

    def _on_page(self, page: Page) -> None:
        if page.name in HEARTBEATS:
            # The dead man's switch heartbeat repeats every minute: said once, then counted.
            self.heartbeats += 1
            if self.heartbeats == 1:
                self.say(
                    f"{page.name} heartbeat reached receiver {page.receiver or '?'}: the whole alerting path "
                    "works (an external dead man's switch pages when the heartbeats stop)"
                )
            return
        if self.view is not None:
            self.view.page(page)
        else:
            self.pending_pages.append(page)

    def start_monitoring(self) -> None:
        from babysitter.generate.writer import ALERT_RULES, RECORDING_RULES, render

        missing = self.binaries.missing()
        if missing:
            self.say(
                f"Missing: {' and '.join(missing)} (looked on PATH and in /usr/bin). The demo runs the "
                f"training, the node agent and the report without {'them' if len(missing) > 1 else 'it'}; "
                f"for alerts and pages install: {INSTALL_HINT}",
                style="bold yellow",
            )
        if self.binaries.prometheus is None:
            return
        routing = self._routing() if self.binaries.alertmanager is not None else None
        rules_dir = self.workdir / "rules"
        rules_dir.mkdir(exist_ok=True)
        files = render(demo_generate_config())
        rule_files = []
        for rel in (RECORDING_RULES, ALERT_RULES):
            path = rules_dir / Path(rel).name
            path.write_text(files[rel])
            rule_files.append(path)
        self.write_dashboards(files)
        # Prometheus first (the remediator's job map needs its URL), with neither target nor
        # Alertmanager yet: point_prometheus() reloads it with both.
        prom_dir = self.workdir / "prometheus"
        prom_dir.mkdir(exist_ok=True)
        config = write_json(
            prom_dir / "prometheus.yml",
            prometheus_config(agent=None, rule_files=rule_files, alertmanager=None, cluster=CLUSTER),
        )
        prom_bin = self.binaries.prometheus
        port = self.stack.start_server(
            "prometheus",
            lambda port: [
                prom_bin,
                f"--config.file={config}",
                f"--storage.tsdb.path={prom_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            timeout=60,
        )
        self.prometheus_url = f"http://127.0.0.1:{port}"
        am_address = None
        if self.binaries.alertmanager is not None and routing is not None:
            self.pager = PagerServer(self._on_page).start()
            remediate_url = self.start_remediator()
            am_dir = self.workdir / "alertmanager"
            am_dir.mkdir(exist_ok=True)
            config = write_json(
                am_dir / "alertmanager.yml",
                demo_alertmanager_config(
                    routing, self.pager.url_for, remediate_url, remediate_token=self.remediate_token
                ),
            )
            am_bin = self.binaries.alertmanager
            am_port = self.stack.start_server(
                "alertmanager",
                lambda port: [
                    am_bin,
                    f"--config.file={config}",
                    f"--storage.path={am_dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--cluster.listen-address=",  # no gossip port: a single instance
                    "--log.level=warn",
                ],
                timeout=30,
            )
            am_address = f"127.0.0.1:{am_port}"
            self.alertmanager_url = f"http://{am_address}"
        self._prom_config = (prom_dir / "prometheus.yml", rule_files, am_address)

    def write_dashboards(self, files: Mapping[str, str]) -> None:
        """The Grafana dashboards generated with the rules the demo's Prometheus records (the fast
        profile): the committed ones query the ``rate5m`` series, which this Prometheus never has."""
        out = self.workdir / "dashboards"
        out.mkdir(exist_ok=True)
        for rel, text in files.items():
            if rel.startswith("dashboards/") and rel.endswith(".json"):
                (out / Path(rel).name).write_text(text)
                (out / Path(rel).name).chmod(0o644)
        self.dashboards = out

    def _routing(self) -> dict[str, Any]:
        """The Alertmanager routing the demo runs with: the shipped one unless the user gave one."""
        path = self.o.alertmanager_config or shipped_routing()
        if path is None:
            raise StackError(
                "this installation lacks its babysitter/data/alertmanager.yml (reinstall babysitter), "
                "or pass --alertmanager-config FILE, your Alertmanager routing"
            )
        try:
            routing = load_routing(path)
        except RoutingError as exc:
            raise StackError(str(exc)) from None
        self.routing_path = path
        return routing

    def start_remediator(self) -> str:
        """``babysitter remediate --dry-run`` on an ephemeral port; its webhook URL. Alertmanager
        authenticates with a fresh token (a 0600 file), as in production: the receiver takes no
        unauthenticated request."""
        assert self.prometheus_url is not None
        rem_dir = self.workdir / "remediate"
        audit = rem_dir / "audit.jsonl"
        policy = remediate_policy(audit_log=audit, prometheus_url=self.prometheus_url, cluster=CLUSTER)
        proc, token, port_file = start_dry_run(self.stack, rem_dir, policy)
        self.remediate_token = token
        address = self._address("remediate", proc, port_file, "babysitter remediate")
        self.audit = AuditTail(audit)
        self.remediate_url = f"http://{address}/alerts"
        return self.remediate_url

    def show_remediations(self) -> None:
        """Print what the dry-run remediator decided since the last call."""
        if self.audit is None:
            return
        for record in self.audit.new_records():
            found = describe(record)
            if found is None:
                continue
            self.remediations.append(found)
            head, line = found
            if self.view is not None:
                self.view.remediation(head, line, refused=record.get("event") == "refused")

    def point_prometheus(self) -> None:
        """Add the node agent as Prometheus' target and reload its configuration."""
        if self.prometheus_url is None or self.agent_address is None or self._prom_config is None:
            return
        path, rule_files, am_address = self._prom_config
        write_json(
            path,
            prometheus_config(
                agent=self.agent_address, rule_files=rule_files, alertmanager=am_address, cluster=CLUSTER
            ),
        )
        request = urllib.request.Request(f"{self.prometheus_url}/-/reload", method="POST")  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback URL we built
            if response.status != 200:
                raise StackError(f"prometheus reload answered {response.status}")

    def start_agent(self) -> None:
        # The storage probe watches the run directory from its first round: it exists before the
        # training (whose torch import takes seconds) creates it, or a loaded machine pages
        # StorageProbeFailing at start.
        self.run_dir.mkdir(parents=True, exist_ok=True)
        scenario_path = write_json(
            self.workdir / "node-scenario.json", {"events": self.scenario.node_events()}
        )
        jobs_dir = self.workdir / "gpu-jobs"
        write_job_map(jobs_dir, self.scenario.gpus)
        port_file = self.workdir / "node-agent.addr"
        argv = node_agent_argv(
            port_file=port_file,
            gpus=self.scenario.gpus,
            gpu_model=self.scenario.gpu_model,
            scenario=scenario_path,
            kernel_log=self.workdir / "kern.log",
            registry=self.registry,
            run_dir=self.run_dir,
            jobs_dir=jobs_dir,
        )
        proc = self.stack.start("node-agent", argv)
        self.agent_address = self._address("node-agent", proc, port_file, "node agent")

    def _address(self, name: str, proc: Any, port_file: Path, what: str, timeout: float = 60.0) -> str:
        """The HOST:PORT a process writes into ``port_file`` once it serves; StackError if it dies first."""
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if proc.poll() is not None:
                raise StackError(f"{what} exited: {self.stack.log_path(name).read_text()[-1500:]}")
            if time.monotonic() > deadline:
                raise StackError(f"{what} did not start in {timeout:g} s")
            time.sleep(0.1)
        return port_file.read_text().strip()

    def start_trainer(self) -> None:
        self.stack.start(
            "trainer",
            [
                sys.executable, "-m", "babysitter.demo.trainer",
                "--run-dir", str(self.run_dir),
                "--registry-dir", str(self.registry),
                "--run", RUN_NAME,
                "--cluster", CLUSTER,
                "--t0", repr(self.t0),
                "--events", json.dumps(self.scenario.trainer_events(self.claimed_gpu)),
                "--pace", repr(self.o.pace),
                "--checkpoint-interval", repr(self.o.checkpoint_interval),
                "--simulated-gpu", str(self.claimed_gpu),
            ],
        )  # fmt: skip

    def restart_trainer(self) -> None:
        """Start the training again, and say so in stack.json: scripts read the live pid there (it
        listed the killed process's before issue 22)."""
        self.start_trainer()
        self.write_stack_file()

    def write_stack_file(self) -> None:
        write_json(
            self.workdir / "stack.json",
            {
                "prometheus": self.prometheus_url,
                "alertmanager": self.alertmanager_url,
                "pager": self.pager.url if self.pager else None,
                "remediate": self.remediate_url,
                "node_agent": f"http://{self.agent_address}/metrics",
                "run_dir": str(self.run_dir),
                "t0": self.t0,
                "duration": self.scenario.duration,
                "pids": {name: p.pid for name, p in self.stack.procs.items()},
            },
        )

    # ---------------------------------------------------------------------------- play

    def _source(self) -> Any:
        from babysitter.views.top import MetricsSource, PrometheusSource

        if self.prometheus_url:
            return PrometheusSource(self.prometheus_url, window="20s", timeout=2.0)
        return MetricsSource([f"http://{self.agent_address}/metrics"], timeout=2.0)

    def play(self) -> None:
        assert self.view is not None
        source = self._source()
        todo = list(self.scenario.events)
        timers: list[tuple[float, str, str]] = []  # (due, action, process)
        trainer_down_since: float | None = None
        crashes = 0
        next_frame = 0.0
        end = self.t0 + self.scenario.duration
        while (now := time.time()) < end:
            while todo and self.t0 + todo[0].at <= now:
                event = todo.pop(0)
                self.view.event(event)
                if event.event in EXPLAINED_EVENTS and self.explainer is not None:
                    self.explainer.schedule(event, self.t0 + event.at)
                if event.event in PROCESS_EVENTS:
                    timers.extend(self._process_fault(event, now))
            for item in sorted(t for t in timers if t[0] <= now):
                timers.remove(item)
                _, action, name = item
                if action == "restart":
                    self.say("training restarts (resumes from its last checkpoint)", style="cyan")
                    self.restart_trainer()
                elif action == "cont":
                    self.stack.signal(name, signal.SIGCONT)
                    self.say("training process continues (SIGCONT)", style="cyan")
            expected_down = any(a == "restart" for _, a, _ in timers)
            if not self.stack.alive("trainer") and not expected_down:
                if trainer_down_since is None:
                    trainer_down_since = now
                    crashes += 1
                    if crashes > _MAX_CRASHES:
                        raise StackError(
                            f"the training exited {crashes} times on its own; its log ends with:\n"
                            + self.stack.log_path("trainer").read_text(errors="replace")[-1500:]
                        )
                    code = self.stack.procs["trainer"].returncode
                    self.say(
                        f"training exited unexpectedly (code {code}); restarting in 5 s; "
                        f"log: {self.stack.log_path('trainer')}",
                        style="bold red",
                    )
                elif now - trainer_down_since > 5:
                    trainer_down_since = None
                    self.restart_trainer()
            if not self.stack.alive("node-agent"):
                raise StackError(f"node agent died: {self.stack.log_path('node-agent').read_text()[-1500:]}")
            self.show_remediations()
            if now >= next_frame:
                next_frame = now + 1.0
                try:
                    frame = source.frame()
                except Exception as exc:  # the view must not end the demo
                    log.warning("demo: view refresh failed: %s", exc)
                    frame = None
                self.view.update(frame, todo[0] if todo else None)
            time.sleep(0.2)
        for _, action, name in timers:  # a freeze that outlasts the scenario
            if action == "cont":
                self.stack.signal(name, signal.SIGCONT)

    def _process_fault(self, event: DemoEvent, now: float) -> list[tuple[float, str, str]]:
        if event.event == "kill":
            self.stack.signal("trainer", signal.SIGKILL)
            with suppress(Exception):
                self.stack.procs["trainer"].wait(timeout=5)
            after = event.args.get("restart_after", 5.0)
            return [] if after is None else [(now + float(after), "restart", "trainer")]
        if event.event == "freeze":
            self.stack.signal("trainer", signal.SIGSTOP)
            return [(now + event.seconds, "cont", "trainer")]
        return []

    # ---------------------------------------------------------------------------- finish

    def wait_for_pages(self) -> None:
        if self.pager is None:
            return
        results = match_pages(self.scenario.events, self.pager.snapshot(), self.t0)
        deadline = time.time() + PAGE_GRACE
        while time.time() < deadline and any(d is None for r in results for d in r.pages.values()):
            time.sleep(0.5)
            results = match_pages(self.scenario.events, self.pager.snapshot(), self.t0)
        self.show_remediations()

    def start_explainer(self) -> None:
        """Explain the throttle faults with the rules this Prometheus records (the demo's fast profile)."""
        if self.prometheus_url is None:
            return
        self.explainer = FaultExplainer(
            self.prometheus_url,
            run=RUN_NAME,
            cluster=CLUSTER,
            cfg=demo_generate_config(),
            on_line=self._explained,
        )

    def _explained(self, line: str) -> None:
        # From the explainer's thread, whenever an answer comes: held with the pages once the closing
        # output begins (explained_summary prints every explanation again after the fault table).
        if self.view is not None:
            self.view.say(line, style="bold cyan", live=True)

    def explained_summary(self) -> None:
        """The explanations, again, after the fault table; faults explained too late are said so."""
        if self.explainer is None:
            return
        self.explainer.close(wait=EXPLAIN_GRACE)
        shown = {id(r.event) for r in self.explainer.results}
        for result in self.explainer.results:
            self.console.print(clean(result.line()), highlight=False, markup=False)  # Prometheus' labels
            self.console.print(
                f"  asked from a shell (while the stack runs: --keep): {self.explainer.command(result)}",
                highlight=False,
                markup=False,
            )
        for event in self.scenario.events:
            if event.event in EXPLAINED_EVENTS and id(event) not in shown:
                self.console.print(
                    f"not explained {event.describe()}: no answer before the end (explain looks at "
                    f"the {self.explainer.delay:g} s after the fault)",
                    highlight=False,
                    markup=False,
                )

    def remediation_summary(self) -> None:
        """What the dry-run remediator would have done, in one line after the fault table."""
        if self.audit is None:
            return
        planned = [head for head, _ in self.remediations if head.startswith("REMEDIATE (dry run)")]
        self.console.print(
            f"babysitter remediate --dry-run planned {len(planned)} action(s), ran none; "
            f"audit log: {self.audit.path}",
            highlight=False,
            markup=False,
        )

    def fault_table(self) -> list[FaultResult]:
        from babysitter.demo.closing import fault_table, unscripted_table

        pages = self.pager.snapshot() if self.pager else []
        results = match_pages(self.scenario.events, pages, self.t0)
        self.console.print(fault_table(results, pager=self.pager is not None))
        if self.pager is not None:
            others = unscripted(self.scenario.events, pages)
            if others:
                self.console.print(unscripted_table(others))
            else:
                self.console.print("No alert arrived that no scripted fault caused.", highlight=False)
            if self.routing_path is not None:
                self.console.print(
                    f"routing: {self.routing_path} (receivers pointed at the demo, waits shortened); "
                    "PAGE lines went to a pager receiver (pager, or a team's pager-<team>, "
                    "named on the line)",
                    highlight=False,
                )
        return results

    def report(self) -> float | None:
        from babysitter.ledger import summarize
        from babysitter.views.report import render_png, render_table

        summary = summarize(self.run_dir)
        if summary.state == "empty":
            self.say(
                "no ledger records: the training never stepped; see " + str(self.stack.log_path("trainer")),
                style="bold red",
            )
            return None
        self.console.print()
        render_table(summary, console=self.console)
        png = self.workdir / "goodput-report.png"
        try:
            render_png(summary, png)
            png_text = str(png)
        except (ImportError, OSError) as exc:
            png_text = f"not written ({exc})"
        t = summary.totals
        lost = t.badput_seconds.get("lost_progress", 0.0)
        self.console.print(
            f"goodput {t.goodput:.1%} (productive {t.productive_seconds:.1f}s of {t.wall_seconds:.1f}s wall, "
            f"{t.restarts} restart(s), {lost:.1f}s lost progress); ledger state {summary.state}",
            highlight=False,
        )  # fmt: skip
        self.console.print(clean(f"report PNG: {png_text}"), highlight=False, markup=False)
        self.console.print(
            f"same table any time: babysitter report {self.run_dir}", highlight=False, markup=False
        )
        return float(t.goodput)

    def keep_message(self) -> None:
        lines = ["The stack keeps running (training continues, healthy) until Ctrl-C:"]
        if self.prometheus_url:
            lines.append(f"  Prometheus    {self.prometheus_url}  (rules: {self.workdir / 'rules'})")
        if self.alertmanager_url:
            lines.append(f"  Alertmanager  {self.alertmanager_url}")
        lines.append(f"  node agent    http://{self.agent_address}/metrics")
        lines.append(
            f"  babysitter top --prometheus {self.prometheus_url}"
            if self.prometheus_url
            else f"  babysitter top --metrics http://{self.agent_address}/metrics"
        )
        if self.prometheus_url:
            lines.append(
                f"  babysitter explain --prometheus {self.prometheus_url} --run {RUN_NAME} --since 2m "
                "--baseline 2m   (the last 2 minutes against the 2 before; explain reads the rate window "
                "from the loaded rules)"
            )
        if self.dashboards is not None:
            lines.append(
                "  Grafana: add a Prometheus data source with the URL above, then Dashboards > New > "
                f"Import each JSON file of {self.dashboards} (generated for the demo's fast profile: "
                "the repository's dashboards/ query production's 5 m recording rules)"
            )
        for line in lines:
            self.console.print(line, highlight=False)


def run_demo(options: DemoOptions, console: Any) -> int:
    """Run the demo; 0 when it played through, 1 when the stack failed, 3 with ``strict`` and a fault
    that was not paged, 130 after Ctrl-C."""
    demo = _Demo(options, console)
    code = 0
    with _terminate_as_interrupt():
        try:
            console.print(f"babysitter demo: work directory {demo.workdir}", highlight=False)
            demo.start_monitoring()
            demo.t0 = time.time()
            demo.view = DemoView(console, t0=demo.t0, duration=demo.scenario.duration)
            for page in demo.pending_pages:
                demo.view.page(page)
            demo.start_agent()
            demo.point_prometheus()
            demo.start_trainer()
            demo.write_stack_file()
            demo.start_explainer()
            demo.say(
                f"stack up: {demo.scenario.gpus} simulated {demo.scenario.gpu_model} GPUs (node agent "
                f"http://{demo.agent_address}), tiny GPT training on CPU"
                + (f", Prometheus {demo.prometheus_url}" if demo.prometheus_url else "")
                + (
                    f", Alertmanager routing as {demo.routing_path} (receivers: the demo's webhook)"
                    if demo.alertmanager_url
                    else ""
                )
                + (" + babysitter remediate --dry-run (GPU alerts)" if demo.remediate_url else ""),
                style="bold",
            )
            demo.view.start()
            try:
                demo.play()
            finally:
                demo.view.stop()
            if not options.keep:
                demo.say("scenario over: stopping the training cleanly")
                demo.stack.stop("trainer", grace=30)
            demo.wait_for_pages()
            demo.view.hold()  # the closing tables and the report end the output: no page after them
            results = demo.fault_table()
            demo.remediation_summary()
            demo.explained_summary()
            demo.report()
            if demo.binaries.missing():
                demo.say(
                    f"alerts and pages were skipped: {' and '.join(demo.binaries.missing())} missing; "
                    f"install: {INSTALL_HINT}",
                    style="bold yellow",
                )
            elif options.strict and any(d is None for r in results for d in r.pages.values()):
                code = 3
            if options.keep:
                demo.keep_message()
                demo.view.hold(False)
                while True:
                    time.sleep(1)
        except KeyboardInterrupt:
            console.print("\nbabysitter demo: interrupted, stopping everything it started")
            code = 130
        except (StackError, OSError) as exc:
            # A stack error may quote a process's log (label values, paths): cleaned, not markup.
            message = clean(f"babysitter demo: {exc}", multiline=True)
            console.print(message, style="bold red", highlight=False, markup=False)
            console.print(f"logs: {demo.stack.logs}", highlight=False, markup=False)
            code = 1
        finally:
            # Cleanup is short and bounded (SIGTERM, then SIGKILL after the grace); a second Ctrl-C
            # must not cut it short and leave processes behind.
            with _signals_ignored():
                if demo.view is not None:
                    demo.view.stop()
                demo.stack.close()
                if demo.pager is not None:
                    demo.pager.close()
    return code
