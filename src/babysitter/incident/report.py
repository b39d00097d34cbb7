"""The provider's report: every hardware incident per cluster and node over a window, and what it cost.

**Incidents** come from Prometheus' own record of its alerts (``ALERTS{alertstate="firing"}``, a range
query over the window): each firing episode of an alert whose ``component`` is hardware (``gpu``,
``fabric``, ``host`` by default), and the episodes of one node that start within :data:`MERGE` of the
first are one incident (an Xid 79 fires GpuXidCritical and GpuDown: one fault, one incident, both
kinds listed). Its evidence is the alerts' identifying labels (GPU, Xid code, port, PCI address) and
the bundles gathered for them (:mod:`babysitter.incident.gather`), found in the runs' directories.

**Cost** comes from the runs' ledgers: each restart of a run is matched to at most one incident of a
node the run had ranks on: the one its remediation note names (``remediations.jsonl``: the alert and
the drained host), else the nearest whose time lies within :data:`BEFORE` before to :data:`AFTER`
after the restart's failure (the last sign of life of the incarnation that ended). A matched restart
costs its ``downtime`` (that sign of life to the next start) and the ``lost_progress`` of the
incarnation that ended (steps recomputed, and its crash tail), exactly as the ledger books them, times
the run's GPUs (its world size): GPU-hours, and money at the cluster's price per GPU-hour. A restart no
hardware incident explains is listed apart, never billed to the provider. Summed over a run's matched
restarts, the cost is the run's ledger downtime and lost progress of those restarts, to the
microsecond.

**Lemon nodes**: a node with ``lemon`` or more incidents in the window is flagged (Meta's lemon nodes:
the same node failing again and again is the node, not bad luck).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.incident.read import list_incidents, load_incident
from babysitter.prom import Deadline, PromClient, PromError

__all__ = [
    "AFTER",
    "BEFORE",
    "MERGE",
    "Cost",
    "Incident",
    "Report",
    "Restart",
    "alert_episodes",
    "build_report",
]

#: Episodes of one node starting within this many seconds of an incident's first are that incident.
MERGE = 600.0
#: A restart's failure may come this long before its incident's first alert (detection takes time) ...
BEFORE = 1800.0
#: ... or this long after it (a hang: the ranks kept signs of life until the job was requeued).
AFTER = 7200.0
#: Labels that identify the hardware in an alert (the evidence), in the order they are shown.
EVIDENCE_LABELS = ("gpu", "uuid", "xid", "action", "device", "port", "pci_address", "pci_bus_id", "mc", "cpu")
_HARDWARE = ("gpu", "fabric", "host")
_MAX_SERIES = 20000


@dataclass
class Restart:
    """One restart of a run, and what it cost."""

    run: str
    index: int
    failed: float  # the last sign of life of the incarnation that ended
    resumed: float  # the next incarnation's start
    downtime_seconds: float
    lost_progress_seconds: float
    gpus: int
    hosts: tuple[str, ...]
    cause: str
    note_alert: str | None = None
    note_host: str | None = None
    note_alert_start: float | None = None

    @property
    def gpu_hours(self) -> float:
        """(downtime + lost progress) x GPUs, in hours."""
        return (self.downtime_seconds + self.lost_progress_seconds) * self.gpus / 3600.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**self.__dict__, "hosts": list(self.hosts), "gpu_hours": self.gpu_hours}


@dataclass
class Cost:
    """What an incident cost: its restarts, in GPU-hours and money."""

    restarts: list[Restart] = field(default_factory=list)
    price: float | None = None

    @property
    def downtime_seconds(self) -> float:
        """Downtime of the restarts it caused."""
        return sum(r.downtime_seconds for r in self.restarts)

    @property
    def lost_progress_seconds(self) -> float:
        """Lost progress of the restarts it caused."""
        return sum(r.lost_progress_seconds for r in self.restarts)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours lost."""
        return sum(r.gpu_hours for r in self.restarts)

    @property
    def money(self) -> float | None:
        """GPU-hours x the cluster's price (None without a price)."""
        return None if self.price is None else self.gpu_hours * self.price


@dataclass
class Incident:
    """One hardware incident of one node."""

    cluster: str
    node: str
    start: float
    end: float | None  # None: still firing at the window's end
    kinds: list[str]
    evidence: list[str]
    alerts: list[dict[str, Any]]
    bundles: list[str] = field(default_factory=list)
    cost: Cost = field(default_factory=Cost)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "cluster": self.cluster,
            "node": self.node,
            "start": self.start,
            "end": self.end,
            "kinds": self.kinds,
            "evidence": self.evidence,
            "alerts": self.alerts,
            "bundles": self.bundles,
            "runs": sorted({r.run for r in self.cost.restarts}),
            "restarts": [r.to_json() for r in self.cost.restarts],
            "downtime_seconds": self.cost.downtime_seconds,
            "lost_progress_seconds": self.cost.lost_progress_seconds,
            "gpu_hours": self.cost.gpu_hours,
            "price_per_gpu_hour": self.cost.price,
            "cost": self.cost.money,
        }


@dataclass
class Report:
    """The whole report."""

    start: float
    end: float
    incidents: list[Incident]
    unmatched: list[Restart]
    prices: dict[str, float]
    lemon: int
    notes: list[str] = field(default_factory=list)

    def nodes(self) -> dict[tuple[str, str], list[Incident]]:
        """Incidents by (cluster, node)."""
        out: dict[tuple[str, str], list[Incident]] = {}
        for incident in self.incidents:
            out.setdefault((incident.cluster, incident.node), []).append(incident)
        return out

    def lemons(self) -> list[tuple[str, str]]:
        """(cluster, node) of the nodes with ``lemon`` or more incidents."""
        return sorted(key for key, items in self.nodes().items() if len(items) >= self.lemon)

    def clusters(self) -> dict[str, dict[str, Any]]:
        """Per cluster: incidents, nodes, GPU-hours and money lost."""
        out: dict[str, dict[str, Any]] = {}
        for incident in self.incidents:
            row = out.setdefault(
                incident.cluster,
                {
                    "incidents": 0,
                    "nodes": set(),
                    "gpu_hours": 0.0,
                    "cost": None,
                    "price": incident.cost.price,
                },
            )
            row["incidents"] += 1
            row["nodes"].add(incident.node)
            row["gpu_hours"] += incident.cost.gpu_hours
            if incident.cost.money is not None:
                row["cost"] = (row["cost"] or 0.0) + incident.cost.money
        for row in out.values():
            row["nodes"] = len(row["nodes"])
        return out

    def to_json(self) -> dict[str, Any]:
        """The ``--format json`` document."""
        return {
            "window": {"start": self.start, "end": self.end},
            "prices_per_gpu_hour": self.prices,
            "lemon_threshold": self.lemon,
            "clusters": self.clusters(),
            "lemon_nodes": [{"cluster": c, "node": n} for c, n in self.lemons()],
            "incidents": [i.to_json() for i in self.incidents],
            "restarts_without_hardware_incident": [r.to_json() for r in self.unmatched],
            "notes": self.notes,
        }


# ------------------------------------------------------------------------------------------ Prometheus


def alert_episodes(
    prom: PromClient,
    start: float,
    end: float,
    *,
    components: Sequence[str] = _HARDWARE,
    cluster: str | None = None,
) -> list[dict[str, Any]]:
    """Each firing episode of a hardware alert in ``[start, end]``: labels, first and last time seen."""
    step = max(15.0, math.ceil((end - start) / 10000))
    matchers = ['alertstate="firing"', f'component=~"{"|".join(components)}"']
    if cluster:
        matchers.append(f"cluster={json.dumps(cluster)}")
    # At most _MAX_SERIES episodes' series; PromError on failure.
    series = prom.query_range("ALERTS{" + ", ".join(matchers) + "}", start, end, step)[:_MAX_SERIES]
    gap = max(3 * step, 300.0)
    out: list[dict[str, Any]] = []
    for item in series:
        labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
        times = sorted(float(v[0]) for v in item.get("values") or [] if isinstance(v, list) and v)
        first = last = None
        for t in times:
            if first is not None and last is not None and t - last > gap:
                out.append({"labels": labels, "start": first, "last": last})
                first = None
            if first is None:
                first = t
            last = t
        if first is not None and last is not None:
            out.append({"labels": labels, "start": first, "last": last, "open": end - last <= 2 * step})
    return sorted(out, key=lambda e: e["start"])


def _runs_on(prom: PromClient, node: str, at: float) -> list[str]:
    """Runs whose ranks reported through ``node`` in the quarter hour before ``at``."""
    from babysitter.catalog import train as T
    from babysitter.generate.promql import eq, select

    try:
        samples = prom.query(
            f"count by (run) (last_over_time({select(T.STEPS, eq('instance', node))}[15m]))", at=at
        )
    except PromError:
        return []
    return sorted({s.labels["run"] for s in samples if s.labels.get("run")})


# ------------------------------------------------------------------------------------------ the ledgers


def run_restarts(run_dir: Path) -> tuple[str, list[Restart]]:
    """The run's name and its restarts with their cost, from its ledger (OSError when unreadable)."""
    from babysitter.ledger import summarize

    summary = summarize(run_dir, keep_points=False)
    incs = summary.incarnations
    notes = {k: note for note, k in summary.remediations if k is not None}
    out: list[Restart] = []
    for restart in summary.restart_list:
        k = restart.index
        if not 0 < k < len(incs):
            continue
        prev = incs[k - 1]
        lost = summary.accountant.window(prev.start, prev.end).badput_us.get("lost_progress", 0) / 1e6
        size = prev.info.get("world_size")
        gpus = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 1
        note = notes.get(k)
        out.append(
            Restart(
                run=summary.run,
                index=k,
                failed=prev.end,
                resumed=incs[k].start,
                downtime_seconds=restart.downtime_seconds,
                lost_progress_seconds=lost,
                gpus=gpus,
                hosts=tuple(sorted({prev.host, incs[k].host})),
                cause=restart.cause,
                note_alert=note.alert if note is not None else None,
                note_host=(note.drained or note.host) if note is not None else None,
                note_alert_start=note.alert_start if note is not None else None,
            )
        )
    return summary.run, out


# ------------------------------------------------------------------------------------------ the whole


def _evidence(labels: Mapping[str, str]) -> str:
    parts = [f"{k}={labels[k]}" for k in EVIDENCE_LABELS if labels.get(k)]
    return f"{labels.get('alertname', '?')}" + (f" ({', '.join(parts)})" if parts else "")


def _merge(episodes: list[dict[str, Any]], cluster_label: str, node_label: str, end: float) -> list[Incident]:
    incidents: list[Incident] = []
    open_by_node: dict[tuple[str, str], Incident] = {}
    for episode in episodes:
        labels = episode["labels"]
        key = (labels.get(cluster_label, ""), labels.get(node_label, ""))
        current = open_by_node.get(key)
        if current is None or episode["start"] - current.start > MERGE:
            current = Incident(key[0], key[1], episode["start"], None, [], [], [])
            incidents.append(current)
            open_by_node[key] = current
        name = labels.get("alertname", "?")
        if name not in current.kinds:
            current.kinds.append(name)
        text = _evidence(labels)
        if text not in current.evidence:
            current.evidence.append(text)
        alert = {k: v for k, v in labels.items() if k not in ("alertstate", "__name__")}
        current.alerts.append(
            {
                "labels": alert,
                "start": episode["start"],
                "last": episode["last"],
                "open": bool(episode.get("open")),
            }
        )
    for incident in incidents:
        still = any(a["open"] for a in incident.alerts)
        incident.end = None if still else min(end, max(a["last"] for a in incident.alerts))
    return incidents


def _host(node: str) -> str:
    """``n1:9400`` -> ``n1``: the node name a ledger's host or a note's drained host would be."""
    return node.rsplit(":", 1)[0] if node.count(":") == 1 else node


def _attribute(
    incidents: list[Incident], restarts: list[Restart], runs_on: Callable[[Incident], set[str]]
) -> list[Restart]:
    """Give each restart to at most one incident; the restarts no incident explains."""
    unmatched: list[Restart] = []
    for restart in restarts:
        best: tuple[int, float, Incident] | None = None
        for incident in incidents:
            host = _host(incident.node)
            named = (
                restart.note_alert in incident.kinds
                and restart.note_host in (host, incident.node)
                and (
                    restart.note_alert_start is None
                    or abs(restart.note_alert_start - incident.start) <= MERGE
                )
            )
            in_time = -BEFORE <= restart.failed - incident.start <= AFTER
            on_node = restart.run in runs_on(incident) or host in restart.hosts
            if not (named or (in_time and on_node)):
                continue
            rank = (0 if named else 1, abs(restart.failed - incident.start), incident)
            if best is None or rank[:2] < best[:2]:
                best = rank
        if best is None:
            unmatched.append(restart)
        else:
            best[2].cost.restarts.append(restart)
    return unmatched


def build_report(
    prom: PromClient | None,
    *,
    start: float,
    end: float,
    run_dirs: Sequence[Path] = (),
    incident_dirs: Sequence[Path] = (),
    prices: Mapping[str, float] | None = None,
    default_price: float | None = None,
    lemon: int = 2,
    cluster: str | None = None,
    components: Sequence[str] = _HARDWARE,
    cluster_label: str = "cluster",
    node_label: str = "instance",
    deadline: float = 120.0,
) -> Report:
    """The report over ``[start, end]`` (Unix seconds); PromError when Prometheus cannot be read."""
    notes: list[str] = []
    client = prom.within(Deadline(deadline)) if prom is not None else None
    episodes = alert_episodes(client, start, end, components=components, cluster=cluster) if client else []
    incidents = _merge(episodes, cluster_label, node_label, end)
    prices = dict(prices or {})
    for incident in incidents:
        incident.cost.price = prices.get(incident.cluster, default_price)
    # Bundles: evidence by (alertname, node, start), and the runs they found on the node.
    bundle_runs: dict[int, set[str]] = {}
    for folder in [*run_dirs, *incident_dirs]:
        try:
            summaries = list_incidents(folder)
        except (OSError, ValueError) as exc:
            notes.append(f"{folder}: {exc}"[:300])
            continue
        for summary in summaries:
            try:
                alert = load_incident(folder, summary.id).alert
            except (OSError, ValueError):
                continue
            raw = alert.get("labels")
            labels: dict[str, Any] = raw if isinstance(raw, dict) else {}
            starts = summary.starts_at
            for n, incident in enumerate(incidents):
                same_node = labels.get(node_label) == incident.node or incident.node in summary.hosts
                if same_node and starts is not None and abs(starts - incident.start) <= MERGE:
                    incident.bundles.append(str(summary.path))
                    if summary.run:
                        bundle_runs.setdefault(n, set()).add(summary.run)
    restarts: list[Restart] = []
    for folder in run_dirs:
        try:
            _run, found = run_restarts(folder)
        except (OSError, ValueError) as exc:
            notes.append(f"{folder}: the ledger cannot be read: {exc}"[:300])
            continue
        restarts += [r for r in found if start - BEFORE <= r.failed <= end]
    cache: dict[int, set[str]] = {}

    def runs_on(incident: Incident) -> set[str]:
        key = id(incident)
        if key not in cache:
            found = set(bundle_runs.get(incidents.index(incident), set()))
            if client is not None:
                found |= set(_runs_on(client, incident.node, incident.start))
            cache[key] = found
        return cache[key]

    unmatched = _attribute(incidents, sorted(restarts, key=lambda r: r.failed), runs_on)
    if prom is None:
        notes.append("no Prometheus: no incidents from its alerts (only restarts from the ledgers)")
    return Report(start, end, incidents, unmatched, prices, lemon, notes)
