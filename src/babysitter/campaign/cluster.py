"""The simulated cluster a campaign runs on, and the monitoring watching it, all real processes.

* ``hosts`` node agents, host ``h`` bound to its own loopback address ``127.0.0.<h+2>`` (so every
  page names a distinct host), each with its simulated GPUs (``--simulate-host``: their own UUIDs;
  their faults in a scenario file anchored at the campaign's start, so an agent restarted mid-way
  finds its GPUs as they are), its own fake sysfs tree (:class:`babysitter.node.fabric.fake.FakeSysfs`:
  an HGX-like host with a NIC per GPU, two memory controllers), its own registration directory and
  Slurm-style job map; host 0's agent also runs the checkpoint sentinel and the storage probe over
  the run directory.
* The job: ``torchrun`` with one rank per host (:mod:`babysitter.campaign.rank`), each registered with
  its host's agent and claiming its host's GPU.
* Prometheus with the rules (generated for the profile, or the user's), scraping the agents with the
  job of ``exporters/prometheus-scrape.yml`` and itself and Alertmanager with its ``prometheus`` and
  ``alertmanager`` jobs (at the profile's interval).
* Alertmanager with the routing (``exporters/alertmanager.yml``, or the user's), every receiver
  pointed at the campaign's webhook (:class:`babysitter.demo.pager.PagerServer`), the waits the
  profile's (the fast profile: the demo's), and the alerts a remediation policy acts on also to
  ``babysitter remediate --dry-run`` (the example policy, or the user's).

Processes are started and stopped with :class:`babysitter.demo.stack.Stack` (own session, parent-death
signal, SIGTERM then SIGKILL): nothing outlives the campaign.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from babysitter.campaign.schedule import Schedule, Shape, Timing
from babysitter.demo.pager import Page, PagerServer
from babysitter.demo.remediation import AuditTail, start_dry_run, write_job_map
from babysitter.demo.routing import demo_alertmanager_config, load_routing, shipped_routing
from babysitter.demo.stack import Stack, StackError, find_binaries, wait_ready, write_json
from babysitter.generate.config import GenerateConfig, parse_duration

__all__ = [
    "CLUSTER",
    "JOB_ID",
    "RUN",
    "Cluster",
    "ClusterOptions",
    "SimHost",
    "campaign_config",
    "pace_policy",
]

CLUSTER = "campaign"
RUN = "campaign"
#: The Slurm job id the campaign's job stands for (the node agents' job maps).
JOB_ID = "4242"
#: How many checkpoints the job keeps; the sentinel verifies as many (a corrupt one pages until the job
#: deletes it: with the default 3 and the fast profile's save every 15 s, it aged out of the sentinel's
#: view within 30 s, in the middle of the fault).
KEEP = 5
_REPO = Path(__file__).resolve().parents[3]


def campaign_config(profile: str) -> GenerateConfig:
    """The rules a campaign generates: ``fast`` or the shipped ``default``. The fast profile's slow-save
    alert fires at a 6 s mean save over a minute (a CPU job's saves take milliseconds; its production
    threshold is a 10-minute mean). Its goodput warning waits for 75 s of a run's wall time, an eighth
    of its 10-minute window as the shipped 3 h are of 24 h (the demo's 30 s warned about the start
    of the seed-1 campaign)."""
    from babysitter.generate.config import fast

    if profile == "fast":
        return replace(
            fast(),
            checkpoint_save_slow_seconds=6.0,
            checkpoint_slow_window="1m",
            goodput_min_wall_seconds=75,
        )
    if profile == "default":
        return GenerateConfig()
    raise ValueError(f"profile is fast or default, got {profile!r}")


@dataclass
class ClusterOptions:
    """What to run the campaign on (the defaults: the shipped routing and the example policy)."""

    workdir: Path
    profile: str = "fast"
    shape: Shape = field(default_factory=Shape)
    #: Rule files to load instead of the ones generated for the profile (a user's own rules).
    rules: tuple[Path, ...] = ()
    #: An Alertmanager configuration to route with instead of exporters/alertmanager.yml.
    routing: Path | None = None
    #: A ``babysitter remediate`` policy instead of exporters/remediate-policy.example.yaml.
    policy: Path | None = None
    prometheus_bin: str | None = None
    alertmanager_bin: str | None = None


@dataclass
class SimHost:
    """One simulated host."""

    index: int
    ip: str
    port: int
    home: Path
    sysfs: Any = None
    layout: Any = None

    @property
    def address(self) -> str:
        """Its node agent's HOST:PORT, Prometheus's ``instance``."""
        return f"{self.ip}:{self.port}"

    @property
    def registry(self) -> Path:
        """Where its trainers register."""
        return self.home / "registry"


def _port_on(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def pace_policy(policy: dict[str, Any], scale: float) -> None:
    """A remediate policy's waits (each rule's ``firing_for``) at a profile's pace, in place: at the
    fast profile, where a GPU down for 1m pages after 5 s, a stall rule's 2 minutes are 10 s
    (:attr:`Timing.policy_scale`)."""
    if scale == 1:
        return
    for rule in policy.get("rules") or ():
        if isinstance(rule, dict) and rule.get("firing_for") is not None:
            seconds = parse_duration(str(rule["firing_for"])) * scale
            rule["firing_for"] = f"{max(round(seconds), 1)}s"


class Cluster:
    """Starts, drives and stops the simulated cluster and its monitoring (see the module docstring)."""

    def __init__(self, options: ClusterOptions, timing: Timing, schedule: Schedule, t0: float) -> None:
        self.o = options
        self.timing = timing
        self.schedule = schedule
        self.t0 = t0
        self.cfg = campaign_config(options.profile)
        self.workdir = options.workdir
        self.stack = Stack(self.workdir, grace=15.0)
        self.binaries = find_binaries(options.prometheus_bin, options.alertmanager_bin)
        missing = self.binaries.missing()
        if missing:
            raise StackError(
                f"missing {' and '.join(missing)}: sudo apt-get install prometheus prometheus-alertmanager"
            )
        self.run_dir = self.workdir / "run"
        self.ctl = self.workdir / "ctl"
        self.hosts: list[SimHost] = []
        self.pager: PagerServer | None = None
        self.prometheus_url = ""
        self.alertmanager_address = ""
        self.audit: AuditTail | None = None
        self.job_starts = 0
        self._am_argv: list[str] = []
        self._prom_argv: list[str] = []

    # ------------------------------------------------------------------------------------ start

    def start(self, on_page: Any) -> None:
        """Everything: the hosts' trees, the job (its ranks take longest to start: torch's import), the
        pager, the remediator (Prometheus's URL is its), Alertmanager, the agents, then Prometheus,
        pointed at all of them."""
        for folder in (self.run_dir, self.ctl):
            folder.mkdir(parents=True, exist_ok=True)
        self._build_hosts()
        self.start_job()
        rules = self._rules()
        self.pager = PagerServer(on_page).start()
        prom_port = _port_on("127.0.0.1")
        self.prometheus_url = f"http://127.0.0.1:{prom_port}"
        remediate_url, token = self._start_remediator()
        am_port = _port_on("127.0.0.1")
        self.alertmanager_address = f"127.0.0.1:{am_port}"
        self._write_alertmanager(remediate_url, token)
        self.start_alertmanager()
        for host in self.hosts:
            self.start_agent(host.index)
        self._write_prometheus(rules, prom_port)
        self.start_prometheus()

    def _build_hosts(self) -> None:
        from babysitter.node.fabric.fake import FakeSysfs
        from babysitter.node.gpu.fake import fake_gpus

        shape = self.o.shape
        scenarios = self._gpu_scenarios()
        for index in range(shape.hosts):
            ip = f"127.0.0.{index + 2}"
            home = self.workdir / f"host{index}"
            (home / "registry").mkdir(parents=True, exist_ok=True)
            uuids = tuple(g.uuid for g in fake_gpus(shape.gpus, host=index + 1))
            fs = FakeSysfs(home / "sys", home / "proc")
            layout = fs.dgx(shape.gpus, uuids=uuids, memory_controllers=2, packages=1, cores=1)
            write_job_map(home / "gpu-jobs", shape.gpus, JOB_ID)
            write_json(home / "scenario.json", {"epoch": self.t0, "events": scenarios.get(index, [])})
            self.hosts.append(SimHost(index, ip, _port_on(ip), home, fs, layout))

    def _gpu_scenarios(self) -> dict[int, list[dict[str, Any]]]:
        """The simulator's events of every GPU fault, per host: the fault at its time, the cure at its end."""
        out: dict[int, list[dict[str, Any]]] = {}
        for f in self.schedule.faults:
            host, gpu = f.culprit.get("host"), f.culprit.get("gpu")
            if host is None or gpu is None:
                continue
            events: list[dict[str, Any]] = []
            if f.kind == "xid79":
                events = [{"event": "xid79"}]
            elif f.kind == "xid48":
                events = [{"event": "xid48"}]
            elif f.kind == "xid119":
                events = [{"event": "xid", "xid": 119}]
            elif f.kind == "nvlink":
                events = [
                    {"event": "xid", "xid": 74},
                    {"event": "nvlink", "link": 2, "type": "crc_flit", "count": 40},
                ]
            elif f.kind == "row_remap_failure":
                events = [{"event": "xid", "xid": 64}, {"event": "remap", "state": "failure"}]
            elif f.kind == "throttle":
                events = [{"event": "throttle", "reasons": ["hw_slowdown"]}]
            if not events:
                continue
            cure = "clear_throttle" if f.kind == "throttle" else "replace"
            at = out.setdefault(host, [])
            at += [{"at": f.at, "gpu": gpu, **event} for event in events]
            at.append({"at": f.end, "gpu": gpu, "event": cure})
        return out

    def _rules(self) -> list[Path]:
        if self.o.rules:
            return [p.resolve() for p in self.o.rules]
        from babysitter.generate.writer import ALERT_RULES, RECORDING_RULES, render

        files = render(self.cfg)
        folder = self.workdir / "rules"
        folder.mkdir(exist_ok=True)
        out = []
        for rel in (RECORDING_RULES, ALERT_RULES):
            path = folder / Path(rel).name
            path.write_text(files[rel])
            out.append(path)
        return out

    def _scrape_jobs(self) -> list[dict[str, Any]]:
        """exporters/prometheus-scrape.yml's jobs: the node job over every host, Prometheus and
        Alertmanager themselves; the profile's interval (fast: every second)."""
        import yaml

        shipped = yaml.safe_load((_REPO / "exporters/prometheus-scrape.yml").read_text())["scrape_configs"]
        jobs = {job["job_name"]: copy.deepcopy(job) for job in shipped}
        targets = {
            "babysitter-node": [h.address for h in self.hosts],
            "prometheus": [self.prometheus_url.split("//")[1]],
            "alertmanager": [self.alertmanager_address],
        }
        out = []
        for name, found in targets.items():
            job = jobs.get(name, {"job_name": name})
            job["static_configs"] = [{"targets": found, "labels": {"cluster": CLUSTER}}]
            if self.timing.profile == "fast":
                job["scrape_interval"] = job["scrape_timeout"] = f"{self.timing.scrape:g}s"
            out.append(job)
        return out

    def _write_prometheus(self, rules: Sequence[Path], port: int) -> None:
        config: dict[str, Any] = {
            "global": {"scrape_interval": f"{self.timing.scrape:g}s"},
            "scrape_configs": self._scrape_jobs(),
            "rule_files": [str(p) for p in rules],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [self.alertmanager_address]}]}]},
        }
        if self.timing.profile == "fast":
            config["global"].update(scrape_timeout="1s", evaluation_interval="1s")
        # default: no evaluation_interval, as the shipped scrape config (Prometheus's 1 m; the paging
        # groups carry their own 15 s).
        folder = self.workdir / "prometheus"
        folder.mkdir(exist_ok=True)
        path = write_json(folder / "prometheus.yml", config)
        binary = self.binaries.prometheus
        assert binary is not None
        flags = (
            [f"--rules.alert.resend-delay={max(self.timing.evaluation, 1):g}s"]
            if self.timing.profile == "fast"
            else []
        )
        self._prom_argv = [
            binary,
            f"--config.file={path}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
            *flags,
        ]

    def start_prometheus(self) -> None:
        """Start (or start again, on its data) Prometheus."""
        proc = self.stack.start("prometheus", self._prom_argv)
        wait_ready(
            f"{self.prometheus_url}/-/ready",
            proc,
            timeout=90,
            what="prometheus",
            log_path=self.stack.log_path("prometheus"),
        )

    def stop_prometheus(self) -> None:
        """Stop Prometheus (SIGTERM: it flushes its head; its ``for:`` state is restored at start)."""
        self.stack.stop("prometheus", grace=30)

    def _write_alertmanager(self, remediate_url: str, token: Path) -> None:
        assert self.pager is not None
        path = self.o.routing or shipped_routing()
        if path is None:
            raise StackError("no Alertmanager routing: pass --alertmanager-config FILE")
        routing = load_routing(path)
        config = demo_alertmanager_config(
            routing,
            self.pager.url_for,
            remediate_url,
            remediate_token=token,
            shorten=self.timing.profile == "fast",
            remediated=self._remediated(),
        )
        # The heartbeat's route: the profile's repeat interval (fast: every 5 s).
        for route in config["route"].get("routes") or ():
            if any("Watchdog" in str(m) for m in route.get("matchers") or ()):
                route["repeat_interval"] = f"{self.timing.heartbeat:g}s"
                if self.timing.profile == "fast":
                    route["group_interval"] = "1s"
        folder = self.workdir / "alertmanager"
        folder.mkdir(exist_ok=True)
        path = write_json(folder / "alertmanager.yml", config)
        binary = self.binaries.alertmanager
        assert binary is not None
        self._am_argv = [
            binary,
            f"--config.file={path}",
            f"--storage.path={folder / 'data'}",
            f"--web.listen-address={self.alertmanager_address}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]

    def start_alertmanager(self) -> None:
        """Start (or start again, on its data: its notification log) Alertmanager."""
        proc = self.stack.start("alertmanager", self._am_argv)
        wait_ready(
            f"http://{self.alertmanager_address}/-/ready",
            proc,
            timeout=60,
            what="alertmanager",
            log_path=self.stack.log_path("alertmanager"),
        )

    def kill_alertmanager(self) -> None:
        """Alertmanager gone (SIGKILL): unreachable for Prometheus."""
        self.stack.signal("alertmanager", signal.SIGKILL)
        self.stack.stop("alertmanager", grace=5)

    def _policy(self) -> dict[str, Any]:
        import yaml

        path = self.o.policy or _REPO / "exporters/remediate-policy.example.yaml"
        policy: dict[str, Any] = yaml.safe_load(path.read_text())
        folder = self.workdir / "remediate"
        policy.update(
            dry_run=True,
            backend="slurm",
            cluster=CLUSTER,
            audit_log=str(folder / "audit.jsonl"),
            run_dirs=str(self.run_dir.parent / "{run}"),
        )
        policy["hosts"] = {"label": "instance", "pattern": r"([^:]+):\d+"}
        policy["jobs"] = {"prometheus_url": self.prometheus_url, "timeout": "5s", "ask_scheduler": False}
        policy.pop("allow", None)
        pace_policy(policy, self.timing.policy_scale)
        # The example's rails are for a real cluster (5% of its nodes an hour): three simulated hosts
        # with a fault every few minutes would hit them at the second fault. Widened, so the campaign
        # grades the rules' choices; the rails have tests of their own. The rate window is also how
        # long a requeued job is not requeued again for another alert (its dying ranks page too): the
        # settle time, shorter than the gap to the next fault (its clearing, the settle time and a
        # quiet stretch), so each fault's requeue is its own (an hour let the seed-1 run requeue once).
        policy["rails"] = {
            "rate_limit": {"actions": 1000, "window": f"{max(int(self.timing.settle), 1)}s"},
            "drain_cap": {
                "fraction": 0.99,
                "window": "1h",
                "min_nodes": len(self.hosts),
                "cluster_nodes": len(self.hosts),
            },
        }
        return policy

    def _remediated(self) -> str:
        """The alertnames the policy's rules match, for the route to the remediator."""
        names: set[str] = set()
        for rule in self._policy().get("rules") or ():
            alert = (rule.get("match") or {}).get("alertname")
            if isinstance(alert, str):
                names.update(alert.split("|"))
        return f'alertname=~"{"|".join(sorted(names)) or "none"}"'

    def _start_remediator(self) -> tuple[str, Path]:
        folder = self.workdir / "remediate"
        proc, token, port_file = start_dry_run(self.stack, folder, self._policy())
        address = self._address("remediate", proc, port_file)
        self.audit = AuditTail(folder / "audit.jsonl")
        return f"http://{address}/alerts", token

    def _address(self, name: str, proc: Any, port_file: Path, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None:
                raise StackError(f"{name} exited: {self.stack.log_path(name).read_text()[-1500:]}")
            if time.monotonic() > deadline:
                raise StackError(f"{name} did not start in {timeout:g} s")
            time.sleep(0.2)
        return port_file.read_text().strip()

    # ------------------------------------------------------------------------------------ agents

    def agent_argv(self, host: SimHost) -> list[str]:
        """The node agent of ``host``: fast, the demo's deadlines nested in the 1 s scrape; default,
        the agent's own defaults."""
        t, shape = self.timing, self.o.shape
        argv = [
            sys.executable, "-m", "babysitter", "node-agent",
            "--listen-address", host.address,
            "--port-file", str(host.home / "agent.addr"),
            "--simulate", str(shape.gpus),
            "--simulate-host", str(host.index + 1),
            "--scenario", str(host.home / "scenario.json"),
            "--simulate-kernel-log", str(host.home / "kern.log"),
            "--registry-dir", str(host.registry),
            "--gpu-job-dir", str(host.home / "gpu-jobs"),
            "--path.sysfs", str(host.sysfs.root),
            "--path.procfs", str(host.sysfs.proc),
        ]  # fmt: skip
        if host.index == 0:  # the run directory's host: the sentinel and the storage probe
            argv += ["--checkpoint-run-dir", str(self.run_dir), "--storage-path", str(self.run_dir)]
            argv += ["--checkpoint-keep-last", str(KEEP)]
        if t.profile == "fast":
            argv += [
                "--trainer-timeout",
                "0.5",
                "--collector-timeout",
                "0.8",
                "--fabric-rescan-interval",
                "5",
            ]
            argv += ["--storage-interval", f"{t.agent_pass:g}", "--checkpoint-interval", f"{t.agent_pass:g}"]
            # A verified checkpoint read again every 10 s (default 6 h): bytes flipped after its first
            # sweep are found within a fast campaign's fault.
            argv += ["--checkpoint-reverify-interval", "10"]
        return argv

    def start_agent(self, index: int) -> None:
        """Start host ``index``'s node agent (again: same address, same scenario)."""
        host = self.hosts[index]
        with contextlib.suppress(FileNotFoundError):
            (host.home / "agent.addr").unlink()
        proc = self.stack.start(f"agent{index}", self.agent_argv(host))
        self._address(f"agent{index}", proc, host.home / "agent.addr")

    def kill_agent(self, index: int) -> None:
        """SIGKILL host ``index``'s node agent."""
        self.stack.signal(f"agent{index}", signal.SIGKILL)
        self.stack.stop(f"agent{index}", grace=5)

    # ------------------------------------------------------------------------------------ the job

    def job_file(self) -> Path:
        shape, t = self.o.shape, self.timing
        data = {
            "run": RUN,
            "cluster": CLUSTER,
            "run_dir": str(self.run_dir),
            "ctl_dir": str(self.ctl),
            "registries": [str(h.registry) for h in self.hosts],
            "hosts_of_rank": list(range(shape.ranks)),
            "gpu_of_rank": [shape.rank_gpu] * shape.ranks,
            "host_ids": [h.index + 1 for h in self.hosts],
            "step_seconds": t.step_seconds,
            "jitter": t.jitter,
            "checkpoint_every": t.checkpoint_every,
            "keep": KEEP,
            "straggler_every": 5,
            "replica_check_every": 20,
            "hang_floor": 300.0 if t.profile == "default" else 5.0,
            "mfu_window": 20.0 if t.profile == "fast" else 60.0,
            "seed": self.schedule.seed,
        }
        return write_json(self.workdir / "job.json", data)

    def start_job(self) -> None:
        """``torchrun`` with one rank per host (a fresh start or a restart: it resumes)."""
        for name in ("job.json", *(f"rank{r}.json" for r in range(self.o.shape.ranks))):
            with contextlib.suppress(FileNotFoundError):
                (self.ctl / name).unlink()
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(self.o.shape.ranks), "--max-restarts", "0",
            "-m", "babysitter.campaign.rank", str(self.job_file()),
        ]  # fmt: skip
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "500", "OMP_NUM_THREADS": "1"}
        self.stack.start("job", argv, env=env)
        self.job_starts += 1

    def job_running(self) -> bool:
        """Whether torchrun runs."""
        return self.stack.alive("job")

    def stop_job(self) -> None:
        """Stop the whole job (SIGTERM: torchrun stops its ranks, which close their trackers); a rank
        left behind (its own session, outside torchrun's group) is killed."""
        ranks = self.rank_pids()
        self.stack.stop("job", grace=30)
        for pid in ranks.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)

    def rank_pids(self) -> dict[int, int]:
        """The ranks' pids: torchrun's children running the rank module (each in its own session)."""
        proc = self.stack.procs.get("job")
        if proc is None or proc.poll() is not None:
            return {}
        found: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent != proc.pid or b"babysitter.campaign.rank" not in (entry / "cmdline").read_bytes():
                    continue
                env = (entry / "environ").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            for item in env:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry.name)
        return found

    def signal_rank(self, rank: int, sig: int) -> bool:
        """Send ``sig`` to rank ``rank``; False when it does not run."""
        pid = self.rank_pids().get(rank)
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            return True
        return False

    def set_rank(self, rank: int, **settings: Any) -> None:
        """Rank ``rank``'s control file (:class:`babysitter.campaign.rank.Control`)."""
        path = self.ctl / f"rank{rank}.json"
        current: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            current = json.loads(path.read_text())
        current.update(settings)
        write_json(path, current)

    def job_step(self) -> int | None:
        """Rank 0's global step, as it last wrote it (None before it did)."""
        try:
            return int(json.loads((self.ctl / "status.json").read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def add_job_action(self, key: str, value: Any) -> None:
        """Append to (or set) an action of ``job.json`` every rank takes at a global step."""
        path = self.ctl / "job.json"
        current: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            current = json.loads(path.read_text())
        if key == "stop_at":
            current[key] = value
        else:
            current.setdefault(key, []).append(value)
        write_json(path, current)

    # ------------------------------------------------------------------------------------ checkpoints

    def newest_checkpoint(self) -> Path | None:
        """The newest checkpoint file rank 0 saved."""
        found = sorted((self.run_dir / "checkpoints").glob("step-*.pt"))
        return found[-1] if found else None

    # ------------------------------------------------------------------------------------ reading

    def pages(self) -> list[Page]:
        """Every notification's alerts so far."""
        return self.pager.snapshot() if self.pager is not None else []

    def remediations(self) -> list[dict[str, Any]]:
        """The remediator's new audit records."""
        return self.audit.new_records() if self.audit is not None else []

    def processes(self) -> Iterable[str]:
        """The names of the processes the stack runs."""
        return [name for name in self.stack.procs if self.stack.alive(name)]

    def close(self) -> None:
        """Stop everything, the job first."""
        with contextlib.suppress(Exception):
            self.stop_job()
        self.stack.close()
        if self.pager is not None:
            self.pager.close()

    def logs(self) -> Mapping[str, Path]:
        """Each process's log file."""
        return {name: self.stack.log_path(name) for name in self.stack.procs}

    def cleanup(self) -> None:
        """Remove the work directory (after :meth:`close`)."""
        shutil.rmtree(self.workdir, ignore_errors=True)
