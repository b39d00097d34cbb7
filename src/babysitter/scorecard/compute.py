"""Build the scorecard: one row of comparable numbers per cluster, and a ranking.

Clusters are ranked by effective MFU = MFU x goodput: the fraction of the peak FLOP/s a team pays
for that became kept model progress. It folds in the two things that differ most between clusters
of the same GPU (speed, and time lost to failures, restarts and slow checkpoints). A cluster
without MFU data ranks after those with it, by goodput; ties fall to fewer interruptions.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from babysitter.catalog import node as N
from babysitter.prom import PromClient, PromError, Sample, finite
from babysitter.scorecard.queries import QuerySet

__all__ = ["METRICS", "ClusterScore", "MetricInfo", "Scorecard", "build_scorecard"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricInfo:
    """How one scorecard column reads: its title, unit and which direction is better."""

    key: str
    title: str
    unit: str  # "ratio", "per1000h", "Bps", "s", "count"
    higher_is_better: bool


#: The scorecard's columns, in display order.
METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("effective_mfu", "effective MFU (MFU x goodput)", "ratio", True),
    MetricInfo("mfu", "MFU (median of runs)", "ratio", True),
    MetricInfo("goodput", "goodput", "ratio", True),
    MetricInfo("slowdown_share", "GPU time lost to slow steps", "ratio", False),
    MetricInfo("failure_share", "GPU time lost to failures (restarts, hangs)", "ratio", False),
    MetricInfo("interruptions_per_1000_gpu_hours", "interruptions / 1000 GPU-h", "per1000h", False),
    MetricInfo("xid_per_1000_gpu_hours", "Xid errors / 1000 GPU-h (all)", "per1000h", False),
    MetricInfo("checkpoint_bytes_per_second", "checkpoint save B/s per rank", "Bps", True),
    MetricInfo("storage_p99_seconds", "storage probe p99 write+fsync", "s", False),
    MetricInfo("probe_peak_ratio", "probe matmul / peak", "ratio", True),
    MetricInfo("probe_busbw_bytes_per_second", "probe all-reduce busbw", "Bps", True),
    MetricInfo("probe_storage_write_bytes_per_second", "probe ckpt write B/s", "Bps", True),
    MetricInfo("probe_lemons", "probe lemon devices", "count", False),
)


@dataclass
class ClusterScore:
    """The scorecard numbers of one cluster (None: no data for it in the window)."""

    cluster: str
    rank: int = 0
    mfu: float | None = None
    goodput: float | None = None
    #: Shares of the runs' GPU time lost to slow steps and to failures, and the slow share by cause.
    slowdown_share: float | None = None
    failure_share: float | None = None
    slowdown_by_cause: dict[str, float] = field(default_factory=dict)
    gpu_hours: float | None = None
    rank_hours: float | None = None
    #: GPU-hours the runs lost (badput of every cause, by ranks), and what one costs on this cluster.
    gpu_hours_lost: float | None = None
    price_per_gpu_hour: float | None = None
    restarts: float | None = None
    interruptions_per_1000_gpu_hours: float | None = None
    xid_by_action: dict[str, float] = field(default_factory=dict)
    xid_per_1000_gpu_hours_by_action: dict[str, float] = field(default_factory=dict)
    checkpoint_bytes_per_second: float | None = None
    storage_p99_seconds: float | None = None
    probe_peak_ratio: float | None = None
    probe_busbw_bytes_per_second: float | None = None
    probe_storage_write_bytes_per_second: float | None = None
    probe_lemons: float | None = None

    @property
    def effective_mfu(self) -> float | None:
        """MFU x goodput: peak FLOP/s paid for that became kept progress."""
        if self.mfu is None or self.goodput is None:
            return None
        return self.mfu * self.goodput

    @property
    def money_lost(self) -> float | None:
        """GPU-hours lost x the cluster's price (None without either)."""
        if self.gpu_hours_lost is None or self.price_per_gpu_hour is None:
            return None
        return self.gpu_hours_lost * self.price_per_gpu_hour

    @property
    def xid_per_1000_gpu_hours(self) -> float | None:
        """All Xid errors per 1000 GPU-hours (None without GPU-hours)."""
        if not self.gpu_hours:
            return None
        return 1000.0 * sum(self.xid_by_action.values()) / self.gpu_hours

    def value(self, key: str) -> float | None:
        """A column's value by :class:`MetricInfo` key."""
        value = getattr(self, key)
        return None if value is None else float(value)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, derived columns included."""
        data = asdict(self)
        data["effective_mfu"] = self.effective_mfu
        data["money_lost"] = self.money_lost
        data["xid_per_1000_gpu_hours"] = self.xid_per_1000_gpu_hours
        return data


@dataclass
class Scorecard:
    """Clusters side by side over one window, best first."""

    by: str
    window: str
    at: float
    clusters: list[ClusterScore]
    queries: dict[str, str] = field(default_factory=dict)
    mfu_match: str = ""
    #: The currency of the clusters' prices (``money_lost``), as the user named it.
    currency: str = "USD"

    def best(self, key: str) -> str | None:
        """The cluster with the best value of a column, None when no cluster has one."""
        info = next(m for m in METRICS if m.key == key)
        scored = [(c.value(key), c.cluster) for c in self.clusters if c.value(key) is not None]
        if not scored:
            return None
        pick = max if info.higher_is_better else min
        return pick(scored, key=lambda item: item[0] if item[0] is not None else math.nan)[1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready scorecard."""
        return {
            "by": self.by,
            "window": self.window,
            "at": self.at,
            "clusters": [c.to_dict() for c in self.clusters],
            "best": {m.key: self.best(m.key) for m in METRICS},
            "mfu_match": self.mfu_match,
            "currency": self.currency,
            "queries": self.queries,
        }


def _by_cluster(samples: list[Sample], label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples:
        name = s.labels.get(label)
        value = finite(s.value)
        if name and value is not None:
            out[name] = value
    return out


def _rank_key(c: ClusterScore) -> tuple[int, float, float, float]:
    eff = c.effective_mfu
    interruptions = c.interruptions_per_1000_gpu_hours
    return (
        0 if eff is not None else 1,
        -(eff if eff is not None else (c.goodput or 0.0)),
        interruptions if interruptions is not None else math.inf,
        -(c.mfu or 0.0),
    )


def build_scorecard(
    client: PromClient,
    queries: QuerySet,
    *,
    at: float | None = None,
    prices: Mapping[str, float] | None = None,
    default_price: float | None = None,
    currency: str = "USD",
) -> Scorecard:
    """Query Prometheus and assemble the scorecard; PromError when Prometheus fails a query.

    ``prices``: per cluster, what a GPU-hour costs there (``default_price`` for the others; None: no
    money row for that cluster)."""
    when = time.time() if at is None else at
    label = queries.by
    exprs: dict[str, str] = {
        "mfu": queries.mfu(),
        "goodput": queries.goodput(),
        "slowdown_share": queries.slowdown_share(),
        "failure_share": queries.failure_share(),
        "slowdown_by_cause": queries.slowdown_by_cause(),
        "gpu_hours": queries.gpu_hours(),
        "rank_hours": queries.rank_hours(),
        "gpu_hours_lost": queries.gpu_hours_lost(),
        "restarts": queries.restarts(),
        "xid_errors": queries.xid_errors(),
        "checkpoint_bytes_per_second": queries.checkpoint_bandwidth(),
        "storage_p99_seconds": queries.storage_p99(),
        "probe_peak_ratio": queries.probe_peak_ratio(),
        "probe_busbw_bytes_per_second": queries.probe_busbw(),
        "probe_storage_write_bytes_per_second": queries.probe_storage_write(),
        "probe_lemons": queries.probe_lemons(),
    }
    results: dict[str, list[Sample]] = {}
    for key, expr in exprs.items():
        results[key] = client.query(expr, when)
    clusters: dict[str, ClusterScore] = {}

    def get(name: str) -> ClusterScore:
        return clusters.setdefault(name, ClusterScore(name))

    for key in exprs:
        if key in ("xid_errors", "slowdown_by_cause"):
            continue
        for name, value in _by_cluster(results[key], label).items():
            setattr(get(name), key, value)
    for sample in results["xid_errors"]:
        cluster, xid = sample.labels.get(label), finite(sample.value)
        if cluster and xid is not None:
            get(cluster).xid_by_action[sample.labels.get("action", "unknown")] = xid
    for sample in results["slowdown_by_cause"]:
        cluster, share = sample.labels.get(label), finite(sample.value)
        if cluster and share is not None:
            get(cluster).slowdown_by_cause[sample.labels.get("slowdown_cause", "unknown")] = share
    for c in clusters.values():
        c.price_per_gpu_hour = (prices or {}).get(c.cluster, default_price)
        c.slowdown_by_cause = dict(sorted(c.slowdown_by_cause.items(), key=lambda kv: -kv[1]))
        if c.restarts is not None and c.rank_hours:
            c.interruptions_per_1000_gpu_hours = 1000.0 * c.restarts / c.rank_hours
        if c.gpu_hours:
            c.xid_per_1000_gpu_hours_by_action = {
                a: 1000.0 * v / c.gpu_hours for a, v in sorted(c.xid_by_action.items())
            }
        elif c.xid_by_action:
            log.warning(
                "cluster %s: Xid errors but no GPU-hours (no %s series): rate not computed",
                c.cluster,
                N.GPU_UP.name,
            )
    ordered = sorted(clusters.values(), key=_rank_key)
    for i, c in enumerate(ordered, start=1):
        c.rank = i
    return Scorecard(
        by=label,
        window=queries.window,
        at=when,
        clusters=ordered,
        queries=exprs,
        mfu_match=queries.mfu_match,
        currency=currency,
    )


__all__ += ["PromError"]
