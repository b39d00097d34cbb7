"""The shape of one catalog entry, and how an entry becomes a Prometheus metric family.

Every exporter, the docs, the dashboards and the alert rules take names from catalog entries;
nothing else in the code base spells a metric name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)

__all__ = ["Kind", "MetricSpec", "Ranks"]

Kind = Literal["counter", "gauge", "histogram", "summary", "info"]
Source = Literal["tracker", "node", "probe", "self", "remediate"]
#: Which training ranks export a tracker metric: every rank, or rank 0 alone (the run's view).
Ranks = Literal["all", "rank0"]

#: The catalog's units as UCUM, the unit syntax OpenTelemetry instruments carry.
_UCUM = {
    "seconds": "s",
    "bytes": "By",
    "ratio": "1",
    "flops": "{flop}",
    "watts": "W",
    "joules": "J",
    "celsius": "Cel",
    "hertz": "Hz",
}


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its exposed name, type, unit, help text and label names.

    ``name`` is the name as Prometheus stores it (counters end in ``_total``, info metrics in
    ``_info``); histograms expose ``name_bucket``/``name_sum``/``name_count``, summaries
    ``name{quantile}`` (for each of ``quantiles``, where they are computed) and ``name_sum``/``name_count``.
    ``ranks`` says which training ranks export a tracker metric (the series budget's main lever:
    per-rank series are multiplied by the GPU count, rank 0's are not). ``counts`` names what a
    unitless count counts (``token``), for its UCUM unit ``{token}``.
    """

    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    source: Source = "tracker"
    buckets: tuple[float, ...] = field(default=())
    quantiles: tuple[float, ...] = field(default=())
    ranks: Ranks = "all"
    counts: str = ""

    def __post_init__(self) -> None:
        if self.unit and self.unit not in _UCUM:
            raise ValueError(f"unit {self.unit!r} of {self.name!r} has no UCUM form; add it to _UCUM")
        if self.counts and self.unit:
            raise ValueError(f"{self.name!r} has a unit; counts= is for unitless counts")
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name!r} must end in _total")
        if self.kind == "info" and not self.name.endswith("_info"):
            raise ValueError(f"info metric {self.name!r} must end in _info")
        if self.kind == "histogram" and not self.buckets:
            raise ValueError(f"histogram {self.name!r} needs buckets")
        if self.quantiles and self.kind != "summary":
            raise ValueError(f"only summaries have quantiles: {self.name!r}")
        if any(not 0 < q < 1 for q in self.quantiles):
            raise ValueError(f"quantiles of {self.name!r} must lie strictly between 0 and 1")
        if self.unit == "ratio" and not self.name.endswith("_ratio"):
            raise ValueError(f"ratio metric {self.name!r} must end in _ratio")

    @property
    def ucum(self) -> str:
        """The unit in UCUM, as OpenTelemetry expects it: ``s``, ``By``, ``1``, ``{token}``, ``{flop}/s``."""
        unit = _UCUM[self.unit] if self.unit else (f"{{{self.counts}}}" if self.counts else "1")
        return f"{unit}/s" if self.name.endswith("_per_second") else unit

    @property
    def base_name(self) -> str:
        """The name prometheus_client's families take (it appends ``_total``/``_info`` itself)."""
        if self.kind == "counter":
            return self.name[: -len("_total")]
        if self.kind == "info":
            return self.name[: -len("_info")]
        return self.name

    def family(self, extra_labels: Sequence[str] = ()) -> Metric:
        """A fresh, empty metric family for this entry; ``extra_labels`` go first (run, rank...)."""
        labels = [*extra_labels, *self.labels]
        if self.kind == "counter":
            return CounterMetricFamily(self.base_name, self.help, labels=labels)
        if self.kind == "gauge":
            return GaugeMetricFamily(self.name, self.help, labels=labels)
        if self.kind == "histogram":
            return HistogramMetricFamily(self.name, self.help, labels=labels)
        if self.kind == "summary":
            return SummaryMetricFamily(self.name, self.help, labels=labels)
        return InfoMetricFamily(self.base_name, self.help, labels=labels)
