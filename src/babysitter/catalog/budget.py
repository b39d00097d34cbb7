"""The series budget: how many series one process, GPU or host may export with the default collectors.

At 16,384 GPUs (2,048 hosts of 8) the budget bounds the whole fleet: about 1.1 million active
series at most, inside what one Mimir, Thanos or VictoriaMetrics tier ingests. Per-rack Prometheus
agents size their ``sample_limit`` from it (:func:`per_node`), and ``tests/test_series_budget.py``
scrapes real exporters and fails when a count goes over.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUDGET", "MEASURED", "Measured", "SeriesBudget", "per_node"]


@dataclass(frozen=True)
class SeriesBudget:
    """Upper bounds on exported series (samples per scrape), by what exports them."""

    #: A training process other than rank 0.
    rank: int = 25
    #: Rank 0: its per-rank series plus the run's (goodput and the ledger's health live there).
    rank0: int = 49
    #: One GPU, as the node agent exports it (series carrying its ``gpu`` label).
    gpu: int = 35
    #: A host's own series: the node agent's health, storage probe and checkpoint sentinel.
    host: int = 30


BUDGET = SeriesBudget()


@dataclass(frozen=True)
class Measured:
    """Series counts of the real exporters in the budget test's scenario (docs/metrics.md shows them).

    ``tests/test_series_budget.py`` fails when a count differs from what it measures, so these are
    never stale; ``*_before`` are the same test run against the code before the budget (16f5ca2).
    """

    rank: int
    rank0: int
    gpu: int
    host: int
    rank_before: int = 66
    rank0_before: int = 83
    gpu_before: int = 34
    host_before: int = 36


MEASURED = Measured(rank=17, rank0=44, gpu=30, host=27)


def per_node(gpus: int = 8, ranks: int = 8, budget: SeriesBudget = BUDGET) -> int:
    """Series one node agent target may serve: the host, its GPUs, and its ranks (one of them rank 0)."""
    if gpus < 0 or ranks < 0:
        raise ValueError("gpus and ranks must not be negative")
    rank0 = budget.rank0 if ranks else 0
    return budget.host + gpus * budget.gpu + max(ranks - 1, 0) * budget.rank + rank0
