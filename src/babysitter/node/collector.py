"""The node agent's extension point: a collector is anything with a name that yields metric families.

The agent times every ``collect()`` call and exports ``babysitter_collector_success`` and
``babysitter_collector_duration_seconds``; an exception from one collector marks only that collector
failed (with one log line per distinct error) and never fails the scrape.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import Metric

from babysitter.catalog import MetricSpec
from babysitter.export.text import Rows
from babysitter.labels import normalize_pci_bus_id

__all__ = ["Collector", "GpuIdentity", "family_of", "normalize_pci_bus_id"]


class Collector(Protocol):
    """One source of node metrics (GPU, Xid, storage probe, checkpoint sentinel, local trainers)."""

    name: str

    def collect(self) -> Iterable[Metric]:
        """The current metric families; raise on failure (the agent records it)."""
        ...

    def close(self) -> None:
        """Release threads, handles and files; called once at agent shutdown."""
        ...


@dataclass(frozen=True)
class GpuIdentity:
    """Who a GPU is, as every per-GPU series labels it (``gpu``, ``uuid``, ``pci_bus_id``, ``model``)."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str

    def label_values(self) -> tuple[str, str, str, str]:
        """Values in the order of :data:`babysitter.catalog.node.GPU_LABELS`."""
        return (str(self.index), self.uuid, normalize_pci_bus_id(self.pci_bus_id), self.model)


def family_of(spec: MetricSpec) -> Metric:
    """An empty family for a catalog entry, as a collector fills it: gauges and counters as
    :class:`~babysitter.export.text.Rows` (rendered without a sample object per series), the rest as
    ``spec.family()`` makes them."""
    if spec.kind == "counter":
        return Rows(spec.base_name, spec.help, "counter", spec.labels)
    if spec.kind == "gauge":
        return Rows(spec.name, spec.help, "gauge", spec.labels)
    return spec.family()
