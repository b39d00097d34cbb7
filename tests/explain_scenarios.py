"""Scripted runs for the ``babysitter explain`` tests: each a cluster of 2 hosts x 2 GPUs, one 4-rank run.

A :class:`Scenario` injects causes into the last 30 minutes (the window) of 2.5 hours of series; the
hour before the window is the baseline. :func:`scenario_lines` simulates the job tick by tick (30 s):
ranks step in lockstep at the pace of the slowest, blocking checkpoint saves, marked phases and a
restart's downtime take whole seconds out of a tick, and every counter is what a tracker or the node
agent would export (per-process counters reset at a restart, the ledger's continue). The expected
cause of each scenario is set by hand, not derived from the explain code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from babysitter.catalog import fabric as F
from babysitter.catalog import goodput as G
from babysitter.catalog import integrity as I
from babysitter.catalog import node as N
from babysitter.catalog import storage as S
from babysitter.catalog import train as T

__all__ = ["BASELINE", "TICK", "WINDOW", "Scenario", "write_openmetrics"]

TICK = 30.0
WINDOW = 1800.0
BASELINE = 3600.0
HISTORY = 6000.0  # seconds of series before the end: the baseline, the window, and 10 min before them
PEAK = 1e15
FLOPS_PER_TOKEN = 4e11  # 1000 tokens/s per rank at 1 s steps: MFU 0.4
TOKENS_PER_STEP = 1000.0  # per rank
SAVE_EVERY = 1800.0
SAVE_OFFSET = 900.0  # saves at end - 900 - k * 1800: one in the window, two in the baseline
THROTTLE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass(frozen=True)
class Scenario:
    """One run and what goes wrong in its window (all multipliers 1 / zero: a healthy run)."""

    name: str
    #: rank -> step-time multiplier in the window; with ``throttle``, that rank's GPU throttles.
    slow: dict[int, float] = field(default_factory=dict)
    throttle: bool = False
    #: Data wait per step (seconds) of every rank in the window (0.02 s before).
    data_wait: float = 0.02
    #: Blocking seconds of each checkpoint save in the window (20 s before) and saves in the window.
    save_seconds: float = 20.0
    saves_in_window: int = 1
    #: Storage probe write + fsync seconds on the run's hosts in the window (0.2 s before).
    storage_seconds: float = 0.2
    #: Seconds of eval in the window.
    eval_seconds: float = 0.0
    #: A GPU fault: Xid 79 on ``xid_rank``'s GPU at window start + 300 s, the job down until + 720 s.
    xid_rank: int | None = None
    #: False: the same downtime and restart, with no Xid and no lost GPU (a preemption, a crash).
    gpu_fault: bool = True
    #: Ranks that leave at window start + 60 s (the job shrinks).
    leave: tuple[int, ...] = ()
    #: Non-finite losses and a loss spike at window start + 600 s.
    bad_loss: bool = False
    #: Seconds the job stops stepping (process up, nothing booked) from 20 min before the window:
    #: the step-time rules read 0/0 = NaN then, inside the baseline.
    baseline_hang: float = 0.0
    #: Silent corruption in the window: rank 2's parameters leave its replicas' at window start + 300 s
    #: (step 4321), the checkpoint of step 4000 fails its digest from + 900 s, and (with ``bad_loss``)
    #: rank 1's loss goes non-finite at step 5000, the others' at 5001.
    corruption: bool = False
    #: The rank whose GPU's nearest NIC port goes bad in the window: down for one tick at + 300 s and
    #: again at + 900 s (link_downed +2), with symbol errors growing 50 per tick from + 300 s.
    fabric_rank: int | None = None
    #: Whether the hosts export fabric series at all (implied by ``fabric_rank``; the healthy run has
    #: them too, so a clean fabric must find nothing). Off elsewhere: they cost the backfill seconds.
    fabric: bool = False
    #: Seconds into the window at which ``slow`` (and its throttling) begins: late in the window.
    slow_from: float = 0.0
    #: ``(alert name, rank, seconds into the window)``: Prometheus' ALERTS series of an alert firing
    #: about that rank's GPU from then on (what the loaded rules would have written).
    alerts: tuple[tuple[str, int, float], ...] = ()
    #: Blocking seconds of each save before the window.
    baseline_save_seconds: float = 20.0
    #: Seconds of series the run has before the end (None: all of the history): a young run.
    age: float | None = None
    #: Seconds into the window at which the ``xid_rank`` fault (and the job's downtime) begins.
    down_from: float = 300.0

    @property
    def cluster(self) -> str:
        return f"sc-{self.name}"


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class _Out:
    """Samples by series, in time order, grouped by metric name for OpenMetrics."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], list[str]] = {}

    def add(self, name: str, labels: dict[str, str], t: float, value: float) -> None:
        text = _labels(**labels)
        self.series.setdefault((name, text), []).append(f"{name}{text} {value:.9g} {t:.0f}")


def scenario_lines(sc: Scenario, end: float, out: _Out) -> None:
    """Simulate ``sc`` from ``end - HISTORY`` to ``end`` into ``out``."""
    start, t0 = end - HISTORY, end - WINDOW
    job = {"job": "babysitter-node"}
    hosts = [f"{sc.cluster}-h{h}:9946" for h in range(2)]

    def rank_labels(rank: int) -> dict[str, str]:
        return {**job, "cluster": sc.cluster, "instance": hosts[rank // 2], "run": sc.name, "rank": str(rank)}

    def gpu_labels(rank: int) -> dict[str, str]:
        return {
            **job,
            "cluster": sc.cluster,
            "instance": hosts[rank // 2],
            "gpu": str(rank % 2),
            "uuid": f"GPU-{sc.name}-{rank}",
            "pci_bus_id": f"0000:{0x18 + 0x10 * (rank % 2):02x}:00",
            "model": "NVIDIA H100 80GB HBM3",
        }

    saves = sorted(end - SAVE_OFFSET - k * SAVE_EVERY for k in range(5))
    saves = [s for s in saves if s >= start and s < t0]
    saves += [t0 + (k + 0.5) * WINDOW / sc.saves_in_window for k in range(sc.saves_in_window)]
    down = (t0 + sc.down_from, t0 + sc.down_from + 420) if sc.xid_rank is not None else None
    counters = {
        r: {"steps": 0.0, "sum": 0.0, "tokens": 0.0, "wait": 0.0, "ssum": 0.0, "scount": 0.0}
        for r in range(4)
    }
    ledger = {"restarts": 0.0, "downtime": 0.0, "lost_progress": 0.0, "startup": 0.0, "eval": 0.0}
    nonfinite = 0.0
    last_save = 0.0
    t = start
    while t <= end + 1e-6:
        in_window = t > t0
        tick_start = t - TICK
        blocked = 0.0
        save_now: list[float] = []
        for s in saves:
            length = sc.save_seconds if s > t0 else sc.baseline_save_seconds
            blocked += max(0.0, min(t, s + length) - max(tick_start, s))
            if tick_start < s <= t:
                save_now.append(length)
        if in_window and sc.eval_seconds and tick_start < t0 + 600 + sc.eval_seconds and t > t0 + 600:
            overlap = min(t, t0 + 600 + sc.eval_seconds) - max(tick_start, t0 + 600)
            blocked += max(0.0, overlap)
            ledger["eval"] += max(0.0, overlap)
        is_down = down is not None and down[0] <= t < down[1]
        hung = t0 - 1200 < t <= t0 - 1200 + sc.baseline_hang
        if down is not None and tick_start < down[1] <= t:
            # The restart: the ledger books the downtime, the steps since the last save, the startup.
            ledger["restarts"] += 1
            ledger["downtime"] += down[1] - down[0]
            ledger["lost_progress"] += 120.0
            ledger["startup"] += 60.0
            for r, values in counters.items():
                counters[r] = dict.fromkeys(values, 0.0)
        ranks = [r for r in range(4) if not (in_window and t > t0 + 60 and r in sc.leave)]
        wait = sc.data_wait if in_window else 0.02
        slowed = t > t0 + sc.slow_from
        own = {r: (sc.slow.get(r, 1.0) if slowed else 1.0) * 1.0 + wait for r in ranks}
        pace = max(own.values())
        steps = 0.0 if is_down or hung else max(0.0, TICK - blocked) / pace
        if not is_down:
            for r in ranks:
                c = counters[r]
                c["steps"] += steps
                c["sum"] += steps * own[r]
                c["tokens"] += steps * TOKENS_PER_STEP
                c["wait"] += steps * wait
                for length in save_now:
                    c["ssum"] += length
                    c["scount"] += 1
        if save_now:
            last_save = t
        if sc.bad_loss and tick_start < t0 + 600 <= t:
            nonfinite += 3
        young = sc.age is not None and t < end - sc.age
        for r in ranks:
            if is_down or young:
                break
            c, rl = counters[r], rank_labels(r)
            out.add(T.STEPS.name, rl, t, c["steps"])
            out.add(f"{T.STEP_DURATION.name}_sum", rl, t, c["sum"])
            out.add(f"{T.STEP_DURATION.name}_count", rl, t, c["steps"])
            out.add(T.TOKENS.name, rl, t, c["tokens"])
            out.add(T.MODEL_FLOPS.name, rl, t, c["tokens"] * FLOPS_PER_TOKEN)
            out.add(T.PEAK_FLOPS.name, rl, t, PEAK)
            out.add(T.DATA_WAIT.name, rl, t, c["wait"])
            out.add(f"{T.CKPT_SAVE_DURATION.name}_sum", rl, t, c["ssum"])
            out.add(f"{T.CKPT_SAVE_DURATION.name}_count", rl, t, c["scount"])
            gl = gpu_labels(r)
            out.add(T.INFO.name, {**rl, "uuid": gl["uuid"], "pci_bus_id": gl["pci_bus_id"]}, t, 1.0)
            if sc.corruption:
                out.add(I.REPLICA_CHECKS.name, rl, t, (t - start) // 60)
                if r == 2 and t >= t0 + 300:
                    out.add(I.REPLICA_MISMATCH_STEP.name, rl, t, 4321.0)
                if sc.bad_loss and t >= t0 + 600:
                    out.add(
                        I.NONFINITE_FIRST_STEP.name, {**rl, "signal": "loss"}, t, 5000.0 if r == 1 else 5001.0
                    )
            if r == 0:
                out.add(T.MFU.name, rl, t, steps * TOKENS_PER_STEP * FLOPS_PER_TOKEN / (TICK * PEAK))
                out.add(T.LAST_STEP_TIMESTAMP.name, rl, t, t)
                out.add(T.CKPT_LAST_SUCCESS.name, rl, t, last_save)
                out.add(G.RESTARTS.name, rl, t, ledger["restarts"])
                for cause in ("downtime", "lost_progress", "startup", "eval"):
                    out.add(G.BADPUT_SECONDS.name, {**rl, "cause": cause}, t, ledger[cause])
                spike = sc.bad_loss and t0 + 600 <= t < t0 + 660
                out.add(T.LOSS.name, rl, t, 9.0 if spike else 2.0 - (t - start) / HISTORY * 0.2)
                out.add(T.NONFINITE_LOSS.name, rl, t, nonfinite)
        # The node agents: every GPU, whatever the job does.
        for r in range(4):
            gl = gpu_labels(r)
            hot = sc.throttle and r in sc.slow and t >= t0 + (sc.slow_from if sc.slow_from else -60)
            lost = down is not None and sc.gpu_fault and r == sc.xid_rank and down[0] <= t < down[1]
            out.add(N.GPU_UP.name, gl, t, 0.0 if lost else 1.0)
            out.add(N.GPU_SM_CLOCK.name, gl, t, 1.1e9 if hot else 1.98e9)
            out.add(N.GPU_TEMPERATURE.name, {**gl, "sensor": "gpu"}, t, 91.0 if hot else 64.0)
            for reason in THROTTLE_REASONS:
                active = hot and reason in ("hw_slowdown", "hw_thermal_slowdown")
                out.add(N.GPU_CLOCK_EVENT_ACTIVE.name, {**gl, "reason": reason}, t, 1.0 if active else 0.0)
            if down is not None and sc.gpu_fault and r == sc.xid_rank and t >= down[0]:
                out.add(N.GPU_XID_ERRORS.name, {**gl, "xid": "79", "action": "reset_gpu"}, t, 1.0)
            for alert, rank, since in sc.alerts:
                if rank == r and t >= t0 + since:
                    labels = {
                        "alertname": alert,
                        "alertstate": "firing",
                        "severity": "warning",
                        "cluster": sc.cluster,
                        "instance": gl["instance"],
                        "gpu": gl["gpu"],
                        "reason": "hw_slowdown",
                    }
                    out.add("ALERTS", labels, t, 1.0)
        if sc.corruption:
            sentinel = {**job, "cluster": sc.cluster, "instance": hosts[0], "run": sc.name}
            bad = t >= t0 + 900
            out.add(S.CHECKPOINT_CORRUPT.name, sentinel, t, 1.0 if bad else 0.0)
            if bad:
                where = {**sentinel, "file": "__2_0.distcp", "reason": "digest"}
                out.add(S.CHECKPOINT_CORRUPT_STEP.name, where, t, 4000.0)
        # The fabric: each GPU's nearest NIC port (mlx5_<gpu> on its host), every port healthy but one.
        for r in range(4) if sc.fabric or sc.fabric_rank is not None else ():
            gl = gpu_labels(r)
            port = {
                **job,
                "cluster": sc.cluster,
                "instance": hosts[r // 2],
                "device": f"mlx5_{r % 2}",
                "port": "1",
            }
            nic = f"0000:{0x19 + 0x10 * (r % 2):02x}:00.0"
            gpu_address = f"{gl['pci_bus_id']}.0"
            info = {
                **port,
                "uuid": gl["uuid"],
                "pci_bus_id": gl["pci_bus_id"],
                "gpu_pci_address": gpu_address,
                "nic_pci_address": nic,
                "link": "PIX",
                "nic_index": "0",
            }
            out.add(F.GPU_NIC.name, info, t, 1.0)
            bad = sc.fabric_rank == r and in_window
            downs = sum(1 for at in (300, 900) if bad and t >= t0 + at)
            flapped = bad and any(t0 + at <= t < t0 + at + TICK for at in (300, 900))
            out.add(F.IB_PORT_STATE.name, port, t, 1.0 if flapped else 4.0)
            out.add(F.IB_PORT_ERRORS.name, {**port, "counter": "link_downed"}, t, float(downs))
            errors = max(0.0, (t - t0 - 300) / TICK * 50) if bad else 0.0
            out.add(F.IB_PORT_ERRORS.name, {**port, "counter": "symbol_error"}, t, errors)
            for address, kind in ((gpu_address, "gpu"), (nic, "nic")):
                pl = {
                    **job,
                    "cluster": sc.cluster,
                    "instance": hosts[r // 2],
                    "pci_address": address,
                    "kind": kind,
                }
                out.add(F.PCIE_LINK_WIDTH.name, pl, t, 16.0)
                out.add(F.PCIE_LINK_MAX_WIDTH.name, pl, t, 16.0)
                out.add(F.PCIE_AER_ERRORS.name, {**pl, "severity": "fatal"}, t, 0.0)
        for host in hosts:
            probe = sc.storage_seconds if in_window else 0.2
            sl = {**job, "cluster": sc.cluster, "instance": host, "path": "/ckpt"}
            out.add(S.STORAGE_PROBE_WRITE.name, sl, t, probe * 0.6)
            out.add(S.STORAGE_PROBE_FSYNC.name, sl, t, probe * 0.4)
        t += TICK


def write_openmetrics(scenarios: list[Scenario], end: float, path: Path) -> Path:
    """All scenarios' series in one OpenMetrics file (every name declared once, series in time order)."""
    out = _Out()
    for sc in scenarios:
        scenario_lines(sc, end, out)
    by_name: dict[str, list[str]] = {}
    for (name, _), lines in out.series.items():
        by_name.setdefault(name, []).extend(lines)
    body = []
    for name, lines in by_name.items():
        body.append(f"# TYPE {name} gauge")
        body.extend(lines)
    path.write_text("\n".join(body) + "\n# EOF\n")
    return path
