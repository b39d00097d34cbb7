"""Play a schedule on a running cluster: each fault at its time, cleared at its end; the noise; a job
that dies is started again, as a scheduler would. Then grade what arrived
(:mod:`babysitter.campaign.score`).

How each fault is played (the GPU ones are in the node agents' scenario files already, timed from the
campaign's start; here only what they do to the job):

==================  ==================================================================================
xid79, xid48,       the simulator raises the Xid (and loses the GPU, counts the ECC error, ...); the
xid119, nvlink      rank on that GPU is killed (SIGKILL: the driver takes the process down), the job
                    with it; at the end the GPU is replaced and the job started again (a requeue)
row_remap_failure   Xid 64 and a failed row remap; the GPU is replaced at the end
throttle            the GPU reports HW slowdown; the rank on it computes 1/0.7 as long (its clock)
aer_fatal           the GPU's ``aer_dev_fatal`` counts one fatal error
pcie_downtrained    the NIC's link trains at x8 of x16; back to x16 at the end
ib_flapping         ``link_downed`` grows three times, a scrape apart; carrier changes twice as often
ib_down             the port goes DOWN/Disabled (``link_downed`` +1), the rank on that host dies with its
                    connections (a port down past the transport timeout); ACTIVE again at the end
symbol_errors       170 symbol errors within a minute (the budget: 120 an hour)
edac_ue             one uncorrectable error on a memory controller
straggler           one rank computes 1.5x as long
hang                one rank is stopped (SIGSTOP); SIGCONT at the end
crash               one rank is killed (SIGKILL); the job is started again after the scheduler's delay
slow_input          every batch waits two step times in the loader
slow_storage        every save of rank 0 blocks 10 s longer (fast profile: the slow-save threshold is 6 s)
ckpt_deleted        the newest checkpoint is deleted; restored at the end
ckpt_corrupt        64 bytes of the newest checkpoint flipped, its size unchanged; restored at the end
nan                 one rank's loss is NaN for a few steps
diverged            one rank's parameters are perturbed once; the job rolls back at the end (a clean
                    restart from the last checkpoint, which rank 0's replica saved)
agent_killed        one host's node agent is killed (SIGKILL); started again at the end
alertmanager_down   Alertmanager is killed (SIGKILL); started again on its data at the end
prometheus_down     Prometheus is stopped; started again on its data at the end
==================  ==================================================================================
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.campaign.cluster import Cluster, ClusterOptions
from babysitter.campaign.faults import kind
from babysitter.campaign.schedule import Fault, Noise, Schedule, Timing
from babysitter.campaign.score import Score, score
from babysitter.demo.pager import Page
from babysitter.generate.config import parse_duration

__all__ = ["Outcome", "play"]

log = logging.getLogger(__name__)

#: Faults that take the job down with them (the process on the GPU or port dies).
_SLOW_FACTOR = 1 / 0.7


@dataclass
class Outcome:
    """What a campaign played and what it got."""

    schedule: Schedule
    t0: float
    score: Score
    pages: list[Page]
    remediations: list[dict[str, Any]]
    culprits: dict[int, dict[str, Any]]
    #: Job starts (the first included) and exits nobody planned.
    job_starts: int = 0
    unplanned_exits: list[float] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    workdir: Path | None = None


class _Player:
    def __init__(
        self, cluster: Cluster, schedule: Schedule, timing: Timing, t0: float, say: Callable[[str], None]
    ) -> None:
        self.c = cluster
        self.s = schedule
        self.t = timing
        self.t0 = t0
        self.say = say
        self.culprits: dict[int, dict[str, Any]] = {}
        self.records: list[dict[str, Any]] = []
        self.events: list[tuple[float, str]] = []
        self.unplanned: list[float] = []
        #: The job is down on purpose until this time (an interrupting fault, a planned restart).
        self.down_until: float | None = None
        self.job_exited_at: float | None = None
        self.restart_pending = False
        self._backup: dict[int, tuple[Path, Path]] = {}

    def now(self) -> float:
        return time.time() - self.t0

    def note(self, text: str) -> None:
        self.events.append((round(self.now(), 1), text))
        self.say(f"[+{self.now():7.1f}s] {text}")

    # ------------------------------------------------------------------ culprits as the pages spell them

    def resolve(self, index: int, f: Fault) -> dict[str, Any]:
        out = dict(f.culprit)
        host = f.culprit.get("host")
        if host is not None:
            sim = self.c.hosts[int(host)]
            out["host"] = sim.address
            if "gpu" in f.culprit:
                out["gpu"] = str(f.culprit["gpu"])
                out["pci_address"] = sim.layout.gpus[int(f.culprit["gpu"])]
            if "nic" in f.culprit:
                out["pci_address"] = sim.layout.nics[int(f.culprit["nic"])]
        if "rank" in out:
            out["rank"] = str(out["rank"])
        self.culprits[index] = out
        return out

    # ------------------------------------------------------------------ faults

    def start(self, index: int, f: Fault) -> None:
        culprit = self.resolve(index, f)
        k = kind(f.kind)
        self.note(f"FAULT {k.title} {_where(culprit)}")
        host = self.c.hosts[int(f.culprit["host"])] if "host" in f.culprit else None
        rank = int(f.culprit.get("rank", f.culprit.get("host", 0)))
        if k.interrupts:
            self.interrupt(rank, until=f.end if f.kind != "crash" else f.at + self.t.restart_delay)
        if f.kind == "throttle":
            self.c.set_rank(rank, slow=_SLOW_FACTOR)
        elif f.kind == "aer_fatal" and host is not None:
            host.sysfs.aer(culprit["pci_address"], "fatal", 1)
        elif f.kind == "pcie_downtrained" and host is not None:
            host.sysfs.link(culprit["pci_address"], width=8)
        elif f.kind == "ib_flapping" and host is not None:
            self._flap(host, culprit, 1)
        elif f.kind == "ib_down" and host is not None:
            host.sysfs.port_state(culprit["device"], "1: DOWN", "3: Disabled")
            self._bump(host, culprit["device"], "link_downed", 1)
        elif f.kind == "symbol_errors" and host is not None:
            self._bump(host, culprit["device"], "symbol_error", 60)
        elif f.kind == "edac_ue" and host is not None:
            host.sysfs.edac(int(culprit["controller"]), ue=1)
        elif f.kind == "straggler":
            self.c.set_rank(rank, slow=1.5)
        elif f.kind == "hang":
            if not self.c.signal_rank(rank, signal.SIGSTOP):
                self.note(f"rank {rank} does not run: the hang was not played")
        elif f.kind == "slow_input":
            for r in range(self.s.shape.ranks):
                self.c.set_rank(r, data_wait=2 * self.t.step_seconds)
        elif f.kind == "slow_storage":
            self.c.set_rank(0, save_extra=10.0)
        elif f.kind in ("ckpt_deleted", "ckpt_corrupt"):
            self._damage(index, f.kind, culprit)
        elif f.kind == "nan":
            self.c.set_rank(rank, nan=True)
        elif f.kind == "diverged":
            self.c.set_rank(rank, diverge=1)
        elif f.kind == "agent_killed" and host is not None:
            self.c.kill_agent(host.index)
        elif f.kind == "alertmanager_down":
            self.c.kill_alertmanager()
        elif f.kind == "prometheus_down":
            self.c.stop_prometheus()

    def tick(self, index: int, f: Fault, elapsed: float) -> None:
        """What a fault does while it lasts (once a second)."""
        culprit = self.culprits[index]
        host = self.c.hosts[int(f.culprit["host"])] if "host" in f.culprit else None
        gap = max(3.0, self.t.scrape)
        if f.kind == "ib_flapping" and host is not None:
            for n in (2, 3):
                if (n - 1) * gap <= elapsed < (n - 1) * gap + 1.0:
                    self._flap(host, culprit, n)
        elif f.kind == "symbol_errors" and host is not None:
            for n in (1, 2):
                if n * gap <= elapsed < n * gap + 1.0:
                    self._bump(host, culprit["device"], "symbol_error", 55)
        elif f.kind == "nan" and elapsed >= max(3.0, 5 * self.t.step_seconds):
            self.c.set_rank(int(culprit["rank"]), nan=False)

    def end(self, index: int, f: Fault) -> None:
        culprit = self.culprits[index]
        k = kind(f.kind)
        host = self.c.hosts[int(f.culprit["host"])] if "host" in f.culprit else None
        rank = int(f.culprit.get("rank", f.culprit.get("host", 0)))
        self.note(f"cleared {k.title}")
        if f.kind == "throttle":
            self.c.set_rank(rank, slow=1.0)
        elif f.kind == "pcie_downtrained" and host is not None:
            host.sysfs.link(culprit["pci_address"], width=16)
        elif f.kind == "ib_down" and host is not None:
            host.sysfs.port_state(culprit["device"], "4: ACTIVE", "5: LinkUp")
        elif f.kind == "straggler":
            self.c.set_rank(rank, slow=1.0)
        elif f.kind == "hang":
            self.c.signal_rank(rank, signal.SIGCONT)
        elif f.kind == "slow_input":
            for r in range(self.s.shape.ranks):
                self.c.set_rank(r, data_wait=0.0)
        elif f.kind == "slow_storage":
            self.c.set_rank(0, save_extra=0.0)
        elif f.kind in ("ckpt_deleted", "ckpt_corrupt"):
            self._restore(index)
        elif f.kind == "nan":
            self.c.set_rank(rank, nan=False)
        elif f.kind == "diverged":
            self.c.set_rank(rank, diverge=0)
            self.planned_restart()
        elif f.kind == "agent_killed" and host is not None:
            self.c.start_agent(host.index)
        elif f.kind == "alertmanager_down":
            self.c.start_alertmanager()
        elif f.kind == "prometheus_down":
            self.c.start_prometheus()

    def _flap(self, host: Any, culprit: dict[str, Any], n: int) -> None:
        self._bump(host, culprit["device"], "link_downed", 1)
        netdev = host.layout.netdevs[int(culprit["nic"])]
        path = host.sysfs.root / "class/net" / netdev / "carrier_changes"
        with contextlib.suppress(OSError, ValueError):
            host.sysfs.carrier(netdev, int(path.read_text()) + 2)
        del n

    @staticmethod
    def _bump(host: Any, device: str, counter: str, by: int) -> None:
        path = host.sysfs.port_dir(device) / "counters" / counter
        value = int(path.read_text().strip() or 0)
        host.sysfs.counter(device, counter, value + by)

    def _damage(self, index: int, what: str, culprit: dict[str, Any]) -> None:
        newest = self.c.newest_checkpoint()
        if newest is None:
            self.note("no checkpoint to damage yet")
            return
        backup = self.c.workdir / "backup" / newest.name
        backup.parent.mkdir(exist_ok=True)
        shutil.copy2(newest, backup)
        self._backup[index] = (newest, backup)
        culprit["step"] = str(int(newest.stem.split("-")[1]))
        culprit["file"] = newest.name
        if what == "ckpt_deleted":
            newest.unlink()
        else:  # silent corruption: 64 bytes in the middle flipped, the size unchanged
            size = newest.stat().st_size
            with newest.open("r+b") as fh:
                fh.seek(size // 2)
                data = fh.read(64)
                fh.seek(size // 2)
                fh.write(bytes(b ^ 0xFF for b in data))

    def _restore(self, index: int) -> None:
        found = self._backup.pop(index, None)
        if found is not None:
            original, backup = found
            if original.parent.is_dir():
                shutil.copy2(backup, original)

    # ------------------------------------------------------------------ the job

    def interrupt(self, rank: int, until: float) -> None:
        """The rank dies (SIGKILL) and the job with it; it comes back at ``until``."""
        self.down_until = until
        if not self.c.signal_rank(rank, signal.SIGKILL):
            self.note(f"rank {rank} does not run: nothing to kill")

    def planned_restart(self) -> None:
        """A clean stop a few steps ahead, then a start after the scheduler's delay."""
        step = self.c.job_step()
        if step is None or not self.c.job_running():
            return
        lead = math.ceil(3.0 / self.t.step_seconds) + 3
        self.c.add_job_action("stop_at", step + lead)
        self.restart_pending = True
        self.note(f"planned restart at step {step + lead}")

    def supervise(self) -> None:
        """Start the job again when it should run and does not (after the scheduler's delay)."""
        now = self.now()
        if self.c.job_running():
            self.job_exited_at = None
            return
        if self.job_exited_at is None:
            self.job_exited_at = now
            if self.down_until is None and not self.restart_pending:
                self.unplanned.append(round(now, 1))
                self.note("the job exited on its own")
        if self.down_until is not None:
            if now < self.down_until:
                return
            self.down_until = None
            self.c.start_job()
            self.note("job started again (requeued)")
            return
        if now - self.job_exited_at >= self.t.restart_delay:
            self.restart_pending = False
            self.c.start_job()
            self.note("job started again")

    def noise(self, n: Noise) -> None:
        step = self.c.job_step()
        if n.kind == "restart":
            self.note("noise: planned restart")
            self.planned_restart()
            return
        if step is None or not self.c.job_running():
            self.note(f"noise {n.kind} skipped: the job is not running")
            return
        lead = math.ceil(3.0 / self.t.step_seconds) + 3
        key = "evals" if n.kind == "eval" else "slow_saves"
        self.c.add_job_action(key, [step + lead, n.seconds])
        what = "eval phase" if n.kind == "eval" else "slow healthy save"
        self.note(f"noise: {what} of {n.seconds:g} s at step {step + lead}")


def _where(culprit: dict[str, Any]) -> str:
    keys = ("host", "gpu", "rank", "device", "port", "pci_address", "controller")
    return " ".join(f"{k}={culprit[k]}" for k in keys if k in culprit)


def play(
    options: ClusterOptions,
    schedule: Schedule,
    timing: Timing,
    *,
    say: Callable[[str], None] = print,
    stop: Callable[[], bool] = lambda: False,
) -> Outcome:
    """Start the cluster, play ``schedule`` to its end, grade it, stop everything."""
    t0 = time.time() + 5.0  # the agents' scenarios count from here; the stack starts meanwhile
    cluster = Cluster(options, timing, schedule, t0)
    pages: list[Page] = []
    player = _Player(cluster, schedule, timing, t0, say)
    try:
        cluster.start(lambda page: None)
        player.note(
            f"stack up: {options.shape.hosts} hosts (agents {', '.join(h.address for h in cluster.hosts)}), "
            f"Prometheus {cluster.prometheus_url}, Alertmanager {cluster.alertmanager_address}"
        )
        started: set[int] = set()
        ended: set[int] = set()
        noises = list(schedule.noise)
        while (now := player.now()) < schedule.length and not stop():
            for index, f in enumerate(schedule.faults):
                if index not in started and now >= f.at:
                    started.add(index)
                    player.start(index, f)
                if index in started and index not in ended:
                    if now >= f.end:
                        ended.add(index)
                        player.end(index, f)
                    else:
                        player.tick(index, f, now - f.at)
            while noises and now >= noises[0].at:
                player.noise(noises.pop(0))
            player.supervise()
            player.records += cluster.remediations()
            time.sleep(0.5)
        pages = cluster.pages()
        player.records += cluster.remediations()
    finally:
        cluster.close()
    for index, f in enumerate(schedule.faults):
        if index not in player.culprits:  # a fault the campaign never reached (interrupted)
            player.resolve(index, f)
    graded = score(
        schedule,
        pages,
        t0,
        culprits=player.culprits,
        remediations=player.records,
        switch_period=timing.switch_period,
        hindsight={"TrainingGoodputLow": float(parse_duration(cluster.cfg.goodput_window))},
    )
    return Outcome(
        schedule,
        t0,
        graded,
        pages,
        player.records,
        player.culprits,
        cluster.job_starts,
        player.unplanned,
        player.events,
        options.workdir,
    )
