"""Explain's fabric cause: port errors, flaps, downed links and PCIe trouble on the hosts of a slow or
stalled rank.

The ranks' hosts and NICs come from the rank-to-NIC join (``Records.rank_nic``: each rank's GPU and
its nearest NIC port, docs/fabric.md), with the hosts the ranks are served from as a fallback. Over the
window, on those hosts, it reads what grew (exactly: the value at the window's end minus the last one
before it): the port error counters and netdev carrier changes, uncorrectable PCIe AER errors, and
ports that were down or links that ran below their width at some point.

Scoring, in the engine's seconds: when the slowest straggler's NIC (or, without the join, its host)
had fabric trouble, the straggler's seconds are the fabric's (the cause replaces the straggler: a rank
slow because its link is sick is not a mystery straggler). Otherwise trouble on the run's hosts during
a hang, or while the run lost time, is listed untimed: nothing measures how much of the loss it caused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from babysitter.catalog import fabric as F
from babysitter.catalog import train as T
from babysitter.generate.promql import by, eq, join_matchers, regex, select
from babysitter.prom import Sample, finite


class _Scan(Protocol):
    """What the fabric check reads of the engine's scan (explain/engine.py: ``_Scan``)."""

    q: Any
    ask: Any  # called (name, expr, at) -> list[Sample]
    W: float
    B: float
    t1: float
    causes: list[Any]
    checked: dict[str, str]
    badput_window: dict[str, float]
    min_seconds: float

    def ask_q(self, name: str) -> str: ...


__all__ = ["FabricQueries", "check_fabric"]

_ACTIVE = 4


def _r(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


@dataclass(frozen=True)
class FabricQueries:
    """The PromQL of the fabric cause for one run (``matchers``: its ``run`` and cluster)."""

    matchers: str
    node_selector: str
    tracker_selector: str
    cluster_label: str
    rank_nic: str

    def nics(self, seconds: float) -> str:
        """Each rank's NIC port(s) (and their host target) seen in the range."""
        return f"last_over_time({self.rank_nic}{{{self.matchers}}}[{_r(seconds)}])"

    def served_from(self, seconds: float) -> str:
        """The host target each rank is served from (the node agent's, in a default deployment)."""
        steps = select(T.STEPS, self.tracker_selector, self.matchers)
        return f"group by (rank, instance) (last_over_time({steps}[{_r(seconds)}]))"

    def _hosts(self, seconds: float) -> str:
        c = self.cluster_label
        steps = select(T.STEPS, self.tracker_selector, self.matchers)
        return (
            f"group by ({c}, instance) ({self.nics(seconds)})\n"
            f"or group by ({c}, instance) (last_over_time({steps}[{_r(seconds)}]))"
        )

    def _grown(self, selector: str, window: float, memory: float) -> str:
        return f"(({selector} - last_over_time({selector}[{_r(memory)}] offset {_r(window)})) > 0)"

    def port_events(self, window: float, memory: float) -> str:
        """Error counters and carrier changes grown in the window on the run's hosts, per port and kind."""
        c, ns = self.cluster_label, self.node_selector
        key = by((c, "instance", "device", "port", "counter"))
        errors = self._grown(select(F.IB_PORT_ERRORS, ns), window, memory)
        flaps = self._grown(select(F.IB_PORT_CARRIER_CHANGES, ns), window, memory)
        relabeled = f'label_replace({flaps}, "counter", "carrier_changes", "", "")'
        return (
            f"sum {key} ({errors} or {relabeled})\nand on ({c}, instance)\n({self._hosts(window + memory)})"
        )

    def ports_down(self, window: float, memory: float) -> str:
        """Ports of the run's hosts that were below Active at some point in the window (and up before)."""
        c, ns = self.cluster_label, self.node_selector
        state = select(F.IB_PORT_STATE, ns)
        key = by((c, "instance", "device", "port"))
        return (
            f"min {key} (min_over_time({state}[{_r(window)}])) < {_ACTIVE}\n"
            f"and on ({c}, instance, device, port) max {key} (max_over_time({state}[{_r(window + memory)}])) "
            f">= {_ACTIVE}\nand on ({c}, instance)\n({self._hosts(window + memory)})"
        )

    def pcie_events(self, window: float, memory: float) -> str:
        """Uncorrectable AER errors grown in the window on the run's hosts, per device and severity."""
        c, ns = self.cluster_label, self.node_selector
        aer = select(F.PCIE_AER_ERRORS, ns, regex("severity", ("nonfatal", "fatal")))
        key = by((c, "instance", "pci_address", "kind", "severity"))
        return (
            f"sum {key} ({self._grown(aer, window, memory)})\nand on ({c}, instance)\n"
            f"({self._hosts(window + memory)})"
        )

    def narrow_links(self, window: float, memory: float) -> str:
        """Lowest width over maximum of each PCIe link of the run's hosts in the window, where below 1."""
        c, ns = self.cluster_label, self.node_selector
        key = by((c, "instance", "pci_address", "kind"))
        width, most = select(F.PCIE_LINK_WIDTH, ns), select(F.PCIE_LINK_MAX_WIDTH, ns)
        ratio = f"max {key} ({width}) / max {key} ({most})"
        return (
            f"min_over_time(({ratio})[{_r(window)}:60s]) < 1\nand on ({c}, instance)\n"
            f"({self._hosts(window + memory)})"
        )


def _queries(scan: _Scan) -> FabricQueries:
    q = scan.q
    parts = [eq("run", q.run)]
    if q.cluster:
        parts.append(eq(q.cfg.cluster_label, q.cluster))
    return FabricQueries(
        matchers=join_matchers(*parts),
        node_selector=q.cfg.node_selector,
        tracker_selector=q.cfg.tracker_selector,
        cluster_label=q.cfg.cluster_label,
        rank_nic=q.rules.rank_nic,
    )


def _values(samples: Iterable[Sample]) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, v) for s in samples if (v := finite(s.value)) is not None]


def check_fabric(scan: _Scan, *, cause: Callable[..., Any], evidence: Callable[..., Any], team: str) -> None:
    """Add the ``fabric`` cause to ``scan`` (or say in ``checked`` what was looked at); ``cause`` and
    ``evidence`` are the engine's Cause and Evidence (passed in: the engine imports this module)."""
    Evidence = evidence

    fq = _queries(scan)
    W, B = scan.W, scan.B
    nics = scan.ask("fabric_nics", fq.nics(W + B), scan.t1)
    served = scan.ask("fabric_served_from", fq.served_from(W + B), scan.t1)
    events = _values(scan.ask("fabric_port_events", fq.port_events(W, B), scan.t1))
    down = _values(scan.ask("fabric_ports_down", fq.ports_down(W, B), scan.t1))
    pcie = _values(scan.ask("fabric_pcie_events", fq.pcie_events(W, B), scan.t1))
    narrow = _values(scan.ask("fabric_narrow_links", fq.narrow_links(W, B), scan.t1))
    rank_ports: dict[str, set[tuple[str, str, str]]] = {}
    rank_pci: dict[str, set[tuple[str, str]]] = {}
    for s in nics:
        lab = s.labels
        rank = lab.get("rank", "")
        rank_ports.setdefault(rank, set()).add(
            (lab.get("instance", ""), lab.get("device", ""), lab.get("port", ""))
        )
        for which in ("gpu_pci_address", "nic_pci_address"):
            rank_pci.setdefault(rank, set()).add((lab.get("instance", ""), lab.get(which, "")))
    rank_hosts = {r: {p[0] for p in ports} for r, ports in rank_ports.items()}
    for s in served:
        rank_hosts.setdefault(s.labels.get("rank", ""), set()).add(s.labels.get("instance", ""))
    if not (events or down or pcie or narrow):
        hosts = sorted({h for hs in rank_hosts.values() for h in hs})
        scan.checked["fabric"] = (
            f"no port errors, flaps, downs or PCIe trouble on the run's {len(hosts)} host(s)"
            if hosts
            else "no host of the run has fabric series (no fabric collectors, or no rank-to-host join)"
        )
        return
    trouble_hosts: set[str] = set()
    trouble_ports: set[tuple[str, str, str]] = set()
    trouble_pci: set[tuple[str, str]] = set()
    parts: list[str] = []
    found: list[Any] = []
    per_port: dict[tuple[str, str, str], list[str]] = {}
    for lab, value in events:
        key = (lab.get("instance", ""), lab.get("device", ""), lab.get("port", ""))
        per_port.setdefault(key, []).append(f"{lab.get('counter', '?')} +{value:g}")
        found.append(Evidence("fabric counter grew in the window", value, None, lab, _q(scan, "port_events")))
    for lab, _ in down:
        key = (lab.get("instance", ""), lab.get("device", ""), lab.get("port", ""))
        per_port.setdefault(key, []).insert(0, "down")
        found.append(Evidence("port below Active in the window", 0.0, None, lab, _q(scan, "ports_down")))
    owners = {
        port: sorted((r for r, ps in rank_ports.items() if port in ps), key=_rank_order) for port in per_port
    }
    for port, what in sorted(per_port.items()):
        trouble_hosts.add(port[0])
        trouble_ports.add(port)
        whose = f" (rank {', '.join(owners[port])}'s NIC)" if owners[port] else ""
        parts.append(f"{port[1]} port {port[2]} on {port[0]}{whose}: {', '.join(what)}")
    for lab, value in pcie:
        trouble_hosts.add(lab.get("instance", ""))
        trouble_pci.add((lab.get("instance", ""), lab.get("pci_address", "")))
        parts.append(
            f"{lab.get('kind', '?')} {lab.get('pci_address', '?')} on {lab.get('instance', '?')}: "
            f"{value:g} {lab.get('severity', '?')} PCIe AER errors"
        )
        found.append(Evidence("PCIe AER errors in the window", value, None, lab, _q(scan, "pcie_events")))
    for lab, value in narrow:
        trouble_hosts.add(lab.get("instance", ""))
        trouble_pci.add((lab.get("instance", ""), lab.get("pci_address", "")))
        parts.append(
            f"{lab.get('kind', '?')} {lab.get('pci_address', '?')} on {lab.get('instance', '?')}: "
            f"PCIe link at {value:.0%} of its width"
        )
        found.append(Evidence("PCIe width / maximum (lowest)", value, None, lab, _q(scan, "narrow_links")))

    def hit(rank: str) -> bool:
        """Its NIC port or its GPU's or NIC's PCIe link is in trouble; without the join, its host."""
        if rank in rank_ports:
            return bool(rank_ports[rank] & trouble_ports or rank_pci.get(rank, set()) & trouble_pci)
        return bool(rank_hosts.get(rank, set()) & trouble_hosts)

    ranks_hit = sorted((r for r in set(rank_ports) | set(rank_hosts) if hit(r)), key=_rank_order)
    seconds, lead = 0.0, "on the run's hosts"
    straggler = next((c for c in scan.causes if c.key == "straggler"), None)
    if straggler is not None and straggler.ranks:
        slowest = straggler.ranks[0]
        if hit(slowest):
            # The straggler is slow because of its link: charge its seconds to the fabric instead.
            seconds = straggler.seconds
            scan.causes.remove(straggler)
            lead = f"for {straggler.text.split(';', 1)[0]}"
            found.extend(straggler.evidence)
    if seconds == 0.0 and scan.badput_window.get("hang", 0.0) >= scan.min_seconds:
        lead = "during the run's hang, on its hosts"
    scan.causes.append(
        cause(
            "fabric",
            f"fabric trouble {lead}: " + "; ".join(parts),
            seconds,
            team,
            ranks=ranks_hit,
            hosts=sorted(trouble_hosts),
            evidence=found,
        )
    )


def _q(scan: _Scan, name: str) -> str:
    return scan.ask_q(f"fabric_{name}")


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)
