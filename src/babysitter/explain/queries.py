"""The PromQL ``babysitter explain`` runs, built from the catalog and the recording rules (no metric
name is spelled here).

Every query is an instant query over one run (``run`` and, when given, the cluster label), evaluated
either at the end of the window or at the end of the baseline; ranges are whole seconds so any
window works. Counters the ledger continues across restarts (badput, restarts) are read as their
last value at two times and subtracted in Python (a restart on another host starts a new series
at the old total, which ``increase()`` would miss); per-process counters use ``increase()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from babysitter.catalog import MetricSpec
from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, eq, growth, join_matchers, select
from babysitter.generate.rules import Records

__all__ = ["ExplainQueries"]


def _r(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


@dataclass(frozen=True)
class ExplainQueries:
    """The queries for one run; ``cfg`` names the recording rules exactly as ``babysitter generate``."""

    run: str
    cluster: str = ""
    cfg: GenerateConfig = field(default_factory=GenerateConfig)
    #: Resolution of the subqueries that find when something began.
    step_seconds: int = 60

    @property
    def rules(self) -> Records:
        """The recording rules read (the rank-to-GPU join, rank step times, the storage probe)."""
        return Records(self.cfg)

    @property
    def matchers(self) -> str:
        """``run="..."`` (and the cluster), the matchers every run-level query carries."""
        parts = [eq("run", self.run)]
        if self.cluster:
            parts.append(eq(self.cfg.cluster_label, self.cluster))
        return join_matchers(*parts)

    def _t(self, spec: MetricSpec, *extra: str, suffix: str = "") -> str:
        return select(spec, self.cfg.tracker_selector, self.matchers, *extra, suffix=suffix)

    def _rule(self, record: str, *extra: str) -> str:
        return f"{record}{{{join_matchers(self.matchers, *extra)}}}"

    def _res(self, seconds: float) -> str:
        """Resolution of a "since when" subquery over ``seconds``: 1/60 of it, 1 s to ``step_seconds``
        (a fixed minute missed every start inside a window of a few minutes)."""
        return _r(min(self.step_seconds, max(1.0, seconds / 60)))

    # --- throughput and job shape ---------------------------------------------------------------

    def tokens(self, seconds: float) -> str:
        """Tokens of the whole job in the range (each rank's share summed)."""
        return f"sum(increase({self._t(T.TOKENS)}[{_r(seconds)}]))"

    def rank_steps(self, seconds: float) -> str:
        """Steps in the range summed over the ranks: with :meth:`tokens`, tokens per step per rank over
        the samples each rank has (a rank whose series end in the range loses as many steps as tokens)."""
        return f"sum(increase({self._t(T.STEPS)}[{_r(seconds)}]))"

    def model_flops(self, seconds: float) -> str:
        """Model FLOPs of the ranks with a known peak in the range."""
        return f"sum(increase({self._t(T.MODEL_FLOPS)}[{_r(seconds)}]))"

    def peak(self, seconds: float) -> str:
        """Summed dense peak of the ranks seen in the range."""
        return f"sum(max_over_time({self._t(T.PEAK_FLOPS)}[{_r(seconds)}]))"

    def ranks(self) -> str:
        """Ranks reporting at the evaluation time (over the last rate window)."""
        w = self.cfg.rate_window
        return f"count(count by (rank) (last_over_time({self._t(T.STEPS)}[{w}])))"

    # --- ranks and their GPUs (the join rules) ----------------------------------------------------

    def rank_gpu(self, seconds: float) -> str:
        """Each rank's GPU (uuid, host target, index, model) seen in the range."""
        return f"last_over_time({self._rule(self.rules.rank_gpu)}[{_r(seconds)}])"

    def _finite_mean(self, record: str, seconds: float) -> str:
        """Mean of a rule's finite values over the range.

        The step-time rules divide two rates, so while a run does not step (a hang, a restart's
        downtime) they are 0/0 = NaN, and one NaN makes ``avg_over_time`` NaN: a baseline that
        overlapped a hang would have no step time at all. ``x == x`` drops the NaN samples; the
        subquery samples the range at 1/60 of its length (at least 1 s)."""
        rule = self._rule(record)
        return f"avg_over_time(({rule} == {rule})[{_r(seconds)}:{_r(seconds / 60)}])"

    def rank_step_mean(self, seconds: float) -> str:
        """Each rank's mean step time over the range (its stepping time only)."""
        return self._finite_mean(self.rules.rank_step_mean, seconds)

    def rank_step_median(self, seconds: float) -> str:
        """Each rank's median step time over the range: a stuck step in the rule's rate window (the
        end of a hang) skews the mean of a short range, not its median."""
        rule = self._rule(self.rules.rank_step_mean)
        return f"quantile_over_time(0.5, ({rule} == {rule})[{_r(seconds)}:{_r(seconds / 60)}])"

    def rank_step_ratio_median(self, seconds: float) -> str:
        """Each rank's median step time over the median rank's, over the range."""
        rule = self._rule(self.rules.rank_step_ratio)
        return f"quantile_over_time(0.5, ({rule} == {rule})[{_r(seconds)}:{_r(seconds / 60)}])"

    def first_seen(self, seconds: float) -> str:
        """When the run first had series in the range (a run younger than the range covers less)."""
        steps = f"max({self._t(T.STEPS)})"
        return f"min_over_time(timestamp({steps})[{_r(seconds)}:{self._res(seconds)}])"

    def rank_step_ratio(self, seconds: float) -> str:
        """Each rank's step time over the median rank's, averaged over the range (stepping time only)."""
        return self._finite_mean(self.rules.rank_step_ratio, seconds)

    def straggling_since(self, seconds: float) -> str:
        """When each rank first stepped slower than the straggler threshold in the range."""
        ratio = f"{self._rule(self.rules.rank_step_ratio)} > {self.cfg.straggler_ratio:g}"
        return f"min_over_time(timestamp({ratio})[{_r(seconds)}:{self._res(seconds)}])"

    # --- collectives (torch's flight recorder): lockstep stragglers and the culprit of a hang ----------

    def straggler_score(self, seconds: float) -> str:
        """Each rank's in-process straggler score (collective arrival where the recorder is on),
        averaged over the range."""
        return f"avg_over_time({self._t(R.STRAGGLER_SCORE)}[{_r(seconds)}])"

    def collective_lag(self, seconds: float) -> str:
        """How much later than the median rank each rank arrives at collectives, averaged over the range."""
        return f"avg_over_time({self._t(R.COLLECTIVE_LAG)}[{_r(seconds)}])"

    def rank_host(self, seconds: float) -> str:
        """Each rank's host and GPU (the host rule), seen in the range."""
        return f"last_over_time({self._rule(self.rules.collectives.host)}[{_r(seconds)}])"

    def culprit(self, seconds: float) -> str:
        """The ranks a hang in the range waited for (the culprit rule), with their host, GPU, collective."""
        return f"last_over_time({self._rule(self.rules.collectives.culprit)}[{_r(seconds)}])"

    def waiting(self, seconds: float) -> str:
        """The ranks that waited in a collective in the range, and which."""
        return f"last_over_time({self._rule(self.rules.collectives.waiting)}[{_r(seconds)}])"

    def throttle(self, seconds: float) -> str:
        """Fraction of the range each throttling reason was active on each rank's GPU."""
        return f"avg_over_time({self._rule(self.rules.rank_gpu_throttle)}[{_r(seconds)}])"

    def throttled_since(self, seconds: float) -> str:
        """When each throttling reason of each rank's GPU was first active in the range."""
        active = f"{self._rule(self.rules.rank_gpu_throttle)} > 0"
        return f"min_over_time(timestamp({active})[{_r(seconds)}:{self._res(seconds)}])"

    def sm_clock(self, seconds: float) -> str:
        """Mean SM clock of each rank's GPU over the range."""
        return f"avg_over_time({self._rule(self.rules.rank_gpu_sm_clock)}[{_r(seconds)}])"

    def temperature(self, seconds: float) -> str:
        """Highest core temperature of each rank's GPU in the range."""
        return f"max_over_time({self._rule(self.rules.rank_gpu_temperature)}[{_r(seconds)}])"

    def _of_run(self, seconds: float) -> str:
        return f"on ({self.cfg.cluster_label}, uuid) {self.rank_gpu(seconds)}"

    def xid_new(self, window: float, memory: float) -> str:
        """Xid errors new in the window on the run's GPUs, by GPU and code."""
        ns = select(N.GPU_XID_ERRORS, self.cfg.node_selector, 'uuid!=""')
        keep = by((self.cfg.cluster_label, "instance", *N.GPU_LABELS, "xid", "action"))
        return f"sum {keep} ({growth(ns, _r(window), _r(memory))})\nand {self._of_run(window + memory)}"

    def gpu_lost(self, window: float, memory: float) -> str:
        """The run's GPUs that stopped answering in the window (their ``up`` 0 at some point)."""
        up = select(N.GPU_UP, self.cfg.node_selector, 'uuid!=""')
        return f"min_over_time({up}[{_r(window)}]) == 0\nand {self._of_run(window + memory)}"

    def gpu_lost_since(self, window: float, memory: float) -> str:
        """When each of the run's GPUs was first seen lost in the window."""
        up = select(N.GPU_UP, self.cfg.node_selector, 'uuid!=""')
        lost = f"timestamp({up} == 0)"
        return f"min_over_time({lost}[{_r(window)}:{self._res(window)}])\nand {self._of_run(window + memory)}"

    # --- where the time went (counters) -----------------------------------------------------------

    def badput_last(self, lookback: float) -> str:
        """The ledger's badput seconds by cause, the last value in ``lookback`` (continued counter)."""
        return f"max by (cause) (last_over_time({self._t(G.BADPUT_SECONDS)}[{_r(lookback)}]))"

    def slowdown_growing(self, seconds: float) -> str:
        """Seconds of the range in which the ledger's slowdown grew (the slow steps' time in it), at
        1/120 of the range's resolution (at least 1 s)."""
        step = max(1.0, seconds / 120)
        slow = self._t(G.BADPUT_SECONDS, eq("cause", "slowdown"))
        grew = f"((max({slow}) - max({slow} offset {_r(step)})) > bool 0)"
        return f"sum_over_time({grew}[{_r(seconds)}:{_r(step)}]) * {step:g}"

    def restarts_last(self, lookback: float) -> str:
        """The run's restart counter, its last value in ``lookback``."""
        return f"max(last_over_time({self._t(G.RESTARTS)}[{_r(lookback)}]))"

    def data_wait(self, seconds: float) -> str:
        """Seconds each rank waited for input in the range."""
        return f"sum by (rank) (increase({self._t(T.DATA_WAIT)}[{_r(seconds)}]))"

    def save_seconds(self, seconds: float) -> str:
        """Blocking checkpoint-save seconds of the slowest rank in the range."""
        return f"max(increase({self._t(T.CKPT_SAVE_DURATION, suffix='_sum')}[{_r(seconds)}]))"

    def saves(self, seconds: float) -> str:
        """Checkpoint saves in the range (the most any rank made)."""
        return f"max(increase({self._t(T.CKPT_SAVE_DURATION, suffix='_count')}[{_r(seconds)}]))"

    def storage(self, seconds: float, hosts_seconds: float) -> str:
        """Mean write + fsync time of the storage probe over the range, on the run's hosts, by path."""
        c = self.cfg.cluster_label
        probe = (
            f"max by ({c}, instance, path) (avg_over_time({self.rules.storage_probe_total}[{_r(seconds)}]))"
        )
        hosts = (
            f"group by ({c}, instance) (last_over_time({self._t(T.STEPS)}[{_r(hosts_seconds)}]))\n"
            f"or group by ({c}, instance) ({self.rank_gpu(hosts_seconds)})"
        )
        return f"{probe}\nand on ({c}, instance)\n({hosts})"

    # --- the loss -----------------------------------------------------------------------------------

    def nonfinite(self, seconds: float) -> str:
        """Non-finite loss values read in the range."""
        return f"sum(increase({self._t(T.NONFINITE_LOSS)}[{_r(seconds)}]))"

    def loss_max(self, seconds: float) -> str:
        """Highest loss read in the range."""
        return f"max(max_over_time({self._t(T.LOSS)}[{_r(seconds)}]))"

    def loss_median(self, seconds: float) -> str:
        """Median loss over the range."""
        return f"max(quantile_over_time(0.5, {self._t(T.LOSS)}[{_r(seconds)}]))"
