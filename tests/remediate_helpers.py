"""Helpers for the remediation tests: Alertmanager payloads, a recording scheduler, a real Slurm cluster.

:class:`SlurmCluster` starts munged, slurmctld and one slurmd per node name (``slurmd -N``) on
loopback, all with configs and state in a temp dir the test owns, and stops every process it started.
Without the Debian packages (``slurm-wlm``, ``munge``) the tests skip, saying so; they never install.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from babysitter.remediate.backends.base import BackendError, Outcome, Step
from proc_helpers import Proc, find, kill_and_wait

__all__ = [
    "FakeJobMap",
    "RecordingBackend",
    "SlurmCluster",
    "alert",
    "payload",
    "require_slurm",
    "rfc3339",
]


def rfc3339(t: float) -> str:
    """Unix seconds as Alertmanager writes them (nanoseconds, Z)."""
    whole = datetime.fromtimestamp(int(t), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{round((t % 1) * 1e9):09d}Z"


def alert(
    name: str,
    *,
    status: str = "firing",
    starts: float = 1_700_000_000.0,
    fingerprint: str | None = None,
    **labels: str,
) -> dict[str, Any]:
    """One alert of a webhook payload."""
    all_labels = {"alertname": name, **labels}
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"summary": f"{name} test"},
        "startsAt": rfc3339(starts),
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else rfc3339(starts + 60),
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint or format(abs(hash(tuple(sorted(all_labels.items())))) % (1 << 60), "x"),
    }


def payload(*alerts: dict[str, Any], group: str = '{}:{alertname="x"}') -> dict[str, Any]:
    """A version-4 webhook payload."""
    firing = any(a["status"] == "firing" for a in alerts)
    return {
        "version": "4",
        "groupKey": group,
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": "remediate",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
        "alerts": list(alerts),
    }


class RecordingBackend:
    """An in-memory scheduler for the rails' property tests: nodes, drains, running jobs, every call."""

    name = "recording"

    def __init__(self, nodes: Sequence[str], jobs: Mapping[str, Sequence[str]] | None = None) -> None:
        self.nodes = list(nodes)
        self.jobs = {host: list(j) for host, j in (jobs or {}).items()}
        self.drained: dict[str, str] = {}
        self.calls: list[tuple[str, str, bool]] = []
        self.fail: set[str] = set()

    def node_count(self) -> int:
        return len(self.nodes)

    def partitions_of(self, host: str) -> list[str] | None:
        return ["gpu"] if host in self.nodes else []

    def is_drained(self, host: str) -> bool | None:
        return host in self.drained

    def jobs_on(self, host: str) -> list[str]:
        return list(self.jobs.get(host, []))

    def running(self, jobs: Sequence[str], host: str | None) -> list[str]:
        live = set(self.jobs.get(host, [])) if host else {j for js in self.jobs.values() for j in js}
        return [j for j in jobs if j in live]

    def namespace_of(self, job: str) -> str | None:
        return None

    def nodes_of(self, jobs: Sequence[str]) -> list[str] | None:
        return sorted(host for host, running in self.jobs.items() if set(running) & set(jobs))

    def _do(self, what: str, target: str, dry_run: bool) -> Outcome:
        self.calls.append((what, target, dry_run))
        ok = what not in self.fail
        return Outcome(
            ok, [Step(f"{what} {target}", ok=None if dry_run else ok)], detail="" if ok else "boom"
        )

    def drain(self, host: str, reason: str, *, dry_run: bool, alert: Any = None) -> Outcome:
        out = self._do("drain", host, dry_run)
        if out.ok and not dry_run:
            self.drained[host] = reason
        return out

    def undrain(self, host: str, prefix: str, *, dry_run: bool, alert: Any = None) -> Outcome:
        if host in self.drained and not self.drained[host].startswith(prefix.strip()):
            return Outcome(False, detail="not ours", refused="not_ours")
        out = self._do("undrain", host, dry_run)
        if out.ok and not dry_run:
            self.drained.pop(host, None)
        return out

    def requeue(self, job: str, reason: str, *, dry_run: bool, alert: Any = None) -> Outcome:
        return self._do("requeue", job, dry_run)

    def annotate_host(self, host: str, text: str, *, dry_run: bool, alert: Any = None) -> Outcome:
        return self._do("annotate", host, dry_run)

    def annotate_job(self, job: str, text: str, *, dry_run: bool, alert: Any = None) -> Outcome:
        return self._do("annotate", job, dry_run)


class FakeJobMap:
    """What a job map in Prometheus would answer: each run's hosts (agent instances) and jobs."""

    def __init__(
        self,
        instances: Mapping[str, Sequence[str]] | None = None,
        jobs: Mapping[str, Sequence[str]] | None = None,
        *,
        error: str | None = None,
    ) -> None:
        self.instances = {run: list(i) for run, i in (instances or {}).items()}
        self.jobs = {run: list(j) for run, j in (jobs or {}).items()}
        self.error = error
        self.asked: list[tuple[str, str, tuple[str, str] | None]] = []

    def jobs_on(self, instance: str, labels: Mapping[str, str] | None = None) -> list[str]:
        return []

    def runs_on(self, instance: str) -> list[str]:
        return []

    def instances_of(self, run: str, cluster: tuple[str, str] | None = None) -> list[str]:
        self.asked.append(("instances_of", run, cluster))
        if self.error:
            raise BackendError(self.error)
        return list(self.instances.get(run, []))

    def jobs_of(self, run: str, cluster: tuple[str, str] | None = None) -> list[str]:
        self.asked.append(("jobs_of", run, cluster))
        return list(self.jobs.get(run, []))


# ------------------------------------------------------------------------------------------ Slurm

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "scontrol", "sinfo", "squeue", "sbatch", "scancel")


def require_slurm() -> None:
    """Skip, saying what to install, when Slurm or munge is missing (CI installs them; tests never do)."""
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("a test Slurm cluster runs slurmd as root (SlurmdUser=root); run as root")


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SlurmCluster:
    """munged + slurmctld + one slurmd per node on loopback; ``env`` points Slurm's commands at it.

    ``weights`` orders where the scheduler places jobs (lower first), so a test knows which node a job
    lands on and where its requeued copy goes once that node is drained.
    """

    def __init__(
        self,
        workdir: Path,
        nodes: Sequence[str] = ("n1", "n2", "n3", "n4"),
        *,
        weights: Mapping[str, int] | None = None,
        prolog: str | None = None,
        epilog: str | None = None,
    ) -> None:
        require_slurm()
        self.workdir = workdir
        self.nodes = list(nodes)
        self.weights = dict(weights or {})
        self.conf = workdir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: list[int] = []
        self._prolog = prolog
        self._epilog = epilog

    def _write(self) -> None:
        w = self.workdir
        munge = w / "munge"
        munge.mkdir(mode=0o700, parents=True)
        os.chmod(munge, 0o711)  # noqa: S103 - the socket must be reachable; the key stays 0400
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for sub in ("state", "log", *(f"spool/{n}" for n in self.nodes)):
            (w / sub).mkdir(parents=True, exist_ok=True)
        ctl, slurmd = _free_port(), _free_port()
        lines = [
            "ClusterName=babysitter",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctl}",
            f"SlurmdPort={slurmd}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: a requeued job waits this long (+1 s) before it may start again (default 120 s).
            f"AuthInfo=socket={munge}/munge.socket,cred_expire=5",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={w}/spool/%n",
            f"SlurmctldPidFile={w}/slurmctld.pid",
            f"SlurmdPidFile={w}/slurmd-%n.pid",
            f"SlurmctldLogFile={w}/log/slurmctld.log",
            f"SlurmdLogFile={w}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "JobRequeue=1",
            "MailProg=/bin/true",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
        ]
        if self._prolog:
            lines.append(f"Prolog={self._prolog}")
        if self._epilog:
            lines.append(f"Epilog={self._epilog}")
        host = os.uname().nodename
        for node in self.nodes:
            port = _free_port()
            weight = self.weights.get(node, 1)
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 "
                f"RealMemory=1000 Weight={weight} State=UNKNOWN"
            )
        lines.append(f"PartitionName=gpu Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _start(self, argv: list[str]) -> None:
        subprocess.run(argv, env=self.env, check=True, timeout=30, capture_output=True)

    def __enter__(self) -> SlurmCluster:
        try:
            self._write()
            w = self.workdir
            munge = w / "munge"
            self._start(
                [
                    _binary("munged"),
                    f"--socket={munge}/munge.socket",
                    f"--key-file={munge}/munge.key",
                    f"--pid-file={munge}/munged.pid",
                    f"--log-file={w}/log/munged.log",
                    f"--seed-file={munge}/munged.seed",
                    "--force",
                ]
            )
            self._start([_binary("slurmctld"), "-f", str(self.conf), "-i"])
            for node in self.nodes:
                self._start([_binary("slurmd"), "-f", str(self.conf), "-N", node])
            self.wait_idle()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until every node answers (state idle)."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            if states and all(s.startswith("idle") and not s.endswith("*") for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"Slurm nodes not idle after {timeout} s: {states}; {self.log_tail()}")
            time.sleep(0.5)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=30, check=check
        )

    def states(self) -> dict[str, str]:
        """Node -> state as sinfo prints it (``idle``, ``drained``, ``mixed*``...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def reason(self, node: str) -> str:
        """The node's drain reason (``none`` when it has none)."""
        return self.run("sinfo", "-h", "-N", "-n", node, "-o", "%E").stdout.strip()

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` fields (empty when Slurm forgot the job)."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def log_tail(self, chars: int = 1500) -> str:
        """The end of slurmctld's log."""
        path = self.workdir / "log/slurmctld.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _leftovers(self, name: str | None = None) -> list[Proc]:
        """This cluster's processes (daemons, job steps, jobs: all inherit its SLURM_CONF)."""
        procs = find({"SLURM_CONF": str(self.conf)})
        return [p for p in procs if name is None or p.name == name]

    def __exit__(self, *exc: object) -> None:
        """Cancel every job and wait for its steps to end while the daemons can still hear of it,
        stop the daemons, then SIGKILL whatever of the cluster is left and wait until it is gone.

        A slurmstepd whose job ended after slurmd, slurmctld and munged stopped retries its
        job-complete message forever, ignoring SIGTERM, its parent gone: it outlived the suite by
        13 minutes (issue 32) when the daemons were stopped right after an asynchronous scancel.
        """
        if self.conf.exists():
            subprocess.run(
                ["scancel", "--full", "-u", "root"],
                env=self.env,
                capture_output=True,
                timeout=30,
                check=False,
            )
            deadline = time.monotonic() + 20
            while self._leftovers("slurmstepd") and time.monotonic() < deadline:
                time.sleep(0.2)
        w = self.workdir
        pidfiles = [*(w / f"slurmd-{n}.pid" for n in self.nodes), w / "slurmctld.pid", w / "munge/munged.pid"]
        pids = []
        for pidfile in pidfiles:
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                with _suppress():
                    os.kill(pid, signal.SIGKILL)
        left = kill_and_wait(self._leftovers(), {"SLURM_CONF": str(self.conf)})
        assert not left, f"Slurm processes survived SIGKILL: {[str(p) for p in left]}"


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
