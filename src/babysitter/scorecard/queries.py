"""The scorecard's PromQL, built from the catalog (no metric name is spelled here).

Every expression is an instant query evaluated at the end of the window and grouped by the cluster
(or provider) label, so the numbers of clusters of any size are comparable: ratios, rates per 1000
GPU-hours, bytes per second.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import probe as P
from babysitter.catalog import storage as S
from babysitter.catalog import train as T
from babysitter.catalog._spec import MetricSpec

__all__ = ["QuerySet", "duration_seconds"]

_DURATION = re.compile(r"^(\d+)([smhdwy])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def duration_seconds(text: str) -> int:
    """Seconds in a one-unit Prometheus duration (``30d``, ``12h``, ``5m``); ValueError otherwise."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"not a duration (a number and one of s, m, h, d, w, y; e.g. 30d): {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _sel(spec: MetricSpec, matchers: str, suffix: str = "") -> str:
    return f"{spec.name}{suffix}{{{matchers}}}" if matchers else f"{spec.name}{suffix}"


def _join(*parts: str) -> str:
    return ", ".join(p.strip() for p in parts if p and p.strip())


@dataclass(frozen=True)
class QuerySet:
    """The scorecard's queries for one window, grouping label and set of selectors."""

    window: str = "30d"
    by: str = "cluster"
    #: Extra matchers for the MFU comparison: the label(s) that name the model config, e.g.
    #: ``model="llama3-8b", seq_len="8192"`` (MFU is only comparable for the same model and shape).
    mfu_match: str = ""
    #: Extra matchers on every tracker / node agent series (e.g. a job label).
    tracker_selector: str = ""
    node_selector: str = ""
    #: Rate window of the MFU points (at least 4 scrape intervals) and subquery resolution.
    rate_window: str = "5m"
    step: str = "5m"

    def __post_init__(self) -> None:
        for name in ("window", "rate_window", "step"):
            duration_seconds(getattr(self, name))
        if not _LABEL.match(self.by) or self.by.startswith("__"):
            raise ValueError(f"--by must be a label name, got {self.by!r}")
        for name in ("mfu_match", "tracker_selector", "node_selector"):
            value = getattr(self, name)
            if any(ch in value for ch in "{}\n"):
                raise ValueError(f"{name} holds matchers like 'model=\"x\"', without braces: {value!r}")

    @property
    def step_seconds(self) -> int:
        """Subquery resolution in seconds."""
        return duration_seconds(self.step)

    def _per(self, *extra: str) -> str:
        return f"by ({', '.join((self.by, *extra))})"

    def _new_or_increase(self, selector: str) -> str:
        """Counter growth over the window per series, counting the first value of series born in it
        (the agent creates an Xid series at its first error, at 1, which ``increase()`` never sees)."""
        w = self.window
        born = f"(min_over_time({selector}[{w}]) unless {selector} offset {w})"
        grown = f"increase({selector}[{w}])"
        return f"(({grown} + {born}) or {grown} or {born})"

    def mfu(self) -> str:
        """Median over runs of each run's median MFU in the window (only ranks with a known peak);
        every rank's FLOP counter is its share of its replica's, so the sum is the run's under any
        tensor/pipeline/context parallel layout."""
        ts = _join(self.tracker_selector, self.mfu_match)
        peak = _sel(T.PEAK_FLOPS, ts)
        run = self._per("run")
        per_run = (
            f"sum {run} (rate({_sel(T.MODEL_FLOPS, ts)}[{self.rate_window}]) and {peak}) / sum {run} ({peak})"
        )
        return (
            f"quantile {self._per()} (0.5, quantile_over_time(0.5, ({per_run})[{self.window}:{self.step}]))"
        )

    def goodput(self) -> str:
        """Productive over productive + badput seconds of all runs in the window."""
        ts, w, per = self.tracker_selector, self.window, self._per()
        productive = f"sum {per} (increase({_sel(G.PRODUCTIVE_SECONDS, ts)}[{w}]))"
        badput = f"sum {per} (increase({_sel(G.BADPUT_SECONDS, ts)}[{w}]))"
        return f"{productive} / ({productive} + {badput})"

    def _hours(self, selector: str) -> str:
        inner = f"count {self._per()} ({selector})"
        return f"(sum_over_time(({inner})[{self.window}:{self.step}]) * {self.step_seconds} / 3600)"

    def gpu_hours(self) -> str:
        """GPU-hours the node agents saw (GPUs reporting, integrated over the window)."""
        return self._hours(_sel(N.GPU_UP, self.node_selector))

    def rank_hours(self) -> str:
        """Training rank-hours (a rank drives one GPU): the exposure of runs to interruptions."""
        return self._hours(_sel(T.STEPS, self.tracker_selector))

    def restarts(self) -> str:
        """Restarts of all runs in the window (rank 0 of a run exports its restart counter)."""
        return f"sum {self._per()} (increase({_sel(G.RESTARTS, self.tracker_selector)}[{self.window}]))"

    def xid_errors(self) -> str:
        """Xid errors in the window by action bucket."""
        return (
            f"sum {self._per('action')} ({self._new_or_increase(_sel(N.GPU_XID_ERRORS, self.node_selector))})"
        )

    def checkpoint_bandwidth(self) -> str:
        """Checkpoint bytes written over the blocking save time, per rank."""
        ts, w, per = self.tracker_selector, self.window, self._per()
        return (
            f"sum {per} (increase({_sel(T.CKPT_BYTES, ts)}[{w}]))"
            f" / sum {per} (increase({_sel(T.CKPT_SAVE_DURATION, ts, '_sum')}[{w}]))"
        )

    def storage_p99(self) -> str:
        """p99 over hosts of each host's p99 write + fsync time of the agent's storage probe."""
        ns = self.node_selector
        total = f"({_sel(S.STORAGE_PROBE_WRITE, ns)} + {_sel(S.STORAGE_PROBE_FSYNC, ns)})"
        return f"quantile {self._per()} (0.99, quantile_over_time(0.99, {total}[{self.window}:{self.step}]))"

    def probe_peak_ratio(self) -> str:
        """Median over devices of the last probe's matmul throughput over peak."""
        sel = _sel(P.PROBE_MATMUL_PEAK, self.node_selector)
        return f"quantile {self._per()} (0.5, last_over_time({sel}[{self.window}]))"

    def probe_busbw(self) -> str:
        """Median all-reduce bus bandwidth of the probes in the window."""
        sel = _sel(P.PROBE_ALLREDUCE_BUS_BANDWIDTH, self.node_selector)
        return f"quantile {self._per()} (0.5, last_over_time({sel}[{self.window}]))"

    def probe_storage_write(self) -> str:
        """Median checkpoint-sized write bandwidth of the probes in the window."""
        sel = _sel(P.PROBE_STORAGE_WRITE_BANDWIDTH, self.node_selector)
        return f"quantile {self._per()} (0.5, last_over_time({sel}[{self.window}]))"

    def probe_lemons(self) -> str:
        """Devices the last probes flagged as lemons (any check)."""
        sel = _sel(P.PROBE_DEVICE_LEMON, self.node_selector)
        per_device = f"max by ({self.by}, instance, gpu) (last_over_time({sel}[{self.window}]))"
        return f"sum {self._per()} ({per_device})"
