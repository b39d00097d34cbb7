"""What slowed the slow steps, from Prometheus: the culprit rank, then its GPU, PCIe links and fabric.

For each slow episode of a run (the ledger's, :mod:`babysitter.ledger.slowcause`), over its time:

1. **the culprit**: the rank the straggler exchange named in the ledger, else the rank whose
   ``train_straggler_score`` (collective arrival, lockstep runs) or mean step time (ranks not in
   lockstep) was at least 1.1x the median rank's in Prometheus; none when every rank was alike;
2. **its GPU** (``train_info``'s uuid; every GPU of the run when there is no culprit): a throttle
   reason of the alert's list active for at least ``throttle_fraction`` of the episode is
   ``gpu_throttling``;
3. **its host** (the GPU's node agent target): a PCIe link that trained below its maximum width is
   ``pcie``; InfiniBand/RoCE port errors or carrier changes are ``fabric``;
4. otherwise a named culprit stays ``straggler`` and the rest ``unknown``.

Raw series only (no recording rule needs to be loaded), one instant query per question over the
episode's range. The :data:`MAX_EPISODES` largest episodes are examined; the rest keep the ledger's
verdict. Every label value that goes into a query is escaped (:func:`babysitter.generate.promql.eq`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace

from babysitter.catalog import MetricSpec
from babysitter.catalog import fabric as F
from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.explain.queries import ExplainQueries
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, eq, regex, select
from babysitter.ledger.slowcause import Episode, SlowdownSplit
from babysitter.ledger.slowdown import TOLERANCE
from babysitter.prom import PromClient, Sample, finite

__all__ = ["MAX_EPISODES", "attribute", "attribute_episode"]

#: Episodes examined one by one (the largest): a few queries each.
MAX_EPISODES = 20
US = 1_000_000

Ask = Callable[[str, float], list[Sample]]


def _r(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def _l(sample: Sample, key: str) -> str:
    return sample.labels.get(key, "")


def _values(samples: list[Sample], *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for s in samples:
        value = finite(s.value)
        if value is not None:
            out[tuple(s.labels.get(k, "") for k in keys)] = value
    return out


class _Episode:
    """The queries of one episode: over ``[end - seconds, end]`` of one run."""

    def __init__(self, q: ExplainQueries, ask: Ask, episode: Episode) -> None:
        self.q, self.ask, self.e = q, ask, episode
        self.at = episode.end_us / US
        self.range = _r(max(1.0, (episode.end_us - episode.begin_us) / US))
        self.cfg = q.cfg

    def _t(self, spec: MetricSpec, *extra: str, suffix: str = "") -> str:
        return select(spec, self.cfg.tracker_selector, self.q.matchers, *extra, suffix=suffix)

    def _n(self, spec: MetricSpec, *extra: str) -> str:
        return select(spec, self.cfg.node_selector, *extra)

    def culprit(self) -> tuple[str, str] | None:
        """``(rank, why)`` of the rank the others waited for in Prometheus, None when all were alike."""
        scores = _values(
            self.ask(f"max by (rank) (avg_over_time({self._t(R.STRAGGLER_SCORE)}[{self.range}]))", self.at),
            "rank",
        )
        if scores:
            (rank,), score = max(scores.items(), key=lambda kv: kv[1])
            if score >= 1.0 + TOLERANCE:
                return rank, f"train_straggler_score of rank {rank} averaged {score:.2f} (collective arrival)"
        step_sum = self._t(T.STEP_DURATION, suffix="_sum")
        step_count = self._t(T.STEP_DURATION, suffix="_count")
        means = _values(
            self.ask(
                f"sum by (rank) (increase({step_sum}[{self.range}]))\n/\n"
                f"sum by (rank) (increase({step_count}[{self.range}]))",
                self.at,
            ),
            "rank",
        )
        if len(means) >= 2:
            median = statistics.median(means.values())
            (rank,), mean = max(means.items(), key=lambda kv: kv[1])
            if median > 0 and mean >= (1.0 + TOLERANCE) * median:
                return rank, f"rank {rank}'s mean step time was {mean / median:.2f}x the median rank's"
        return None

    def placement(self) -> dict[str, tuple[str, str, str]]:
        """Each rank's ``(uuid, gpu index, host)``: its GPU from ``train_info``, the host from that
        GPU's node agent series (else the rank's own target)."""
        info = self.ask(
            f"max by (rank, uuid, instance) (max_over_time({self._t(T.INFO)}[{self.range}]))", self.at
        )
        ranks = {_l(s, "rank"): (_l(s, "uuid"), _l(s, "instance")) for s in info}
        uuids = sorted({u for u, _ in ranks.values() if u})
        gpus: dict[str, tuple[str, str]] = {}
        if uuids:
            up = self.ask(
                f"max by (uuid, gpu, instance) (max_over_time({self._n(N.GPU_UP, regex('uuid', uuids))}"
                f"[{self.range}]))",
                self.at,
            )
            gpus = {_l(s, "uuid"): (_l(s, "gpu"), _l(s, "instance")) for s in up}
        out = {}
        for rank, (uuid, instance) in ranks.items():
            gpu, host = gpus.get(uuid, ("", instance))
            out[rank] = (uuid, gpu, host or instance)
        return out

    def throttled(self, uuids: list[str], coverage: float) -> dict[str, list[tuple[str, float]]]:
        """Per GPU uuid, the throttle reasons active for at least ``throttle_fraction`` of the time the
        steps were slow (``coverage``: that time's share of the range)."""
        if not uuids:
            return {}
        reasons = regex("reason", self.cfg.throttle_reasons)
        expr = self._n(N.GPU_CLOCK_EVENT_ACTIVE, regex("uuid", uuids), reasons)
        asked = self.ask(f"max by (uuid, reason) (avg_over_time({expr}[{self.range}]))", self.at)
        fractions = _values(asked, "uuid", "reason")
        out: dict[str, list[tuple[str, float]]] = {}
        for (uuid, reason), frac in sorted(fractions.items()):
            if frac >= self.cfg.throttle_fraction * coverage:
                out.setdefault(uuid, []).append((reason, frac))
        return out

    def pcie(self, host: str) -> list[tuple[str, str, float, float]]:
        """``(pci_address, kind, width, max width)`` of the host's PCIe links below their width."""
        width = self._n(F.PCIE_LINK_WIDTH, eq("instance", host))
        most = self._n(F.PCIE_LINK_MAX_WIDTH, eq("instance", host))
        keys = ("pci_address", "kind")
        now = _values(self.ask(f"min {by(keys)} (min_over_time({width}[{self.range}]))", self.at), *keys)
        top = _values(self.ask(f"max {by(keys)} (max_over_time({most}[{self.range}]))", self.at), *keys)
        return [(k[0], k[1], v, top[k]) for k, v in sorted(now.items()) if k in top and 0 < v < top[k]]

    def fabric(self, host: str) -> list[tuple[str, float]]:
        """``(where, count)`` of InfiniBand/RoCE errors and carrier changes new on the host's ports."""
        out: list[tuple[str, float]] = []
        for spec, what in ((F.IB_PORT_ERRORS, "errors"), (F.IB_PORT_CARRIER_CHANGES, "carrier changes")):
            expr = self._n(spec, eq("instance", host))
            keys = ("device", "port")
            found = _values(self.ask(f"sum {by(keys)} (increase({expr}[{self.range}]))", self.at), *keys)
            out += [(f"{d} port {p} {what}", v) for (d, p), v in sorted(found.items()) if v > 0]
        return out


def attribute_episode(q: ExplainQueries, ask: Ask, episode: Episode, *, coverage: float = 1.0) -> Episode:
    """The episode with its cause decided from Prometheus (a copy; the evidence lines appended).

    ``coverage``: the share of the episode's range in which steps were slow (a ledger episode's
    :attr:`~babysitter.ledger.slowcause.Episode.slow_share`; for a window ``explain`` looks at, the
    part of it that was slow). A throttle must cover ``throttle_fraction`` of that slow time."""
    e = replace(episode, evidence=list(episode.evidence))
    scan = _Episode(q, ask, e)
    placement = scan.placement()
    culprit = str(e.rank) if e.rank is not None else None
    if culprit is None:
        found = scan.culprit()
        if found is not None:
            culprit, why = found
            e.rank = int(culprit) if culprit.isdigit() else None
            e.evidence.append(why)
    suspects = [culprit] if culprit is not None else sorted(placement)
    if culprit is not None and culprit in placement:
        uuid, gpu, host = placement[culprit]
        e.gpu = e.gpu or uuid or None
        e.host = host or e.host
    uuids = [placement[r][0] for r in suspects if r in placement and placement[r][0]]
    throttles = scan.throttled(uuids, min(1.0, max(coverage, 0.0)))
    if throttles:
        for uuid, reasons in throttles.items():
            ranks = [r for r in suspects if r in placement and placement[r][0] == uuid]
            _, gpu, host = placement[ranks[0]] if ranks else ("", "", "")
            said = ", ".join(f"{reason} {frac:.0%} of the time" for reason, frac in reasons)
            on = f"GPU {gpu or uuid} on {host or '?'} (rank {', '.join(ranks)})"
            e.evidence.append(f"{on} throttled: {said}")
            if e.rank is None and len(ranks) == 1 and ranks[0].isdigit() and len(throttles) == 1:
                e.rank, e.gpu, e.host = int(ranks[0]), uuid, host or None
        e.cause = "gpu_throttling"
        return e
    hosts = sorted({placement[r][2] for r in suspects if r in placement and placement[r][2]})
    for host in hosts:
        for address, kind, width, most in scan.pcie(host):
            e.evidence.append(f"PCIe link of {kind} {address} on {host} at x{width:g} of x{most:g}")
            e.cause = "pcie"
    if e.cause == "pcie":
        return e
    for host in hosts:
        for where, count in scan.fabric(host):
            e.evidence.append(f"{where} on {host}: {count:g} new")
            e.cause = "fabric"
    if e.cause == "fabric":
        return e
    e.cause = "straggler" if culprit is not None else "unknown"
    if e.cause == "unknown":
        e.evidence.append("no rank slower than the others, no GPU throttling, PCIe or fabric trouble seen")
    return e


def attribute(
    client: PromClient,
    split: SlowdownSplit,
    run: str,
    *,
    cluster: str = "",
    cfg: GenerateConfig | None = None,
) -> SlowdownSplit:
    """The split with its :data:`MAX_EPISODES` largest episodes' causes decided from Prometheus.

    Raises :class:`~babysitter.prom.PromError` when Prometheus fails a query."""
    q = ExplainQueries(run, cluster, cfg or GenerateConfig())

    def ask(expr: str, at: float) -> list[Sample]:
        return client.query(expr, at)

    largest = {id(e) for e in sorted(split.episodes, key=lambda e: -e.excess_us)[:MAX_EPISODES]}
    episodes = [
        attribute_episode(q, ask, e, coverage=e.slow_share) if id(e) in largest else e for e in split.episodes
    ]
    rest = len(split.episodes) - len(largest)
    note = f"{rest} smaller episode(s) keep the ledger's verdict" if rest > 0 else ""
    return replace(split, episodes=episodes, source="prometheus", note=note)
