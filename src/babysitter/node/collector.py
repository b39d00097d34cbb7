"""The node agent's extension point: a collector is anything with a name that yields metric families.

The agent times every ``collect()`` call and exports ``babysitter_collector_success`` and
``babysitter_collector_duration_seconds``; an exception from one collector marks only that collector
failed (with one log line per distinct error) and never fails the scrape.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client.core import Metric

__all__ = ["Collector"]


class Collector(Protocol):
    """One source of node metrics (GPU, Xid, storage probe, checkpoint sentinel, local trainers)."""

    name: str

    def collect(self) -> Iterable[Metric]:
        """The current metric families; raise on failure (the agent records it)."""
        ...

    def close(self) -> None:
        """Release threads, handles and files; called once at agent shutdown."""
        ...
