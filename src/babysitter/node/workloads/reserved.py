"""What a trainer's endpoint may never serve: the names and labels the agent, Prometheus or the scrape own.

The agent re-serves every registered trainer on its own target, so whatever a trainer serves lands in
Prometheus as if the agent said it, on this host's ``instance``. A local user must not be able to fake
the agent's view of the host (a lemon GPU, a healthy Xid source, a lost checkpoint), Prometheus'
own series (``up``, ``scrape_*``, ``ALERTS``), a recording rule's output (any name with a colon),
another exporter the rules read (dcgm-exporter's ``DCGM_*``) or the monitoring's own series
(``prometheus_*``, ``alertmanager_*``, ``vmalert_*``: a trainer must not page "rule evaluation
failing"), nor set the labels that say where a series comes from (``instance``, ``job``, anything
starting with ``__``).

The agent's families are derived from the catalog, not listed: every entry whose ``source`` is not
what a training process emits (``tracker``, and ``self``: babysitter's own health, which a tracker
reports for itself too) is reserved, by exact name and by its namespace (``gpu_``, ``probe_``,
``babysitter_xid_``...), so a family added to the catalog later is reserved the day it is added.
``tests/test_node_trainers_bound.py`` serves every one of them from a trainer and checks none gets
through.
"""

from __future__ import annotations

import functools

from babysitter import catalog
from babysitter.catalog import MetricSpec

__all__ = [
    "PROMETHEUS_NAMES",
    "RESERVED_LABELS",
    "RESERVED_NAMES",
    "RESERVED_PREFIXES",
    "TRAINER_SOURCES",
    "is_reserved_name",
    "reserved_label",
]

#: Catalog sources a training process exports; every other source is the agent's (or another part's).
TRAINER_SOURCES = frozenset({"tracker", "self"})
#: Series Prometheus writes itself for each target and rule, and another exporter the rules read.
PROMETHEUS_NAMES = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
#: Prometheus's per-scrape series, dcgm-exporter's, and the monitoring's own (Prometheus, Alertmanager,
#: vmalert: RuleEvaluationFailing and the other monitoring alerts read them wherever they come from).
_OTHER_PREFIXES = ("scrape_", "DCGM_", "prometheus_", "alertmanager_", "vmalert_")
#: Labels that say where a series comes from: the scrape's, never a trainer's.
RESERVED_LABELS = frozenset({"instance", "job"})
_SUFFIXES = {
    "counter": ("_created",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


def _exposed(spec: MetricSpec) -> tuple[str, ...]:
    """Every name the entry appears under: as exposed, as prometheus_client names the family, suffixes."""
    return (spec.name, spec.base_name, *(spec.name + s for s in _SUFFIXES.get(spec.kind, ())))


def _namespace(name: str) -> str:
    """``gpu_``, ``probe_``; ``babysitter_xid_`` (babysitter's own names are namespaced one level down)."""
    parts = name.split("_")
    depth = 2 if parts[0] == "babysitter" and len(parts) > 1 else 1
    return "_".join(parts[:depth]) + "_"


_AGENT_SPECS = tuple(spec for spec in catalog.ALL if spec.source not in TRAINER_SOURCES)
#: Exact names of every catalog entry that is not a training process's.
RESERVED_NAMES: frozenset[str] = frozenset(n for spec in _AGENT_SPECS for n in _exposed(spec))
#: Their namespaces, and Prometheus' ``scrape_`` and dcgm-exporter's ``DCGM_``.
RESERVED_PREFIXES: tuple[str, ...] = tuple(
    sorted({_namespace(spec.name) for spec in _AGENT_SPECS} | set(_OTHER_PREFIXES))
)


@functools.lru_cache(maxsize=8192)  # asked for every sample of every rank at every scrape
def is_reserved_name(name: str) -> bool:
    """Whether a trainer may not serve a family or sample of this name."""
    return (
        name in RESERVED_NAMES
        or name in PROMETHEUS_NAMES
        or ":" in name
        or name.startswith(RESERVED_PREFIXES)
    )


def reserved_label(labels: dict[str, str]) -> str | None:
    """The first label of a sample that only the scrape may set, or None."""
    for key in labels:
        if key in RESERVED_LABELS or key.startswith("__"):
            return key
    return None
