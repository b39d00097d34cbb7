"""Recording rules: the aggregates the alerts and dashboards share, named ``level:metric:operations``.

Every rule keeps the cluster label plus its level's labels, so one Prometheus (or Thanos/Mimir) can
hold many clusters and the scorecard compares them side by side. Windows come from the config, and
rule names carry their window, so the default and the fast profile never mix series.

The rules mean the same on Prometheus and on vmalert/VictoriaMetrics (tests/test_victoriametrics.py
compares every rule's output; docs/victoriametrics.md says what still differs). Writing a rule:

- no ``increase()``, ``changes()``, ``delta()`` or ``irate()`` where the value or the firing matters
  (the engines count a series' first sample differently, and only Prometheus extrapolates): growth
  of a counter is ``promql.growth`` (``promql.total_growth`` for the ledger's totals that continue
  across restarts), "did it grow" is ``promql.new_or_increased``, "how many changes" is ``resets()``
  of something that drops at each change;
- ``rate()`` for steady-state throughput only, never to tell that something stopped (its decay
  differs): a stop is a timestamp's age (``time()`` minus the last step's time) or a clock
  the exporter keeps;
- a window longer than a series' life says what a series born inside it counts, and handles "no
  value before the window" explicitly (``unless last_over_time(...)``);
- a page must not hinge, within seconds, on another rule's result for a brand-new series
  (VictoriaMetrics shows new series up to 10 s late; vmalert reads rules' results a flush late);
- each new rule gets its tolerance in ``TOLERANCE`` of tests/test_victoriametrics.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from babysitter.catalog import fabric as F
from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import probe as P
from babysitter.catalog import runtime as R
from babysitter.catalog import storage as S
from babysitter.catalog import train as T
from babysitter.generate.collectives import CollectiveRecords, collective_rules, collective_tests
from babysitter.generate.config import GenerateConfig, parse_duration
from babysitter.generate.promql import by, eq, growth, record_name, regex, select, total_growth, unit_test
from babysitter.generate.ranks import RankRecords, rank_rules, rank_tests
from babysitter.generate.rules_fabric import fabric_rules
from babysitter.generate.rules_slowdown import SlowdownRecords, slowdown_rules

__all__ = ["LIKELY_CAUSES", "Records", "recording_groups", "recording_rules", "recording_window_tests"]


@dataclass(frozen=True)
class Records:
    """Names of the recording rules for one config, plus the label sets they keep."""

    cfg: GenerateConfig

    @property
    def slowdown(self) -> SlowdownRecords:
        """The fail-slow rules: a run's share of time lost to slow steps, its likely cause, roll-ups."""
        return SlowdownRecords(self.cfg)

    @property
    def collectives(self) -> CollectiveRecords:
        """The collective rules: waiting ranks, the culprits of a hang, each rank's host and GPU."""
        return CollectiveRecords(self.cfg)

    @property
    def ranks(self) -> RankRecords:
        """Which ranks speak for a run: the declared world size, undeclared and excluded ranks."""
        return RankRecords(self.cfg)

    @property
    def run_key(self) -> tuple[str, ...]:
        """Labels of one run (with the run labels of the config: model, shape...)."""
        return (self.cfg.cluster_label, "run", *self.cfg.run_labels)

    @property
    def rank_key(self) -> tuple[str, ...]:
        """Labels of one rank of a run."""
        return (*self.run_key, "rank")

    @property
    def gpu_key(self) -> tuple[str, ...]:
        """Labels of one GPU (``instance`` is the host's agent target)."""
        return (self.cfg.cluster_label, "instance", *N.GPU_LABELS)

    @property
    def steps_rate(self) -> str:
        """Steps per second of a run (max over ranks: every rank does every step)."""
        return record_name(["run"], "train_steps", f"rate{self.cfg.rate_window}")

    @property
    def tokens_rate(self) -> str:
        """Tokens per second of a run: each rank exports its share of its data-parallel replica's
        tokens (1/(tp x pp x cp)), so the sum over ranks counts every token once."""
        return record_name(["run"], "train_tokens", f"rate{self.cfg.rate_window}")

    @property
    def mfu(self) -> str:
        """MFU of a run from the counters: model FLOP/s of all ranks (each its share of its replica's)
        over their summed dense peak; the job's MFU under any tensor/pipeline/context layout."""
        return record_name(["run"], T.MFU.name, f"rate{self.cfg.rate_window}")

    @property
    def hfu(self) -> str:
        """HFU of a run (counts recomputation)."""
        return record_name(["run"], T.HFU.name, f"rate{self.cfg.rate_window}")

    @property
    def rank_step_mean(self) -> str:
        """Mean step time of each rank."""
        return record_name(["run", "rank"], T.STEP_DURATION.name, f"mean{self.cfg.rate_window}")

    @property
    def rank_step_ratio(self) -> str:
        """Each rank's mean step time over the run's median rank (1 = typical, 1.5 = straggling)."""
        return record_name(["run", "rank"], T.STEP_DURATION.name, f"ratio_to_median{self.cfg.rate_window}")

    def step_quantile(self, q: float) -> str:
        """Step time quantile of a run: rank 0's, over its last steps (ranks step in lockstep)."""
        return record_name(["run"], T.STEP_DURATION.name, f"p{round(q * 100)}")

    @property
    def last_step(self) -> str:
        """Unix time of the latest step of any rank of a run that speaks for it (a contested rank: its
        oldest claimant's; ``generate/ranks.py``)."""
        return record_name(["run"], T.LAST_STEP_TIMESTAMP.name, "max")

    @property
    def step_baseline(self) -> str:
        """Mean step time of a run over the stall baseline window (the stall threshold's unit), of the
        ranks that speak for it only."""
        return record_name(["run"], T.STEP_DURATION.name, f"mean{self.cfg.stall_baseline_window}")

    @property
    def productive_window(self) -> str:
        """Productive seconds of a run in the goodput window."""
        return record_name(["run"], G.PRODUCTIVE_SECONDS.base_name, f"increase{self.cfg.goodput_window}")

    @property
    def badput_window(self) -> str:
        """Badput seconds (all causes) of a run in the goodput window."""
        return record_name(["run"], G.BADPUT_SECONDS.base_name, f"increase{self.cfg.goodput_window}")

    @property
    def goodput_window(self) -> str:
        """Goodput of a run over the goodput window: productive / (productive + badput)."""
        return record_name(["run"], G.GOODPUT.name, f"ratio{self.cfg.goodput_window}")

    @property
    def checkpoint_interval(self) -> str:
        """Observed mean interval between successful checkpoint saves of a run."""
        return record_name(
            ["run"], T.CKPT_LAST_SUCCESS.name, f"mean_interval{self.cfg.checkpoint_interval_window}"
        )

    @property
    def cluster_ranks(self) -> str:
        """Training processes (ranks, about one GPU each) reporting per cluster."""
        return record_name(["cluster"], T.STEPS.base_name, "count")

    @property
    def cluster_gpus(self) -> str:
        """GPUs reporting per cluster."""
        return record_name(["cluster"], N.GPU_UP.name, "count")

    @property
    def storage_probe_total(self) -> str:
        """Write + fsync time of the last storage probe, per host and path."""
        return record_name(["instance", "path"], S.STORAGE_PROBE_WRITE.name, "plus_fsync")

    # --- a rank joined to its GPU (train_info{uuid} -> the node agent's or dcgm-exporter's gpu_* series)

    @property
    def rank_gpu_key(self) -> tuple[str, ...]:
        """Labels of the rank-to-GPU records: the rank's, then its GPU's as the GPU series name it
        (``instance`` is the host's GPU target, not the trainer's)."""
        return (*self.rank_key, "instance", *N.GPU_LABELS)

    @property
    def rank_gpu(self) -> str:
        """1 per rank whose GPU reports: the rank with its GPU's uuid, host, index, bus id and model.

        The join key is ``uuid`` (with the cluster label): globally unique, and the same in the
        trainer's info series and the GPU's series whichever target scraped them.
        """
        return record_name(["run", "rank"], "gpu", "info")

    @property
    def rank_gpu_step_ratio(self) -> str:
        """Each rank's step time over the run's median rank, labeled with its GPU."""
        return record_name(
            ["run", "rank"], T.STEP_DURATION.name, f"ratio_to_median{self.cfg.rate_window}_by_gpu"
        )

    @property
    def rank_gpu_sm_clock(self) -> str:
        """SM clock of each rank's GPU."""
        return record_name(["run", "rank"], N.GPU_SM_CLOCK.name, "by_gpu")

    @property
    def rank_gpu_temperature(self) -> str:
        """Core temperature of each rank's GPU."""
        return record_name(["run", "rank"], N.GPU_TEMPERATURE.name, "by_gpu")

    @property
    def rank_gpu_throttle(self) -> str:
        """Each throttling clock-event reason of each rank's GPU (1 while active), by ``reason``."""
        return record_name(["run", "rank"], N.GPU_CLOCK_EVENT_ACTIVE.name, "by_gpu")

    @property
    def rank_gpu_ecc_new(self) -> str:
        """Uncorrectable ECC errors new on each rank's GPU in the rate window."""
        return record_name(
            ["run", "rank"], N.GPU_ECC_ERRORS.base_name, f"uncorrected_new{self.cfg.rate_window}"
        )

    @property
    def rank_gpu_xid_new(self) -> str:
        """Xid errors (all codes) new on each rank's GPU in the Xid window."""
        return record_name(["run", "rank"], N.GPU_XID_ERRORS.base_name, f"new{self.cfg.xid_window}")

    @property
    def likely_cause(self) -> str:
        """1 per run, labeled with the likely cause of its slowdown (``likely_cause``, ``team``, and
        ``likely_host`` where the cause sits on one host): what TrainingMfuDrop and TrainingStalled
        carry. ``babysitter explain`` gives the full ranked answer."""
        return record_name(["run"], T.MFU.name, "likely_cause")

    @property
    def likely_team(self) -> str:
        """1 per run, labeled with the ``team`` the likely-cause rule named most often over the MFU
        alert's ``for:`` (``unknown`` only when it named nothing else): the one label the alerts join,
        stable enough that a cause flapping between candidates does not restart their ``for:``."""
        return record_name(["run"], T.MFU.name, "likely_team")

    # --- roll-ups the scorecard and the cluster-wide panels read over days (never raw per-rank series)

    @property
    def productive_total(self) -> str:
        """A run's productive-seconds counter (rank 0 exports it; continued across restarts, so the
        run's series carries over a restart on another host where the per-process series does not)."""
        return record_name(["run"], G.PRODUCTIVE_SECONDS.name, "sum")

    @property
    def badput_total(self) -> str:
        """A run's badput seconds, all causes together (a counter continued across restarts)."""
        return record_name(["run"], G.BADPUT_SECONDS.name, "sum")

    @property
    def restarts_total(self) -> str:
        """A run's restart counter (continued across restarts)."""
        return record_name(["run"], G.RESTARTS.name, "max")

    @property
    def data_wait_mean(self) -> str:
        """Fraction of time a run's ranks wait for input, mean over ranks."""
        return record_name(["run"], T.DATA_WAIT.base_name, f"avg_rate{self.cfg.rate_window}")

    @property
    def data_wait_worst(self) -> str:
        """Fraction of time the most input-starved rank of a run waits."""
        return record_name(["run"], T.DATA_WAIT.base_name, f"max_rate{self.cfg.rate_window}")

    @property
    def checkpoint_bytes_rate(self) -> str:
        """Checkpoint bytes written per second by all ranks of a run."""
        return record_name(["run"], T.CKPT_BYTES.base_name, f"rate{self.cfg.rate_window}")

    @property
    def checkpoint_save_rate(self) -> str:
        """Blocking checkpoint-save seconds per second, all ranks of a run together."""
        return record_name(["run"], f"{T.CKPT_SAVE_DURATION.name}_sum", f"rate{self.cfg.rate_window}")

    @property
    def xid_new(self) -> str:
        """Xid errors per cluster and action bucket new in the last rate window."""
        return record_name(["cluster", "action"], N.GPU_XID_ERRORS.base_name, f"new{self.cfg.rate_window}")

    @property
    def storage_probe_p99(self) -> str:
        """p99 over a cluster's hosts and paths of the last probe's write + fsync time."""
        return record_name(["cluster"], S.STORAGE_PROBE_WRITE.name, "plus_fsync_p99")

    @property
    def probe_peak_median(self) -> str:
        """Median over a cluster's devices of the last probe's matmul throughput over peak."""
        return record_name(["cluster"], P.PROBE_MATMUL_PEAK.name, "median")

    @property
    def probe_busbw_median(self) -> str:
        """Median all-reduce bus bandwidth of a cluster's last probes."""
        return record_name(["cluster"], P.PROBE_ALLREDUCE_BUS_BANDWIDTH.name, "median")

    @property
    def probe_storage_write_median(self) -> str:
        """Median checkpoint-sized write bandwidth of a cluster's last probes."""
        return record_name(["cluster"], P.PROBE_STORAGE_WRITE_BANDWIDTH.name, "median")

    @property
    def probe_lemons(self) -> str:
        """Devices of a cluster its last probes flagged as lemons in any check."""
        return record_name(["cluster"], P.PROBE_DEVICE_LEMON.name, "sum")

    # --- the fabric and the host (generate/rules_fabric.py, docs/fabric.md)

    @property
    def host_fabric_errors(self) -> str:
        """Fabric errors new on each host in the rate window: InfiniBand/RoCE port error counters, netdev
        carrier changes and uncorrectable PCIe AER errors together (0 on a host that has none)."""
        return record_name(["instance"], "fabric_errors", f"new{self.cfg.rate_window}")

    @property
    def rank_nic(self) -> str:
        """1 per rank and nearest NIC port of its GPU (the agent's GPU-to-NIC info joined on uuid): the
        port's host target (``instance``), ``device``, ``port``, ``nic_pci_address``, the GPU's
        ``gpu_pci_address`` and the ``link`` between them."""
        return record_name(["run", "rank"], "fabric_nic", "info")

    @property
    def rank_nic_errors(self) -> str:
        """Error counters and carrier changes new on each rank's NIC port in the rate window (0 when none)."""
        return record_name(["run", "rank"], F.IB_PORT_ERRORS.base_name, f"new{self.cfg.rate_window}")

    @property
    def rank_pcie_width(self) -> str:
        """The lowest current/maximum PCIe width of each rank's GPU and NIC links (1: all at full width)."""
        return record_name(["run", "rank"], F.PCIE_LINK_WIDTH.name, "min_ratio")


def _rule(record: str, expr: str) -> dict[str, object]:
    return {"record": record, "expr": expr}


def _training_rules(cfg: GenerateConfig, r: Records) -> list[dict[str, object]]:
    ts, w, k = cfg.tracker_selector, cfg.rate_window, r.ranks
    run, rank = by(r.run_key), by(r.rank_key)
    step_sum = select(T.STEP_DURATION, ts, suffix="_sum")
    step_count = select(T.STEP_DURATION, ts, suffix="_count")
    peak = select(T.PEAK_FLOPS, ts)
    model_rate = f"rate({select(T.MODEL_FLOPS, ts)}[{w}]) and {peak}"
    rules = [
        _rule(r.steps_rate, f"max {run} (rate({select(T.STEPS, ts)}[{w}]))"),
        _rule(r.tokens_rate, f"sum {run} (rate({select(T.TOKENS, ts)}[{w}]))"),
        # Only ranks that know their peak count on either side, so an unknown device never inflates MFU.
        _rule(
            r.mfu,
            f"sum {run} (rate({select(T.MODEL_FLOPS, ts)}[{w}]) and {peak})\n/\nsum {run} ({peak})",
        ),
        # Trackers export hardware FLOPs only where recomputation is declared; elsewhere HFU is MFU.
        _rule(
            r.hfu,
            f"(\n  sum {run} (rate({select(T.HARDWARE_FLOPS, ts)}[{w}]) and {peak})\n"
            f"  or\n  sum {run} ({model_rate})\n)\n/\nsum {run} ({peak})",
        ),
        # A rank that does not speak for its run (generate/ranks.py) is no straggler of it, nor its cause.
        _rule(
            r.rank_step_mean,
            f"sum {rank} ({k.ignoring(f'rate({step_sum}[{w}])')})\n/\n"
            f"sum {rank} ({k.ignoring(f'rate({step_count}[{w}])')})",
        ),
        _rule(
            r.rank_step_ratio,
            f"{r.rank_step_mean}\n/ on ({', '.join(r.run_key)}) group_left ()\n"
            f"quantile {run} (0.5, {r.rank_step_mean})",
        ),
        *(
            _rule(r.step_quantile(q), f"max {run} ({select(T.STEP_DURATION, ts, eq('quantile', f'{q:g}'))})")
            for q in T.STEP_QUANTILES
        ),
    ]
    gw = cfg.goodput_window
    # The ledger's totals continue across restarts: their exact growth, not increase() (total_growth).
    rules += [
        _rule(
            r.productive_window, total_growth(select(G.PRODUCTIVE_SECONDS, ts), r.run_key, r.run_key, gw, gw)
        ),
        _rule(
            r.badput_window,
            total_growth(select(G.BADPUT_SECONDS, ts), r.run_key, (*r.run_key, "cause"), gw, gw),
        ),
        _rule(r.goodput_window, f"{r.productive_window}\n/\n({r.productive_window} + {r.badput_window})"),
    ]
    cw = cfg.checkpoint_interval_window
    last = select(T.CKPT_LAST_SUCCESS, ts)
    # Span of the save timestamps seen in the window over the number of saves in it after the first
    # one seen; a window without a save yields no sample (0/0 is NaN and fails the > 0 filter), so the
    # alert falls back to its maximum. A save is where the checkpoint's age (time() - last save) drops:
    # resets() of the age never counts a series' first sample on either engine, where changes() of
    # the timestamp counts it on VictoriaMetrics when the series starts inside the window (a run's
    # first hours: 6 saves of 60 s read as 7, a 51 s interval). Span and count read the same points,
    # the window sampled at its 1/360th (1 min of 6 h; saves closer together count once): a save after
    # the last point must be in neither (Prometheus evaluates between the points, vmalert on them).
    step = f"{cw}:{max(parse_duration(cw) // 360, 1)}s"
    rules.append(
        _rule(
            r.checkpoint_interval,
            f"max {run} (\n  (max_over_time({last}[{step}]) - min_over_time({last}[{step}]))\n"
            f"  / resets((time() - {last})[{step}])\n  > 0\n)",
        )
    )
    rules.append(_rule(r.cluster_ranks, f"count by ({cfg.cluster_label}) ({select(T.STEPS, ts)})"))
    return rules


def _stall_rules(cfg: GenerateConfig, r: Records) -> list[dict[str, object]]:
    """Which ranks speak for each run, then what decides its stall (its last step, its typical step
    time) and names its culprit, all from those ranks: one group, so none of them reads a rank before
    the trust rules judged it (``generate/ranks.py``)."""
    ts, k = cfg.tracker_selector, r.ranks
    run = by(r.run_key)
    bw = cfg.stall_baseline_window

    def rate_of(suffix: str) -> str:
        return k.ignoring(f"rate({select(T.STEP_DURATION, ts, suffix=suffix)}[{bw}])")

    last = k.counted(select(T.LAST_STEP_TIMESTAMP, ts), "min", r.rank_key)
    return [
        *rank_rules(cfg),
        _rule(r.last_step, f"max {run} (\n{last}\n)"),
        _rule(r.step_baseline, f"sum {run} ({rate_of('_sum')})\n/\nsum {run} ({rate_of('_count')})"),
        *collective_rules(cfg, r),
    ]


def _node_rules(cfg: GenerateConfig, r: Records) -> list[dict[str, object]]:
    ns = cfg.node_selector
    return [
        _rule(r.cluster_gpus, f"count by ({cfg.cluster_label}) ({select(N.GPU_UP, ns)})"),
        _rule(
            r.storage_probe_total,
            f"{select(S.STORAGE_PROBE_WRITE, ns)}\n+ {select(S.STORAGE_PROBE_FSYNC, ns)}",
        ),
    ]


def _rank_gpu_rules(cfg: GenerateConfig, r: Records) -> list[dict[str, object]]:
    """A rank joined to its GPU on ``uuid``: step time next to clocks, throttling, temperature, ECC, Xids.

    Every join has the rank side many and the GPU side one per (cluster, uuid), so two ranks sharing
    a GPU both get its state, and a GPU reason or Xid code that comes and goes never makes the right
    side ambiguous (reasons are joined one at a time, Xid codes summed).
    """
    ts, ns, c, k = cfg.tracker_selector, cfg.node_selector, cfg.cluster_label, r.ranks
    key = (c, "uuid")
    on = f"on ({', '.join(key)})"
    gpu_labels = ("instance", *(label for label in N.GPU_LABELS if label != "uuid"))
    identity = f"max {by((*key, *gpu_labels))} ({select(N.GPU_UP, ns)})"
    info = select(T.INFO, ts, 'uuid!=""')

    def joined(gpu_side: str) -> str:
        return f"{r.rank_gpu}\n* {on} group_left ()\n{gpu_side}"

    throttle = "\nor\n".join(
        f"{r.rank_gpu}\n* {on} group_left ({N.GPU_CLOCK_EVENT_ACTIVE.labels[-1]})\n"
        f"max {by((*key, 'reason'))} ({select(N.GPU_CLOCK_EVENT_ACTIVE, ns, eq('reason', reason))})"
        for reason in cfg.throttle_reasons
    )
    ecc = select(N.GPU_ECC_ERRORS, ns, eq("type", cfg.ecc_uncorrected_type), 'uuid!=""')
    xid = select(N.GPU_XID_ERRORS, ns, 'uuid!=""')
    zero = f"0 * max {by(key)} ({select(N.GPU_UP, ns)})"
    return [
        _rule(
            r.rank_gpu,
            f"max {by((*r.rank_key, 'uuid'))} ({k.ignoring(info)})\n"
            f"* {on} group_left ({', '.join(gpu_labels)})\n"
            f"(0 * {identity} + 1)",
        ),
        _rule(
            r.rank_gpu_step_ratio,
            f"{r.rank_step_ratio}\n* on ({', '.join(r.rank_key)}) "
            f"group_left ({', '.join(('uuid', *gpu_labels))})\n{r.rank_gpu}",
        ),
        _rule(r.rank_gpu_sm_clock, joined(f"max {by(key)} ({select(N.GPU_SM_CLOCK, ns)})")),
        _rule(
            r.rank_gpu_temperature,
            joined(f"max {by(key)} ({select(N.GPU_TEMPERATURE, ns, eq('sensor', 'gpu'))})"),
        ),
        _rule(r.rank_gpu_throttle, throttle),
        # 0 rather than nothing for a GPU without errors, so the slowest ranks' table shows every GPU.
        _rule(r.rank_gpu_ecc_new, joined(f"(sum {by(key)} ({growth(ecc, cfg.rate_window)})\nor {zero})")),
        _rule(r.rank_gpu_xid_new, joined(f"(sum {by(key)} ({growth(xid, cfg.xid_window)})\nor {zero})")),
    ]


def _rollup_rules(cfg: GenerateConfig, r: Records) -> list[dict[str, object]]:
    """Run and cluster roll-ups: what the scorecard and the cluster-wide panels read over days.

    At 16,384 GPUs a 30-day query over per-rank series reads billions of samples; over these, one
    series per run or per cluster, it reads thousands (alerts/README.md lists each level's count).
    """
    ts, ns, w, k = cfg.tracker_selector, cfg.node_selector, cfg.rate_window, r.ranks
    run, cluster = by(r.run_key), by((cfg.cluster_label,))
    probe_device = by((cfg.cluster_label, "instance", "gpu"))
    save_sum = select(T.CKPT_SAVE_DURATION, ts, suffix="_sum")
    # Data wait and saves name a run's likely cause (and the team its pages go to): only from the ranks
    # that speak for it (generate/ranks.py).
    return [
        _rule(r.productive_total, f"sum {run} ({select(G.PRODUCTIVE_SECONDS, ts)})"),
        _rule(r.badput_total, f"sum {run} ({select(G.BADPUT_SECONDS, ts)})"),
        _rule(r.restarts_total, f"max {run} ({select(G.RESTARTS, ts)})"),
        _rule(r.data_wait_mean, f"avg {run} ({k.ignoring(f'rate({select(T.DATA_WAIT, ts)}[{w}])')})"),
        _rule(r.data_wait_worst, f"max {run} ({k.ignoring(f'rate({select(T.DATA_WAIT, ts)}[{w}])')})"),
        _rule(r.checkpoint_bytes_rate, f"sum {run} (rate({select(T.CKPT_BYTES, ts)}[{w}]))"),
        _rule(
            r.checkpoint_save_rate,
            f"sum {run} ({k.ignoring(f'rate({save_sum}[{w}])')})",
        ),
        _rule(
            r.xid_new,
            f"sum {by((cfg.cluster_label, 'action'))} (\n  {growth(select(N.GPU_XID_ERRORS, ns), w)}\n)",
        ),
        _rule(r.storage_probe_p99, f"quantile {cluster} (0.99, {r.storage_probe_total})"),
        _rule(r.probe_peak_median, f"quantile {cluster} (0.5, {select(P.PROBE_MATMUL_PEAK, ns)})"),
        _rule(
            r.probe_busbw_median, f"quantile {cluster} (0.5, {select(P.PROBE_ALLREDUCE_BUS_BANDWIDTH, ns)})"
        ),
        _rule(
            r.probe_storage_write_median,
            f"quantile {cluster} (0.5, {select(P.PROBE_STORAGE_WRITE_BANDWIDTH, ns)})",
        ),
        _rule(
            r.probe_lemons,
            f"sum {cluster} (max {probe_device} ({select(P.PROBE_DEVICE_LEMON, ns)}))",
        ),
    ]


#: Causes the likely-cause rule names, the team each routes to, and the least share of time that counts.
LIKELY_CAUSES = (
    ("gpu_fault", "infra"),
    ("gpu_throttling", "infra"),
    ("straggler", "infra"),
    ("data_wait", "training"),
    ("checkpoint", "training"),
    ("phase", "training"),
)
_LIKELY_MIN_SHARE = 0.05


def _likely_cause_rules(cfg: GenerateConfig, r: Records) -> list[dict[str, object]]:
    """A run's likely cause of a slowdown, in PromQL, so a page names it and routes to a team.

    Each candidate is scored as the share of the run's time it costs now: a straggling rank
    ``1 - 1/ratio`` (charged to throttling when its GPU throttles), data wait and blocking checkpoint
    saves by their fraction of time above their median over the MFU baseline window, eval and marked
    phases by the ledger's badput rate; a new Xid on one of the run's GPUs scores 1 (it outranks all).
    The best candidate wins; a run with none gets ``unknown`` (team ``training``). Candidates under
    5% of the time are noise.
    """
    ts, k = cfg.tracker_selector, r.ranks
    run, rank = by(r.run_key), by(r.rank_key)
    on_rank = f"on ({', '.join(r.rank_key)})"
    base = cfg.mfu_baseline_window
    m = _LIKELY_MIN_SHARE

    def named(expr: str, cause: str, team: str) -> str:
        inner = f'label_replace({expr}, "likely_cause", "{cause}", "", "")'
        return f'label_replace({inner}, "team", "{team}", "", "")'

    def host(expr: str) -> str:
        relabeled = f'label_replace({expr}, "likely_host", "$1", "instance", "(.*)")'
        return f"max {by((*r.run_key, 'likely_host'))} ({relabeled})"

    teams = dict(LIKELY_CAUSES)
    throttled = f"(max {rank} ({r.rank_gpu_throttle}) > 0)"
    lost = f"(1 - 1 / ({r.rank_gpu_step_ratio} > {cfg.straggler_ratio:g}))"
    ranks = f"count {run} ({r.rank_step_mean})"

    def growth_over_median(rule: str, per: str = "") -> str:
        return f"({rule} - quantile_over_time(0.5, {rule}[{base}])){per} > {m:g}"

    phases = select(G.BADPUT_SECONDS, ts, regex("cause", ("eval", "phase")))
    score = k.ignoring(select(R.STRAGGLER_SCORE, ts))
    candidates = {
        "gpu_fault": host(f"0 * ({r.rank_gpu_xid_new} > 0) + 1"),
        "gpu_throttling": host(f"{lost} > {m:g} and {on_rank} {throttled}"),
        "straggler": (
            f"{host(f'{lost} > {m:g} unless {on_rank} {throttled}')}\n"
            f"or on ({', '.join(r.run_key)})\n"
            f"max {run} (1 - 1 / ({r.rank_step_ratio} > {cfg.straggler_ratio:g})) > {m:g}\n"
            # Lockstep runs, where step times are equal: the in-process score from collective arrival,
            # on the host the rank's info series comes from.
            f"or on ({', '.join(r.run_key)})\n"
            + host(
                f"((1 - 1 / (max {rank} ({score}) > {cfg.straggler_ratio:g}))"
                f" > {m:g})\n* {on_rank} group_left (instance)\n"
                f"max {by((*r.rank_key, 'instance'))} ({select(T.INFO, ts)})"
            )
        ),
        "data_wait": growth_over_median(r.data_wait_worst),
        # The rule sums over ranks: per rank, each blocks for its share of the time.
        "checkpoint": growth_over_median(r.checkpoint_save_rate, f" / {ranks}"),
        "phase": f"sum {run} ({k.ignoring(f'rate({phases}[{cfg.rate_window}])')}) > {m:g}",
    }
    best = "\nor\n".join(named(f"({expr})", cause, teams[cause]) for cause, expr in candidates.items())
    known = f"group {run} (max_over_time({r.last_step}[{cfg.stall_lookback_window}]) or {r.mfu})"
    team = by((*r.run_key, "team"))
    counted = f'count_over_time({r.likely_cause}{{likely_cause!="unknown"}}[{cfg.mfu_drop_for}])'
    return [
        _rule(
            r.likely_cause,
            f"0 * topk {run} (1,\n{best}\n) + 1\nor on ({', '.join(r.run_key)})\n"
            f"{named(known, 'unknown', 'training')}",
        ),
        _rule(
            r.likely_team,
            f"0 * topk {run} (1, sum {team} ({counted})) + 1\nor on ({', '.join(r.run_key)})\n"
            f'group {team} ({r.likely_cause}{{likely_cause="unknown"}})',
        ),
    ]


_GROUPS = (
    ("babysitter-training.rules", _training_rules),
    ("babysitter-node.rules", _node_rules),
    # Reads the training group's step-time ratio (from that group's last evaluation).
    ("babysitter-rank-gpu.rules", _rank_gpu_rules),
    # Its storage roll-up reads the node group's per-host result (from that group's last evaluation).
    ("babysitter-rollup.rules", _rollup_rules),
    # Reads the rank-GPU and roll-up groups' records.
    ("babysitter-likely-cause.rules", _likely_cause_rules),
    # A rank joined to its NIC, and the hosts' fabric errors (generate/rules_fabric.py).
    ("babysitter-fabric.rules", fabric_rules),
    # Which ranks speak for a run, then its last step, stall baseline and collective culprits, each
    # reading the ones before it in the group (generate/ranks.py, generate/collectives.py).
    ("babysitter-stall.rules", _stall_rules),
    # Reads the training, rank-GPU and fabric groups' records (generate/rules_slowdown.py).
    ("babysitter-slowdown.rules", lambda cfg, r: slowdown_rules(cfg, r, r.slowdown)),
)


#: Recording groups a page reads at the moment it goes out: evaluated every ``page_eval_interval``, not at
#: the server's default (1 m in the shipped scrape config). The stall rules hold the run's last step and
#: the hang's culprit: at 1 m a stall page could wait a minute for them, or go out without its culprit.
_PAGING_RECORDS = frozenset({"babysitter-stall.rules"})


def recording_groups(cfg: GenerateConfig) -> list[dict[str, object]]:
    """The ``groups`` of the recording rule file."""
    r = Records(cfg)
    return [
        {
            "name": name,
            **({"interval": cfg.page_eval_interval} if name in _PAGING_RECORDS else {}),
            "rules": make(cfg, r),
        }
        for name, make in _GROUPS
    ]


def recording_rules(cfg: GenerateConfig) -> list[tuple[str, str]]:
    """``(record, expr)`` of every recording rule, in file order."""
    r = Records(cfg)
    return [(str(rule["record"]), str(rule["expr"])) for _, make in _GROUPS for rule in make(cfg, r)]


def _series(spec_name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{key}="{value}"' for key, value in labels.items())
    return f"{spec_name}{{{inner}}}"


def recording_tests(cfg: GenerateConfig) -> dict[str, object]:
    """A promtool test file with ``promql_expr_test`` cases for the recording rules (default config).

    The rules' arithmetic is what the dashboards show, so each case pins one result computed by hand.
    """
    r = Records(cfg)
    base = {"cluster": "c1", "instance": "n1:9400", "job": "babysitter-node", "run": "r1"}

    def rank(number: str, **extra: str) -> dict[str, str]:
        return {**base, "rank": number, **extra}

    def out(record: str, **labels: str) -> str:
        return _series(record, {"cluster": "c1", **labels})

    def gpu_of(gpu: str, uuid: str, **extra: str) -> dict[str, str]:
        bus = {"0": "0000:18:00", "1": "0000:28:00"}[gpu]
        identity = {"gpu": gpu, "uuid": uuid, "pci_bus_id": bus, "model": "NVIDIA H100 80GB HBM3"}
        return {"cluster": "c1", "instance": "h1:9400", "job": "gpu", **identity, **extra}

    def on_gpu(record: str, number: str, **extra: str) -> str:
        gpu = {"0": "0", "2": "1"}[number]
        labels = gpu_of(gpu, {"0": "GPU-a", "2": "GPU-b"}[number])
        del labels["job"]
        return out(record, run="r1", rank=number, **labels, **extra)

    series = [
        # MFU: ranks 0 and 1 at 50 and 30 FLOP/s of 100 each; rank 2's device has no known peak and must
        # not count on either side of the ratio.
        (_series(T.MODEL_FLOPS.name, rank("0")), "0+3000x20"),
        (_series(T.PEAK_FLOPS.name, rank("0")), "100+0x20"),
        (_series(T.MODEL_FLOPS.name, rank("1")), "0+1800x20"),
        (_series(T.PEAK_FLOPS.name, rank("1")), "100+0x20"),
        (_series(T.MODEL_FLOPS.name, rank("2")), "0+60000x20"),
        # Step time: ranks at 1 s, 1 s and 1.5 s per step; every step of rank 0 in the (0.5, 1] bucket.
        *(
            (_series(f"{T.STEP_DURATION.name}_{part}", rank(number)), f"0+{per_min}x20")
            for number, step_sum in (("0", 60), ("1", 60), ("2", 90))
            for part, per_min in (("sum", step_sum), ("count", 60))
        ),
        # Rank 0's step-time quantiles (the other ranks have none).
        (_series(T.STEP_DURATION.name, rank("0", quantile="0.5")), "0.75+0x20"),
        (_series(T.STEP_DURATION.name, rank("0", quantile="0.9")), "0.95+0x20"),
        # HFU: run r1 declares no recomputation (HFU = MFU); run r3 does (4/3 of its model FLOPs).
        (_series(T.MODEL_FLOPS.name, {**base, "run": "r3", "rank": "0"}), "0+3000x20"),
        (_series(T.HARDWARE_FLOPS.name, {**base, "run": "r3", "rank": "0"}), "0+4000x20"),
        (_series(T.PEAK_FLOPS.name, {**base, "run": "r3", "rank": "0"}), "100+0x20"),
        (_series(T.STEPS.name, rank("0")), "0+60x20"),
        (_series(T.STEPS.name, rank("1")), "0+60x20"),
        (_series(T.LAST_STEP_TIMESTAMP.name, rank("0")), "0+60x20"),
        (_series(T.LAST_STEP_TIMESTAMP.name, rank("1")), "0+59x20"),
        # Goodput: 48 productive and 12 badput seconds per minute.
        (_series(G.PRODUCTIVE_SECONDS.name, rank("0")), "0+48x20"),
        (_series(G.BADPUT_SECONDS.name, rank("0", cause="data_stall")), "0+8x20"),
        (_series(G.BADPUT_SECONDS.name, rank("0", cause="checkpoint_save")), "0+4x20"),
        # Checkpoints saved every 5 minutes (Unix time of the last success).
        (_series(T.CKPT_LAST_SUCCESS.name, rank("0")), "0+0x4 300+0x4 600+0x4 900+0x4 1200+0x4"),
        # Run r2, TP=2 x DP=2: each of the 4 ranks exports its share (1/2) of its replica's 60 tokens
        # and 1200 FLOPs per minute, so the sums are the job's: 120 tokens/min, MFU 40 / 400 = 0.1.
        *(
            (_series(spec.name, {**base, "run": "r2", "rank": number}), values)
            for number in "0123"
            for spec, values in (
                (T.TOKENS, "0+30x20"),
                (T.MODEL_FLOPS, "0+600x20"),
                (T.PEAK_FLOPS, "100+0x20"),
            )
        ),
        # Storage probe: 0.5 s write + 0.2 s fsync.
        (_series(S.STORAGE_PROBE_WRITE.name, {**base, "path": "/ckpt"}), "0.5+0x20"),
        (_series(S.STORAGE_PROBE_FSYNC.name, {**base, "path": "/ckpt"}), "0.2+0x20"),
        # Roll-ups. Rank 0 restarted twice (its counter continues across restarts); ranks 0 and 1
        # write 600 checkpoint bytes per minute each, blocking 3 s per minute each.
        (_series(G.RESTARTS.name, rank("0")), "2+0x20"),
        # Rank 0 waits 15 s of every minute for input, rank 1 45 s.
        (_series(T.DATA_WAIT.name, rank("0")), "0+15x20"),
        (_series(T.DATA_WAIT.name, rank("1")), "0+45x20"),
        *(
            (_series(name, rank(number)), values)
            for number in "01"
            for name, values in (
                (T.CKPT_BYTES.name, "0+600x20"),
                (f"{T.CKPT_SAVE_DURATION.name}_sum", "0+3x20"),
            )
        ),
        # Xid: one GPU's reset_gpu counter goes 1 -> 2 at minute 8; another GPU's first restart_app Xid
        # (its series born at 1) at minute 7. Both are new in the last 5 minutes at minute 10.
        (
            _series(N.GPU_XID_ERRORS.name, {**base, "gpu": "0", "xid": "79", "action": "reset_gpu"}),
            "1+0x7 2+0x12",
        ),
        (
            _series(N.GPU_XID_ERRORS.name, {**base, "gpu": "1", "xid": "13", "action": "restart_app"}),
            "_x7 1+0x12",
        ),
        # Probe: two devices at 0.7 and 0.9 of peak, one of them a lemon; two hosts' all-reduce and
        # checkpoint-write bandwidth.
        *(
            item
            for gpu, peak_ratio, lemon in (("0", "0.7", "1"), ("1", "0.9", "0"))
            for item in (
                (
                    _series(P.PROBE_MATMUL_PEAK.name, {**base, "gpu": gpu, "dtype": "bf16"}),
                    f"{peak_ratio}+0x20",
                ),
                (
                    _series(P.PROBE_DEVICE_LEMON.name, {**base, "gpu": gpu, "check": "matmul"}),
                    f"{lemon}+0x20",
                ),
            )
        ),
        *(
            item
            for host, busbw, write in (("n1:9400", "100", "10"), ("n2:9400", "300", "30"))
            for item in (
                (_series(P.PROBE_ALLREDUCE_BUS_BANDWIDTH.name, {**base, "instance": host}), f"{busbw}+0x20"),
                (_series(P.PROBE_STORAGE_WRITE_BANDWIDTH.name, {**base, "instance": host}), f"{write}+0x20"),
            )
        ),
        # A rank joined to its GPU: rank 0 on GPU-a, rank 2 on GPU-b (hot, throttled, an Xid at minute 4,
        # new in the 15m Xid window but not in the cluster's 5m one, and an ECC error at minute 8), rank 1
        # without a GPU in train_info. The GPUs' series come from another target than the trainers'
        # (the join is on uuid, never instance).
        *(
            (_series(T.INFO.name, rank(number, uuid=uuid, pci_bus_id=bus)), "1+0x20")
            for number, uuid, bus in (("0", "GPU-a", "0000:18:00"), ("2", "GPU-b", "0000:28:00"))
        ),
        (_series(T.INFO.name, rank("1")), "1+0x20"),
        *(
            item
            for gpu, uuid, clock, temp, slowdown in (
                ("0", "GPU-a", "1.98e9", "60", "0"),
                ("1", "GPU-b", "1.1e9", "88", "1"),
            )
            for item in (
                (_series(N.GPU_UP.name, gpu_of(gpu, uuid)), "1+0x20"),
                (_series(N.GPU_SM_CLOCK.name, gpu_of(gpu, uuid)), f"{clock}+0x20"),
                (_series(N.GPU_TEMPERATURE.name, gpu_of(gpu, uuid, sensor="gpu")), f"{temp}+0x20"),
                (_series(N.GPU_TEMPERATURE.name, gpu_of(gpu, uuid, sensor="memory")), "99+0x20"),
                (
                    _series(N.GPU_CLOCK_EVENT_ACTIVE.name, gpu_of(gpu, uuid, reason="hw_slowdown")),
                    f"{slowdown}+0x20",
                ),
                (_series(N.GPU_CLOCK_EVENT_ACTIVE.name, gpu_of(gpu, uuid, reason="sw_power_cap")), "1+0x20"),
                (
                    _series(N.GPU_ECC_ERRORS.name, gpu_of(gpu, uuid, type="uncorrected", scope="volatile")),
                    "0+0x7 " + f"{slowdown}+0x12",
                ),
            )
        ),
        (
            _series(N.GPU_CLOCK_EVENT_ACTIVE.name, gpu_of("1", "GPU-b", reason="hw_thermal_slowdown")),
            "1+0x20",
        ),
        (_series(N.GPU_XID_ERRORS.name, gpu_of("1", "GPU-b", xid="79", action="reboot")), "_x3 1+0x16"),
        # Run r5 waits 45 s of every minute for input from minute 3 (nothing before): its likely cause
        # is data wait (growth over its median). Run r6 spends 30 s of every minute in eval: the phase.
        (_series(T.DATA_WAIT.name, {**base, "run": "r5", "rank": "0"}), "0+0x3 45+45x16"),
        # A user on n9 serves rank 9 of r5 (whose rank 0 declares 1 rank) with a straggler score of 3 and
        # 50 s of every minute waiting for input: not r5's cause, nor the team its pages go to (before,
        # its straggling named n9 and sent r5's pages to infra).
        (_series(T.WORLD_SIZE.name, {**base, "run": "r5", "rank": "0"}), "1+0x20"),
        *(
            (_series(name, {**base, "instance": "n9:9400", "run": "r5", "rank": "9"}), values)
            for name, values in (
                (N.TRAINER_RANK.name, "9+0x20"),
                (R.STRAGGLER_SCORE.name, "3+0x20"),
                (T.INFO.name, "1+0x20"),
                (T.DATA_WAIT.name, "0+50x20"),
            )
        ),
        (_series(G.BADPUT_SECONDS.name, {**base, "run": "r6", "rank": "0", "cause": "eval"}), "0+30x20"),
        # Run r8's rank 2 steps 1.5x slower than the others, with no GPU in train_info: a straggler.
        *(
            (
                _series(f"{T.STEP_DURATION.name}_{part}", {**base, "run": "r8", "rank": number}),
                f"0+{per_min}x20",
            )
            for number, step_sum in (("0", 60), ("1", 60), ("2", 90))
            for part, per_min in (("sum", step_sum), ("count", 60))
        ),
        # Run r9 steps in lockstep (equal step times), but rank 1's straggler score from collective
        # arrival is 1.5 (host h9): a straggler there too.
        *(
            item
            for number, score in (("0", "1"), ("1", "1.5"), ("2", "1"))
            for item in (
                (_series(R.STRAGGLER_SCORE.name, {**base, "run": "r9", "rank": number}), f"{score}+0x20"),
                (
                    _series(T.INFO.name, {**base, "instance": "h9:9400", "run": "r9", "rank": number}),
                    "1+0x20",
                ),
            )
        ),
        # Run r7's one rank blocks in checkpoint saves 30 s of every minute from minute 3: checkpoint.
        (_series(f"{T.CKPT_SAVE_DURATION.name}_sum", {**base, "run": "r7", "rank": "0"}), "0+0x3 30+30x16"),
        *(
            (_series(f"{T.STEP_DURATION.name}_{part}", {**base, "run": "r7", "rank": "0"}), "0+60x20")
            for part in ("sum", "count")
        ),
        # Run r4's likely cause (given directly: r4 has no other series) was throttling for 9 minutes and
        # is data wait for the last two: its team stays infra, the team named most often in 30m.
        (
            _series(
                r.likely_cause,
                {"cluster": "c1", "run": "r4", "likely_cause": "gpu_throttling", "team": "infra"},
            ),
            "1+0x8",
        ),
        (
            _series(
                r.likely_cause,
                {"cluster": "c1", "run": "r4", "likely_cause": "data_wait", "team": "training"},
            ),
            "_x9 1+0x1",
        ),
    ]
    at = "10m"
    cases: list[tuple[str, list[tuple[str, float]]]] = [
        (
            r.mfu,
            [(out(r.mfu, run="r1"), 0.4), (out(r.mfu, run="r2"), 0.1), (out(r.mfu, run="r3"), 0.5)],
        ),
        (r.tokens_rate, [(out(r.tokens_rate, run="r2"), 2.0)]),
        (
            r.rank_step_mean,
            [(out(r.rank_step_mean, run="r1", rank=n), v) for n, v in (("0", 1), ("1", 1), ("2", 1.5))]
            + [(out(r.rank_step_mean, run="r7", rank="0"), 1)]
            + [(out(r.rank_step_mean, run="r8", rank=n), v) for n, v in (("0", 1), ("1", 1), ("2", 1.5))],
        ),
        (
            r.rank_step_ratio,
            [(out(r.rank_step_ratio, run="r1", rank=n), v) for n, v in (("0", 1), ("1", 1), ("2", 1.5))]
            + [(out(r.rank_step_ratio, run="r7", rank="0"), 1)]
            + [(out(r.rank_step_ratio, run="r8", rank=n), v) for n, v in (("0", 1), ("1", 1), ("2", 1.5))],
        ),
        (
            r.hfu,
            [
                (out(r.hfu, run="r1"), 0.4),
                (out(r.hfu, run="r2"), 0.1),
                (out(r.hfu, run="r3"), 4000 / 60 / 100),
            ],
        ),
        (r.step_quantile(0.5), [(out(r.step_quantile(0.5), run="r1"), 0.75)]),
        (r.step_quantile(0.9), [(out(r.step_quantile(0.9), run="r1"), 0.95)]),
        (r.last_step, [(out(r.last_step, run="r1"), 600.0)]),
        (r.goodput_window, [(out(r.goodput_window, run="r1"), 0.8)]),
        (r.checkpoint_interval, [(out(r.checkpoint_interval, run="r1"), 300.0)]),
        (r.cluster_ranks, [(out(r.cluster_ranks), 2.0)]),
        (
            r.storage_probe_total,
            [(_series(r.storage_probe_total, {**base, "path": "/ckpt"}), 0.7)],
        ),
        (r.productive_total, [(out(r.productive_total, run="r1"), 480.0)]),
        (r.badput_total, [(out(r.badput_total, run="r1"), 120.0), (out(r.badput_total, run="r6"), 300.0)]),
        (r.restarts_total, [(out(r.restarts_total, run="r1"), 2.0)]),
        (r.data_wait_mean, [(out(r.data_wait_mean, run="r1"), 0.5), (out(r.data_wait_mean, run="r5"), 0.75)]),
        (
            r.data_wait_worst,
            [(out(r.data_wait_worst, run="r1"), 0.75), (out(r.data_wait_worst, run="r5"), 0.75)],
        ),
        (r.checkpoint_bytes_rate, [(out(r.checkpoint_bytes_rate, run="r1"), 20.0)]),
        (
            r.checkpoint_save_rate,
            [(out(r.checkpoint_save_rate, run="r1"), 0.1), (out(r.checkpoint_save_rate, run="r7"), 0.5)],
        ),
        (
            r.xid_new,
            [(out(r.xid_new, action="reset_gpu"), 1.0), (out(r.xid_new, action="restart_app"), 1.0)],
        ),
        (r.storage_probe_p99, [(out(r.storage_probe_p99), 0.7)]),
        (r.probe_peak_median, [(out(r.probe_peak_median), 0.8)]),
        (r.probe_lemons, [(out(r.probe_lemons), 1.0)]),
        (r.probe_busbw_median, [(out(r.probe_busbw_median), 200.0)]),
        (r.probe_storage_write_median, [(out(r.probe_storage_write_median), 20.0)]),
        (r.rank_gpu, [(on_gpu(r.rank_gpu, "0"), 1.0), (on_gpu(r.rank_gpu, "2"), 1.0)]),
        (
            r.rank_gpu_step_ratio,
            [(on_gpu(r.rank_gpu_step_ratio, "0"), 1.0), (on_gpu(r.rank_gpu_step_ratio, "2"), 1.5)],
        ),
        (
            r.rank_gpu_sm_clock,
            [(on_gpu(r.rank_gpu_sm_clock, "0"), 1.98e9), (on_gpu(r.rank_gpu_sm_clock, "2"), 1.1e9)],
        ),
        (
            r.rank_gpu_temperature,
            [(on_gpu(r.rank_gpu_temperature, "0"), 60.0), (on_gpu(r.rank_gpu_temperature, "2"), 88.0)],
        ),
        (
            r.rank_gpu_throttle,
            [
                (on_gpu(r.rank_gpu_throttle, "0", reason="hw_slowdown"), 0.0),
                (on_gpu(r.rank_gpu_throttle, "2", reason="hw_slowdown"), 1.0),
                (on_gpu(r.rank_gpu_throttle, "2", reason="hw_thermal_slowdown"), 1.0),
            ],
        ),
        (
            r.rank_gpu_ecc_new,
            [(on_gpu(r.rank_gpu_ecc_new, "0"), 0.0), (on_gpu(r.rank_gpu_ecc_new, "2"), 1.0)],
        ),
        (
            r.rank_gpu_xid_new,
            [(on_gpu(r.rank_gpu_xid_new, "0"), 0.0), (on_gpu(r.rank_gpu_xid_new, "2"), 1.0)],
        ),
        # r1's rank 2 straggles on a throttled GPU, but that GPU also had an Xid: the Xid wins. The
        # other runs have no candidate.
        (
            r.likely_cause,
            [
                (
                    out(
                        r.likely_cause,
                        run="r1",
                        likely_cause="gpu_fault",
                        likely_host="h1:9400",
                        team="infra",
                    ),
                    1,
                ),
                (out(r.likely_cause, run="r2", likely_cause="unknown", team="training"), 1),
                (out(r.likely_cause, run="r3", likely_cause="unknown", team="training"), 1),
                (out(r.likely_cause, run="r5", likely_cause="data_wait", team="training"), 1),
                (out(r.likely_cause, run="r6", likely_cause="phase", team="training"), 1),
                (out(r.likely_cause, run="r7", likely_cause="checkpoint", team="training"), 1),
                (out(r.likely_cause, run="r8", likely_cause="straggler", team="infra"), 1),
                (
                    out(
                        r.likely_cause,
                        run="r9",
                        likely_cause="straggler",
                        likely_host="h9:9400",
                        team="infra",
                    ),
                    1,
                ),
                # r4's given series (the last throttling sample is still within the lookback).
                (out(r.likely_cause, run="r4", likely_cause="data_wait", team="training"), 1),
                (out(r.likely_cause, run="r4", likely_cause="gpu_throttling", team="infra"), 1),
            ],
        ),
        (
            r.likely_team,
            [
                (out(r.likely_team, run="r1", team="infra"), 1),
                (out(r.likely_team, run="r2", team="training"), 1),
                (out(r.likely_team, run="r3", team="training"), 1),
                (out(r.likely_team, run="r4", team="infra"), 1),
                (out(r.likely_team, run="r5", team="training"), 1),
                (out(r.likely_team, run="r6", team="training"), 1),
                (out(r.likely_team, run="r7", team="training"), 1),
                (out(r.likely_team, run="r8", team="infra"), 1),
                (out(r.likely_team, run="r9", team="infra"), 1),
            ],
        ),
    ]
    return {
        "evaluation_interval": "1m",
        "tests": [
            unit_test(series, cases, interval="1m", eval_time=at),
            collective_tests(cfg),
            rank_tests(cfg, last_step=r.last_step, step_baseline=r.step_baseline),
        ],
    }


def recording_window_tests(cfg: GenerateConfig) -> dict[str, object]:
    """promtool cases for windows over a run older than them, across a restart on another host (default
    config; 10 min samples and evaluations over 28 h, a file of its own: the 1 min evaluations of the
    other cases would take seconds here).

    Run g1 trains from 0 h on n1 at 0.8 productive, 0.2 downtime; at 25 h it restarts on n2, its
    ledger's totals carried over; at 26 h 40 m it hangs a minute of every ten (a badput cause born in
    the window, counted from its first 60 s). It saves every 30 min. Run g2 starts at 27 h after 45 s of
    startup. These pin the engine-neutral constructions: exact growth of carried totals
    (``total_growth``), a save count that ignores a series' first sample (``resets`` of the age).
    """
    r = Records(cfg)
    n1 = {"cluster": "c1", "instance": "n1:9400", "job": "babysitter-node", "run": "g1", "rank": "0"}
    n2 = {**n1, "instance": "n2:9400"}
    g2 = {**n2, "run": "g2"}
    productive, badput = G.PRODUCTIVE_SECONDS.name, G.BADPUT_SECONDS.name
    series = [
        (_series(productive, n1), "0+480x150"),
        (_series(productive, n2), "_x151 72480+480x17"),
        (_series(badput, {**n1, "cause": "downtime"}), "0+120x150"),
        (_series(badput, {**n2, "cause": "downtime"}), "_x151 18120+120x17"),
        (_series(badput, {**n2, "cause": "hang"}), "_x160 60+60x8"),
        # The time of the last save: every 30 min (3 samples), the value then held.
        (_series(T.CKPT_LAST_SUCCESS.name, n1), " ".join(f"{1800 * k}+0x2" for k in range(50)) + " 90000"),
        (
            _series(T.CKPT_LAST_SUCCESS.name, n2),
            "_x151 90000+0x1 " + " ".join(f"{1800 * k}+0x2" for k in range(51, 57)),
        ),
        (_series(productive, g2), "_x162 0+500x6"),
        (_series(badput, {**g2, "cause": "startup"}), "_x162 45+0x6"),
    ]

    def out(record: str, run: str) -> str:
        return _series(record, {"cluster": "c1", "run": run})

    # At 28 h: g1's productive total 80,640 s (n2), 11,520 s at 4 h (n1): 69,120 s in 24 h; badput
    # 20,160 - 2,880 = 17,280 s of downtime plus the hang's 540 s (60 + 8 x 60).
    hang = 60 + 8 * 60
    cases = [
        (
            r.productive_window,
            [(out(r.productive_window, "g1"), 69120.0), (out(r.productive_window, "g2"), 3000.0)],
        ),
        (r.badput_window, [(out(r.badput_window, "g1"), 17280.0 + hang), (out(r.badput_window, "g2"), 45.0)]),
        (
            r.goodput_window,
            [
                (out(r.goodput_window, "g1"), 69120 / (69120 + 17280 + hang)),
                (out(r.goodput_window, "g2"), 3000 / 3045),
            ],
        ),
        # Saves every 30 min: each incarnation's series, 3 h of the 6 h window each, counts 6 saves after
        # the first value it shows (n2's is its birth inside the window, which changes() counts on
        # VictoriaMetrics).
        (r.checkpoint_interval, [(out(r.checkpoint_interval, "g1"), 1800.0)]),
    ]
    return {
        "evaluation_interval": "10m",
        "tests": [unit_test(series, cases, interval="10m", eval_time="28h")],
    }
