"""The one catalog of metrics: exporters, docs, dashboards and alert rules all read it.

Domain modules hold the entries (:mod:`.train`, :mod:`.runtime`, :mod:`.integrity`, :mod:`.goodput`,
:mod:`.node`, :mod:`.fabric`, :mod:`.storage`, :mod:`.probe`, :mod:`.remediate`, :mod:`.selfmon`); this
module joins them and checks that no name is defined twice.
"""

from __future__ import annotations

from babysitter.catalog import (
    budget,
    fabric,
    goodput,
    integrity,
    node,
    probe,
    remediate,
    runtime,
    selfmon,
    storage,
    train,
)
from babysitter.catalog._spec import Kind, MetricSpec

__all__ = [
    "ALL",
    "Kind",
    "MetricSpec",
    "budget",
    "by_name",
    "fabric",
    "goodput",
    "integrity",
    "node",
    "probe",
    "remediate",
    "runtime",
    "selfmon",
    "storage",
    "train",
]

ALL: tuple[MetricSpec, ...] = (
    *train.METRICS,
    *runtime.METRICS,
    *integrity.METRICS,
    *goodput.METRICS,
    *node.METRICS,
    *fabric.METRICS,
    *storage.METRICS,
    *probe.METRICS,
    *remediate.METRICS,
    *selfmon.METRICS,
)


def _index(specs: tuple[MetricSpec, ...]) -> dict[str, MetricSpec]:
    index: dict[str, MetricSpec] = {}
    for spec in specs:
        if spec.name in index:
            raise RuntimeError(f"metric {spec.name!r} is defined twice in the catalog")
        index[spec.name] = spec
    return index


_BY_NAME = _index(ALL)


def by_name(name: str) -> MetricSpec:
    """The catalog entry for an exposed metric name; KeyError when there is none."""
    return _BY_NAME[name]
