"""The culprit host's state at the incident, and the run's ranks, from Prometheus.

The node agent's GPU, Xid, fabric, host and storage series of one ``instance`` (every catalog entry the
node agent exports, selected by name from the catalog, never spelled here), as they were at the
incident's time, and which of its counters grew in the hour before: the Xid codes, AER and link
errors, kernel-log trouble lines the agent counted. For the run: which host each rank reported through
and the last collective each enqueued (a rank that stopped answering is still in Prometheus' memory:
its last value says whether it reached the collective the others wait in).

Every query runs within the gatherer's deadline; a failure is noted in the evidence, never raised.
"""

from __future__ import annotations

from typing import Any

from babysitter.catalog import ALL, MetricSpec
from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.promql import eq, growth, regex, select
from babysitter.prom import PromClient, PromError, Sample

__all__ = ["MAX_SERIES", "host_evidence", "node_specs", "run_evidence"]

#: Series kept per host (the newest state of a 8-GPU, 8-port host is a few hundred).
MAX_SERIES = 600
_WINDOW = "1h"


def node_specs() -> list[MetricSpec]:
    """The catalog entries the node agent exports as plain series (gauges, counters, infos)."""
    return [s for s in ALL if s.source == "node" and s.kind in ("gauge", "counter", "info")]


def _sample(labels: dict[str, str], value: float) -> dict[str, Any]:
    return {"labels": {k: v[:200] for k, v in sorted(labels.items())[:24]}, "value": value}


def host_evidence(
    prom: PromClient, instance: str, *, at: float, cluster: tuple[str, str] | None = None
) -> dict[str, Any]:
    """The node agent's series of ``instance`` at ``at``, and its counters that grew in the hour before
    (named in the label ``metric``: an ``or`` of series that differ only in their name would drop one)."""
    matchers = [eq("instance", instance)] + ([eq(*cluster)] if cluster else [])
    specs = node_specs()
    out: dict[str, Any] = {"instance": instance, "at": at, "series": [], "grew": [], "errors": []}
    names = regex("__name__", sorted(s.name for s in specs))
    try:
        samples = prom.query("{" + ", ".join([names, *matchers]) + "}", at=at)
        samples.sort(key=lambda s: (s.labels.get("__name__", ""), sorted(s.labels.items())))
        out["series"] = [_sample(s.labels, s.value) for s in samples[:MAX_SERIES]]
        out["series_total"] = len(samples)
        out["truncated"] = len(samples) > MAX_SERIES
    except PromError as exc:
        out["errors"].append(f"series: {exc}"[:500])
    # Energy grows all the time: not evidence of anything.
    counters = [s for s in specs if s.kind == "counter" and s is not N.GPU_ENERGY]
    parts = [
        f'label_replace({growth(select(spec, *matchers), _WINDOW)}, "metric", "{spec.name}", "", "")'
        for spec in counters
    ]
    if parts:
        try:
            grew = [
                Sample({k: v for k, v in s.labels.items() if k != "__name__"}, s.value)
                for s in prom.query(" or ".join(parts), at=at)
            ]
            grew.sort(key=lambda s: (s.labels.get("metric", ""), sorted(s.labels.items())))
            out["grew"] = [_sample(s.labels, s.value) for s in grew[:MAX_SERIES]]
            out["window"] = _WINDOW
        except PromError as exc:
            out["errors"].append(f"counters that grew: {exc}"[:500])
    return out


def run_evidence(
    prom: PromClient, run: str, *, at: float, cluster: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Which host each rank of ``run`` reported through, and the last collective each enqueued."""
    matchers = [eq("run", run)] + ([eq(*cluster)] if cluster else [])
    out: dict[str, Any] = {"hosts": {}, "last_enqueued": {}, "errors": []}
    try:
        for sample in prom.query(f"last_over_time({select(T.INFO, *matchers)}[10m])", at=at):
            rank = sample.labels.get("rank", "")
            if rank.isdigit():
                out["hosts"][rank] = sample.labels.get("instance", "")[:200]
    except PromError as exc:
        out["errors"].append(f"ranks' hosts: {exc}"[:500])
    try:
        expr = f"last_over_time({select(R.COLLECTIVE_LAST_ENQUEUED, *matchers)}[10m])"
        for sample in prom.query(expr, at=at):
            rank, group = sample.labels.get("rank", ""), sample.labels.get("pg", "")
            if rank.isdigit() and group:
                out["last_enqueued"].setdefault(group[:100], {})[rank] = int(sample.value)
    except (PromError, ValueError, OverflowError) as exc:
        out["errors"].append(f"ranks' last collectives: {exc}"[:500])
    return out
