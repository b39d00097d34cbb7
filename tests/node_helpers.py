"""Helpers shared by the node agent tests: scraping a collector, free ports, waiting for files."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["Scrape", "parse_exposition", "read_port_file", "scrape", "wait_for"]


class Scrape:
    """Samples of one collection, looked up by name and a subset of labels."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)
        self.samples = [s for f in self.families for s in f.samples]

    def names(self) -> set[str]:
        """Family names as exposed (counters with ``_total``)."""
        return {s.name for s in self.samples}

    def find(self, name: str, **labels: str) -> list[float]:
        """Values of the samples named ``name`` whose labels include ``labels``."""
        return [
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def matching(self, name: str, **labels: str) -> list[Sample]:
        """The samples named ``name`` whose labels include ``labels`` (with all their labels)."""
        return [
            s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The one sample matching; AssertionError when none or several match."""
        found = self.find(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
        return found[0]

    def series(self, **labels: str) -> list[tuple[str, dict[str, str]]]:
        """(name, labels) of every sample whose labels include ``labels``."""
        return [
            (s.name, s.labels) for s in self.samples if all(s.labels.get(k) == v for k, v in labels.items())
        ]


def scrape(collector: object) -> Scrape:
    """Run ``collector.collect()`` once."""
    return Scrape(collector.collect())  # type: ignore[attr-defined]


def parse_exposition(text: str) -> Scrape:
    """Parse Prometheus text exposition (what /metrics serves)."""
    return Scrape(text_string_to_metric_families(text))


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> object:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)


def read_port_file(path: Path, timeout: float = 15.0) -> str:
    """Wait for an agent's ``--port-file`` and return the address it holds (host:port)."""
    wait_for(lambda: path.exists() and path.read_text().strip(), timeout=timeout)
    return path.read_text().strip()
