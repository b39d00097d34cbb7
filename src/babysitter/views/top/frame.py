"""What one refresh of ``babysitter top`` shows: runs, nodes and alerts, whatever the source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["AlertRow", "Frame", "NodeRow", "RunRow", "Source", "gpu_key"]


@dataclass(frozen=True)
class RunRow:
    """One training run, aggregated over its ranks."""

    run: str
    ranks: int
    step: int | None = None
    mfu: float | None = None
    goodput: float | None = None
    step_seconds: float | None = None
    last_step_age: float | None = None
    checkpoint_age: float | None = None
    restarts: int | None = None
    #: False for a run Prometheus saw within the lookback that exports nothing now (ended or died).
    reporting: bool = True
    #: Why its MFU dropped, one line from ``babysitter explain`` (None: it did not, or not known yet).
    hint: str | None = None


@dataclass(frozen=True)
class NodeRow:
    """One host (a node agent target): GPU health and Xid errors."""

    instance: str
    gpus: int
    lost: tuple[str, ...] = ()
    xids: dict[str, int] = field(default_factory=dict)
    max_temperature: float | None = None
    mean_utilization: float | None = None

    @property
    def gpus_up(self) -> int:
        """GPUs answering their health queries."""
        return self.gpus - len(self.lost)


@dataclass(frozen=True)
class AlertRow:
    """One active alert (firing or pending) as Prometheus reports it."""

    name: str
    state: str
    severity: str
    labels: dict[str, str]
    since: float | None
    summary: str = ""

    def subject(self) -> str:
        """The labels that tell what the alert is about (run, host, GPU...)."""
        keys = ("run", "instance", "gpu", "xid", "path", "step")
        return " ".join(f"{k}={self.labels[k]}" for k in keys if k in self.labels)


@dataclass(frozen=True)
class Frame:
    """Everything one refresh of the view shows."""

    time: float
    source: str
    runs: tuple[RunRow, ...] = ()
    nodes: tuple[NodeRow, ...] = ()
    alerts: tuple[AlertRow, ...] | None = None  # None: the source cannot know (plain /metrics)
    errors: tuple[str, ...] = ()

    def alerts_for_run(self, run: str) -> list[AlertRow]:
        """Firing alerts labeled with ``run``."""
        return [a for a in self.alerts or () if a.state == "firing" and a.labels.get("run") == run]

    def alerts_for_node(self, instance: str) -> list[AlertRow]:
        """Firing alerts about ``instance`` that carry no run label."""
        return [
            a
            for a in self.alerts or ()
            if a.state == "firing" and a.labels.get("instance") == instance and "run" not in a.labels
        ]


class Source(Protocol):
    """Where frames come from."""

    def frame(self) -> Frame:
        """The current state; never raises for remote failures (they go into ``errors``)."""
        ...


def gpu_key(label: str) -> tuple[int, str]:
    """Numeric labels (GPU index, Xid code) in numeric order, others after them."""
    return (int(label), "") if label.isdigit() else (1 << 30, label)
