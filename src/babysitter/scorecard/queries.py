"""The scorecard's PromQL, built from the catalog and the recording rules (no metric name is spelled here).

Every expression is an instant query evaluated at the end of the window and grouped by the cluster
(or provider) label, so the numbers of clusters of any size are comparable: ratios, rates per 1000
GPU-hours, bytes per second.

Over 30 days a query over raw per-rank series reads billions of samples at 16,384 GPUs; these read
the run- and cluster-level recording rules of ``alerts/babysitter-rules.yaml`` (one series per run or
per cluster) through subqueries at ``step`` resolution, so a 30-day scorecard touches thousands of
samples per run. The rules must be loaded where the scorecard queries (Prometheus, or the central
tier's ruler), generated with the same rate window and with ``--by`` as their cluster label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from babysitter.generate.config import GenerateConfig
from babysitter.generate.rules import Records

__all__ = ["QuerySet", "duration_seconds"]

_DURATION = re.compile(r"^(\d+)([smhdwy])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def duration_seconds(text: str) -> int:
    """Seconds in a one-unit Prometheus duration (``30d``, ``12h``, ``5m``); ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"not a duration (a number and one of s, m, h, d, w, y; e.g. 30d): {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _join(*parts: str) -> str:
    return ", ".join(p.strip() for p in parts if p and p.strip())


@dataclass(frozen=True)
class QuerySet:
    """The scorecard's queries for one window, grouping label and set of selectors."""

    window: str = "30d"
    by: str = "cluster"
    #: Extra matchers for the MFU comparison: the label(s) that name the model config, e.g.
    #: ``model="llama3-8b", seq_len="8192"`` (MFU is only comparable for the same model and shape).
    #: They match the run-level rules, which keep such labels when generated with them in
    #: ``GenerateConfig.run_labels``.
    mfu_match: str = ""
    #: Extra matchers on the training / node roll-up rules (their labels: the cluster label, ``run``
    #: and the run labels on run-level rules).
    tracker_selector: str = ""
    node_selector: str = ""
    #: Rate window of the MFU points (at least 4 scrape intervals) and subquery resolution.
    rate_window: str = "5m"
    step: str = "5m"

    def __post_init__(self) -> None:
        for name in ("window", "rate_window", "step"):
            duration_seconds(getattr(self, name))
        if not _LABEL.fullmatch(self.by) or self.by.startswith("__"):
            raise ValueError(f"--by must be a label name, got {self.by!r}")
        for name in ("mfu_match", "tracker_selector", "node_selector"):
            value = getattr(self, name)
            if any(ch in value for ch in "{}\n"):
                raise ValueError(f"{name} holds matchers like 'model=\"x\"', without braces: {value!r}")

    @property
    def step_seconds(self) -> int:
        """Subquery resolution in seconds."""
        return duration_seconds(self.step)

    @property
    def rules(self) -> Records:
        """The recording rules read, named as ``babysitter generate`` names them for this rate window."""
        return Records(GenerateConfig(cluster_label=self.by, rate_window=self.rate_window))

    def _per(self, *extra: str) -> str:
        return f"by ({', '.join((self.by, *extra))})"

    def _rule(self, record: str, *matchers: str) -> str:
        inner = _join(*matchers)
        return f"{record}{{{inner}}}" if inner else record

    def _over(self, fn: str, selector: str, *args: str, step: str = "") -> str:
        """``fn`` over the window of a rule series, sampled every ``step`` (a subquery)."""
        return f"{fn}({''.join(f'{a}, ' for a in args)}{selector}[{self.window}:{step or self.step}])"

    def mfu(self) -> str:
        """Median over runs of each run's median MFU in the window (the run rule counts only ranks with
        a known peak; every rank's FLOP counter is its share of its replica's, so the run's MFU holds
        under any tensor/pipeline/context parallel layout)."""
        mfu = self._rule(self.rules.mfu, self.tracker_selector, self.mfu_match)
        return f"quantile {self._per()} (0.5, {self._over('quantile_over_time', mfu, '0.5')})"

    def _counter(self, record: str) -> str:
        """Growth over the window of a run-level counter roll-up, summed per cluster."""
        return f"sum {self._per()} ({self._over('increase', self._rule(record, self.tracker_selector))})"

    def _integral(self, record: str, selector: str) -> str:
        """The integral over the window of a per-second rate rule, summed per cluster."""
        rule = self._rule(record, selector)
        return f"(sum {self._per()} ({self._over('sum_over_time', rule)}) * {self.step_seconds})"

    def goodput(self) -> str:
        """Productive over productive + badput seconds of all runs in the window."""
        productive = self._counter(self.rules.productive_total)
        badput = self._counter(self.rules.badput_total)
        return f"{productive} / ({productive} + {badput})"

    def _gpu_seconds(self, record: str) -> str:
        """Growth over the window of a run-level seconds counter, each run's weighted by its ranks (one
        GPU each): GPU-seconds, summed per cluster."""
        grown = self._over("increase", self._rule(record, self.tracker_selector))
        ranks = self._over("max_over_time", self._rule(self.rules.slowdown.ranks, self.tracker_selector))
        return f"sum {self._per()} ({grown}\n* on ({', '.join(self.rules.run_key)}) group_left ()\n{ranks})"

    def _gpu_wall(self) -> str:
        productive, badput = self.rules.productive_total, self.rules.badput_total
        return f"({self._gpu_seconds(productive)}\n+ {self._gpu_seconds(badput)})"

    def gpu_hours_lost(self) -> str:
        """GPU-hours the runs lost: their badput of every cause (failures, slow steps, data stalls,
        checkpoints), weighted by ranks; what the scorecard's money row prices."""
        return f"({self._gpu_seconds(self.rules.badput_total)}\n/ 3600)"

    def slowdown_share(self) -> str:
        """Share of the runs' GPU time lost to slow steps (the ledger's slowdown, weighted by ranks)."""
        return f"{self._gpu_seconds(self.rules.slowdown.slowdown_total)}\n/\n{self._gpu_wall()}"

    def failure_share(self) -> str:
        """Share of the runs' GPU time lost to failures: downtime, lost progress, startup, checkpoint
        loads and hangs (the price of restarts)."""
        return f"{self._gpu_seconds(self.rules.slowdown.failure_total)}\n/\n{self._gpu_wall()}"

    def slowdown_by_cause(self) -> str:
        """Share of the runs' GPU time lost to slow steps, by the likely cause the rule named."""
        rule = self._rule(self.rules.slowdown.gpu_rate_by_cause, self.tracker_selector)
        summed = self._over("sum_over_time", rule)
        lost = f"sum {self._per('slowdown_cause')} ({summed}) * {self.step_seconds}"
        return f"{lost}\n/ on ({self.by}) group_left ()\n{self._gpu_wall()}"

    def _hours(self, record: str, selector: str) -> str:
        return f"({self._integral(record, selector)} / 3600)"

    def gpu_hours(self) -> str:
        """GPU-hours the node agents saw (GPUs reporting, integrated over the window)."""
        return self._hours(self.rules.cluster_gpus, self.node_selector)

    def rank_hours(self) -> str:
        """Training rank-hours (a rank drives one GPU): the exposure of runs to interruptions."""
        return self._hours(self.rules.cluster_ranks, self.tracker_selector)

    def restarts(self) -> str:
        """Restarts of all runs in the window (from each run's restart counter, across hosts)."""
        return self._counter(self.rules.restarts_total)

    def xid_errors(self) -> str:
        """Xid errors in the window by action bucket (the rule counts the first error of a new series).

        The rule counts the errors of the last rate window, so it is read once per rate window: its
        values then cover the window without overlap."""
        rule = self._rule(self.rules.xid_new, self.node_selector)
        return f"sum {self._per('action')} ({self._over('sum_over_time', rule, step=self.rate_window)})"

    def checkpoint_bandwidth(self) -> str:
        """Checkpoint bytes written over the blocking save time, all ranks of all runs."""
        written = self._integral(self.rules.checkpoint_bytes_rate, self.tracker_selector)
        blocked = self._integral(self.rules.checkpoint_save_rate, self.tracker_selector)
        return f"{written} / {blocked}"

    def storage_p99(self) -> str:
        """p99 over the window of the p99 over hosts of the storage probe's write + fsync time."""
        rule = self._rule(self.rules.storage_probe_p99, self.node_selector)
        return f"max {self._per()} ({self._over('quantile_over_time', rule, '0.99')})"

    def _last(self, record: str) -> str:
        rule = self._rule(record, self.node_selector)
        return f"max {self._per()} ({self._over('last_over_time', rule)})"

    def probe_peak_ratio(self) -> str:
        """Median over devices of the last probe's matmul throughput over peak."""
        return self._last(self.rules.probe_peak_median)

    def probe_busbw(self) -> str:
        """Median all-reduce bus bandwidth of the probes in the window."""
        return self._last(self.rules.probe_busbw_median)

    def probe_storage_write(self) -> str:
        """Median checkpoint-sized write bandwidth of the probes in the window."""
        return self._last(self.rules.probe_storage_write_median)

    def probe_lemons(self) -> str:
        """Devices the last probes flagged as lemons (any check)."""
        return self._last(self.rules.probe_lemons)
