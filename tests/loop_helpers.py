"""The loop from fault to resumed training, on a real Slurm cluster, timed (issue 35, point 3).

What runs, all real processes on loopback: the tests' Slurm cluster (four slurmd, ``n1``-``n4``, one
CPU each), one ``babysitter node-agent --simulate 1`` per node following its own kernel log file (an
Xid is injected by appending the driver's line to it, as fault-injection services write ``/dev/kmsg``),
Prometheus scraping the agents with the generated rules (``profile``: ``fast`` for CI, ``shipped`` for
the committed rules at the shipped scrape and evaluation intervals), Alertmanager routing the loop's
alerts to ``babysitter remediate`` (token, the policy below), and a two-rank gloo job (``sbatch -N 2``,
``srun``; ``tests/scripts/loop_train.py``) tracked by ``watch()`` with its run directory.

The policy: GpuXidCritical drains the host and requeues the job; TrainingStalled drains the culprit's
host and requeues; TrainingProcessExited requeues. Every action waits for the incident's bundle. The job
script holds its allocation when its step fails (``srun --kill-on-bad-exit=1 ...; sleep``), so that a
crashed rank's job is requeued by the remediator rather than ended: Slurm does not requeue a job that
exits.

Faults, one after the other, each once the job has trained past a fresh checkpoint:

- ``xid``: Xid 79 on the GPU of the node rank 0 runs on;
- ``hang``: rank 1 stopped (SIGSTOP);
- ``crash``: rank 1 killed (SIGKILL).

For each: the fault's time, the alert's start (the remediation note), the bundle (the audit log's
``incident`` record), the action (the note), and the first step of the job's next incarnation (the
ledger): detection, action, resume, and MTTR (fault to first step resumed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from babysitter.generate import fast
from babysitter.generate.writer import render, write
from babysitter.labels import normalize_pci_bus_id
from babysitter.node.gpu.fake import fake_gpus
from gen_helpers import REPO, AlertmanagerServer
from node_helpers import read_port_file
from promkit import PrometheusServer, free_port
from remediate_helpers import SlurmCluster

__all__ = ["FAULTS", "ORDER", "Loop", "Measured", "run_loop"]

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS / "scripts" / "loop_train.py"
NODES = ("n1", "n2", "n3", "n4")
FAULTS = ("xid", "hang", "crash")
ALERTS = {"xid": "GpuXidCritical", "hang": "TrainingStalled", "crash": "TrainingProcessExited"}
#: Per profile: scrape interval, global evaluation interval, Alertmanager group_wait/group_interval,
#: the watchdog's hang floor (the in-process stack dump; the page's threshold is the rules').
#: The rails' rate window: a job requeued within it is not requeued again for another alert (the dying
#: ranks of a requeued job page TrainingProcessExited too), so faults come further apart than this.
PROFILES = {
    "fast": {
        "scrape": "1s",
        "evaluation": "1s",
        "group_wait": "1s",
        "group_interval": "2s",
        "hang_floor": "10",
        "rate_window": 40.0,
    },
    "shipped": {
        "scrape": "15s",
        "evaluation": "1m",
        "group_wait": "10s",
        "group_interval": "1m",
        "hang_floor": "300",
        "rate_window": 180.0,
    },
}
#: A crash first: a requeue's dying ranks keep TrainingProcessExited firing on their hosts for the
#: rule's window (10 m shipped), and a rank that crashes there meanwhile is no new alert.
ORDER = ("crash", "xid", "hang")


@dataclass
class Measured:
    """One fault, timed (Unix seconds; None: not reached)."""

    fault: str
    node: str
    at: float
    alert: str = ""
    alert_start: float | None = None
    bundle: dict[str, Any] | None = None
    bundle_at: float | None = None
    acted: float | None = None
    actions: list[str] = field(default_factory=list)
    resumed: float | None = None
    resume_step: int | None = None
    note_resume_step: int | None = None
    restart: dict[str, Any] | None = None

    def seconds(self, when: float | None) -> float | None:
        """Seconds from the fault to ``when``."""
        return None if when is None else when - self.at

    @property
    def mttr(self) -> float | None:
        """Fault to the first step of the next incarnation."""
        return self.seconds(self.resumed)


def _job_script(workdir: Path, run_dir: Path, nodes: Path, hang_floor: str) -> Path:
    script = workdir / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        "export MASTER_ADDR=127.0.0.1\n"
        "export MASTER_PORT=$((20000 + (SLURM_JOB_ID % 500) * 20 + ${SLURM_RESTART_COUNT:-0} % 20))\n"
        f"srun --kill-on-bad-exit=1 {sys.executable} {SCRIPT} {run_dir} {nodes} {hang_floor}\n"
        "# A failed step: hold the allocation, so that the remediator requeues the job (Slurm would not).\n"
        "exec sleep 3600\n"
    )
    script.chmod(0o755)
    return script


class Loop:
    """The whole stack; ``with Loop(workdir, profile) as loop: loop.inject("xid") ...``."""

    def __init__(self, workdir: Path, profile: str = "fast") -> None:
        self.workdir = workdir
        self.profile = profile
        self.settings = PROFILES[profile]
        self.run_dir = workdir / "runs" / "loop"
        self.nodes = workdir / "nodes"
        self.audit = workdir / "audit.jsonl"
        self._stack = contextlib.ExitStack()
        self._procs: list[subprocess.Popen[bytes]] = []
        self.job = ""
        self.agents: dict[str, str] = {}
        self._stopped: list[int] = []
        self.last_action = 0.0

    # ------------------------------------------------------------------ setup

    def __enter__(self) -> Loop:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _spawn(self, argv: list[str], log: str, env: dict[str, str] | None = None) -> None:
        out = (self.workdir / log).open("wb")
        self._stack.callback(out.close)
        self._procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env))

    def _start(self) -> None:
        w = self.workdir
        self.run_dir.mkdir(parents=True)
        jobs = []
        for node in NODES:
            for sub in ("reg", "jobs"):
                (self.nodes / node / sub).mkdir(parents=True)
            (self.nodes / node / "kmsg.log").write_text("")
            jobs.append(self.nodes / node / "jobs")
        prolog, epilog = w / "prolog.sh", w / "epilog.sh"
        prolog.write_text(
            f'#!/bin/sh\necho "$SLURM_JOB_ID" > {self.nodes}/"$SLURMD_NODENAME"/jobs/0\nexit 0\n'
        )
        epilog.write_text(f'#!/bin/sh\nrm -f {self.nodes}/"$SLURMD_NODENAME"/jobs/0\nexit 0\n')
        for script in (prolog, epilog):
            script.chmod(0o755)
        weights = {node: i + 1 for i, node in enumerate(NODES)}
        self.slurm = self._stack.enter_context(
            SlurmCluster(w / "slurm", NODES, weights=weights, prolog=str(prolog), epilog=str(epilog))
        )
        for node in NODES:
            folder = self.nodes / node
            argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "1", "--port", "0"]
            argv += ["--port-file", str(folder / "addr"), "--registry-dir", str(folder / "reg")]
            argv += ["--gpu-job-dir", str(folder / "jobs"), "--simulate-kernel-log", str(folder / "kmsg.log")]
            argv += ["--trainer-timeout", "0.5", "--no-collector.storage", "--no-collector.sentinel"]
            for collector in ("infiniband", "pcie", "topology", "edac", "thermal"):
                argv.append(f"--no-collector.{collector}")
            self._spawn(argv, f"agent-{node}.log")
        for node in NODES:
            self.agents[node] = read_port_file(self.nodes / node / "addr", timeout=90)
        rules = self._rules()
        receiver = f"127.0.0.1:{free_port()}"
        token = w / "remediate.token"
        token.write_text("loop-remediate-token-0123456789\n")
        token.chmod(0o600)
        am = self._stack.enter_context(
            AlertmanagerServer(w, yaml.safe_dump(self._am_config(receiver, token)))
        )
        jobs_cfg = [
            {
                "job_name": f"babysitter-node-{node}",
                "honor_labels": True,
                "scrape_interval": self.settings["scrape"],
                "scrape_timeout": "1s" if self.profile == "fast" else "10s",
                "static_configs": [
                    {"targets": [self.agents[node]], "labels": {"cluster": "c1", "instance": f"{node}:9400"}}
                ],
            }
            for node in NODES
        ]
        self.prom = self._stack.enter_context(
            PrometheusServer(
                w,
                rule_files=rules,
                extra_scrape_configs=jobs_cfg,
                alertmanager=am.address,
                scrape_interval=self.settings["scrape"],
                evaluation_interval=self.settings["evaluation"],
            )
        )
        policy = w / "policy.yaml"
        policy.write_text(yaml.safe_dump(self._policy()))
        argv = [sys.executable, "-m", "babysitter", "remediate", "--policy", str(policy)]
        argv += ["--listen-address", receiver, "--token-file", str(token)]
        self._spawn(argv, "remediate.log", env=self.slurm.env)
        script = _job_script(w, self.run_dir, self.nodes, self.settings["hang_floor"])
        self.job = self.slurm.run(
            "sbatch", "--parsable", "--requeue", "-N", "2", "--ntasks-per-node=1", "-J", "loop",
            "-o", str(w / "job-%j.out"), "--open-mode=append", str(script),
        ).stdout.strip()  # fmt: skip

    def _rules(self) -> list[Path]:
        if self.profile == "fast":
            # The stall threshold above a restart's downtime (a requeued job is silent while it starts).
            write(self.workdir / "gen", render(replace(fast(), stall_min_seconds=40)))
            base = self.workdir / "gen/alerts"
        else:
            base = REPO / "alerts"
        return [base / "babysitter-rules.yaml", base / "babysitter-alerts.yaml"]

    def _am_config(self, receiver: str, token: Path) -> dict[str, Any]:
        return {
            "route": {
                "receiver": "remediate",
                "group_by": ["cluster", "instance", "run", "alertname"],
                "group_wait": self.settings["group_wait"],
                "group_interval": self.settings["group_interval"],
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "remediate",
                    "webhook_configs": [
                        {
                            "url": f"http://{receiver}/alerts",
                            "send_resolved": True,
                            "http_config": {
                                "authorization": {"type": "Bearer", "credentials_file": str(token)}
                            },
                        }
                    ],
                }
            ],
        }

    def _policy(self) -> dict[str, Any]:
        return {
            "backend": "slurm",
            "audit_log": str(self.audit),
            "run_dirs": str(self.workdir / "runs" / "{run}"),
            "jobs": {"prometheus_url": self.prom.url},
            "hosts": {"pattern": r"(n\d+)(?::\d+)?"},
            "rails": {
                "rate_limit": {"actions": 20, "window": f"{int(self.settings['rate_window'])}s"},
                "drain_cap": {"fraction": 0.5, "window": "1h"},
            },
            "incidents": {"wait": "10s"},
            "rules": [
                {
                    "name": "xid",
                    "match": {"alertname": "GpuXidCritical"},
                    "actions": ["drain", "requeue"],
                    "reason": "Xid {xid} on GPU {gpu}",
                },
                {
                    "name": "stall",
                    "match": {"alertname": "TrainingStalled"},
                    "actions": ["drain", "requeue"],
                    "hosts_from": "culprit",
                    "reason": "stalled run {run}",
                },
                {
                    "name": "exited",
                    "match": {"alertname": "TrainingProcessExited"},
                    "actions": ["requeue"],
                    "reason": "a rank exited",
                },
            ],
        }

    def __exit__(self, *exc: object) -> None:
        for pid in self._stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._stack.close()

    # ------------------------------------------------------------------ the job

    def _pids(self) -> dict[int, int]:
        out = {}
        for path in (self.run_dir / "pids").glob("rank*"):
            with contextlib.suppress(ValueError, OSError):
                out[int(path.name[4:])] = int(path.read_text().split()[0])
        return out

    def _rank_node(self, rank: int) -> str:
        return (self.run_dir / "pids" / f"rank{rank}").read_text().split()[1]

    def incarnations(self) -> list[dict[str, Any]]:
        """The ledger's incarnations (``babysitter report --json``), empty before the first start."""
        if not (self.run_dir / "babysitter-ledger.jsonl").exists():
            return []
        report = self.report()
        return list(report["incarnation_list"])

    def report(self) -> dict[str, Any]:
        """``babysitter report --json`` of the run."""
        done = subprocess.run(
            [sys.executable, "-m", "babysitter", "report", str(self.run_dir), "--json"],
            capture_output=True,
            timeout=120,
            check=True,
        )
        return dict(json.loads(done.stdout))

    def ready(self, timeout: float) -> None:
        """Until the job's current incarnation trained past a checkpoint saved in it, and both ranks
        wrote their pids."""
        deadline = time.monotonic() + timeout
        while True:
            incs = self.incarnations()
            if incs and len(self._pids()) == 2:
                last = incs[-1]
                first, now = last.get("first_step"), last.get("last_step")
                report = self.report()
                saved = report["checkpoints"]["last_step"]
                if (
                    first is not None
                    and saved is not None
                    and now is not None
                    and saved >= first
                    and now > saved
                ):
                    pids = self._pids()
                    if all(self._alive(pid) for pid in pids.values()):
                        return
            if time.monotonic() > deadline:
                raise AssertionError(f"the job did not train past a checkpoint in {timeout} s: {self.tail()}")
            time.sleep(2)

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def tail(self) -> str:
        """What to look at when something did not happen."""
        parts = [self.slurm.log_tail(800)]
        for name in ("remediate.log",):
            path = self.workdir / name
            if path.exists():
                parts.append(f"{name}: {path.read_text(errors='replace')[-1500:]}")
        outs = sorted(self.workdir.glob("job-*.out"))
        if outs:
            parts.append(f"job: {outs[-1].read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ faults

    def inject(self, fault: str) -> Measured:
        """Inject one fault now; its :class:`Measured` (to :meth:`follow`)."""
        pids = self._pids()
        nodes = {rank: self._rank_node(rank) for rank in pids}
        for path in (self.run_dir / "pids").glob("rank*"):
            path.unlink()  # the next incarnation writes its own
        if fault == "xid":
            node = nodes[0]
            bus = normalize_pci_bus_id(fake_gpus(1)[0].pci_bus_id)  # 0000:18:00, as the driver prints it
            line = f"NVRM: Xid (PCI:{bus}): 79, pid={pids[0]}, name=python3, GPU has fallen off the bus.\n"
            at = time.time()
            with (self.nodes / node / "kmsg.log").open("a") as log:
                log.write(line)
        elif fault in ("hang", "crash"):
            node = nodes[1]
            at = time.time()
            os.kill(pids[1], signal.SIGSTOP if fault == "hang" else signal.SIGKILL)
            if fault == "hang":
                self._stopped.append(pids[1])
        else:
            raise ValueError(f"unknown fault {fault!r} (one of {', '.join(FAULTS)})")
        return Measured(fault, node, at, alert=ALERTS[fault])

    def follow(self, measured: Measured, timeout: float) -> Measured:
        """Wait until the job trains again after the fault; fill in the times from the remediation
        note, the audit log and the ledger."""
        before = len(self.incarnations())
        deadline = time.monotonic() + timeout
        while True:
            report = self.report() if (self.run_dir / "babysitter-ledger.jsonl").exists() else {}
            incs = report.get("incarnation_list", [])
            restarts = report.get("restart_list", [])
            if len(incs) > before and incs[-1].get("first_step") is not None and restarts:
                restart = restarts[-1]
                if restart.get("time_to_recover_seconds") is not None:
                    break
            if time.monotonic() > deadline:
                measured.restart = restarts[-1] if restarts else None
                self._audit_times(measured)
                return measured
            time.sleep(2)
        measured.restart = restart
        note = restart.get("remediation") or {}
        measured.acted = note.get("t")
        measured.alert_start = note.get("alert_start")
        measured.note_resume_step = note.get("resume_step")
        if measured.acted is not None:
            measured.resumed = measured.acted + restart["time_to_recover_seconds"]
        measured.resume_step = incs[-1].get("resumed_from")
        self._audit_times(measured)
        self.last_action = time.time()
        return measured

    def _audit_times(self, measured: Measured) -> None:
        if not self.audit.exists():
            return
        for line in self.audit.read_text().splitlines():
            record = json.loads(line)
            if record["t"] < measured.at or (record.get("alert") or {}).get("name") != measured.alert:
                continue
            if record["event"] == "incident" and measured.bundle is None and record.get("bundles"):
                measured.bundle = record["bundles"][0]
                measured.bundle_at = record["t"]
            elif record["event"] == "action" and record.get("result") == "ok":
                target = record.get("host") if record["action"] == "drain" else record.get("job")
                measured.actions.append(f"{record['action']} {target}")

    def quiet(self, seconds: float) -> None:
        """Let the previous fault's echoes pass (the requeued job's dying ranks page too): the next
        fault's requeue must not fall in the rate window of the last one."""
        wait = self.last_action + seconds - time.time()
        if wait > 0:
            time.sleep(wait)


def run_loop(
    workdir: Path, profile: str = "fast", faults: tuple[str, ...] = ORDER, *, timeout: float = 240.0
) -> tuple[list[Measured], dict[str, Any], Loop]:
    """The whole loop: the stack, the job, each fault followed to the resumed run; the measurements and
    the run's final report. The stack is stopped before it returns."""
    out: list[Measured] = []
    with Loop(workdir, profile) as loop:
        loop.ready(timeout=timeout)
        for fault in faults:
            loop.quiet(float(loop.settings["rate_window"]) + 5)
            loop.ready(timeout=timeout)
            measured = loop.inject(fault)
            out.append(loop.follow(measured, timeout=timeout))
            if measured.resumed is None:
                break
        loop.ready(timeout=timeout)
        report = loop.report()
    return out, report, loop
