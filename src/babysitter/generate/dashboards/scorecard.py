"""Cluster scorecard, the "hardware lottery": the same numbers for every cluster (provider), side by side.

Everything is normalized (ratios, per 1000 GPU-hours, bytes per second) so a 64-GPU cluster and a
4096-GPU cluster compare fairly over the dashboard's time range. Every query reads run- or
cluster-level recording rules (through subqueries at the rate window's resolution), never per-rank
series: over 30 days at 16,384 GPUs those would be billions of samples.
"""

from __future__ import annotations

from babysitter.generate.config import GenerateConfig, parse_duration
from babysitter.generate.dashboards._builder import Column, Dashboard, Panel, Row, Steps, Target, Variable
from babysitter.generate.dashboards._common import goodput_steps, mfu_steps, rec, var_matcher
from babysitter.generate.promql import by
from babysitter.generate.rules import Records

__all__ = ["FILE_NAME", "dashboard"]

FILE_NAME = "babysitter-cluster-scorecard.json"


def dashboard(cfg: GenerateConfig) -> Dashboard:
    """The cluster scorecard for ``cfg``."""
    r = Records(cfg)
    c = cfg.cluster_label
    in_cluster = var_matcher(c, "cluster")
    per = by((c,))
    rng = "$__range"
    range_s = "$__range_s"
    hours = f"{range_s} / 3600"
    mfu = rec(r.mfu, in_cluster)
    window_s = parse_duration(cfg.rate_window)

    def mfu_quantile(q: float) -> str:
        # Quantile over runs of each run's median MFU over the range.
        return f"quantile {per} ({q}, quantile_over_time(0.5, {mfu}[{rng}]))"

    def grown(record: str) -> str:
        return f"sum {per} (increase({rec(record, in_cluster)}[{rng}]))"

    def integral(record: str) -> str:
        # The mean rate over the range times the range (the rule holds per-second rates).
        return f"sum {per} (avg_over_time({rec(record, in_cluster)}[{rng}]) * {range_s})"

    productive, badput = grown(r.productive_total), grown(r.badput_total)
    goodput = f"{productive} / ({productive} + {badput})"

    def gpu_seconds(record: str) -> str:
        # Each run's growth weighted by its ranks (one GPU each): GPU-seconds.
        ranks = f"max_over_time({rec(r.slowdown.ranks, in_cluster)}[{rng}])"
        on_run = f"on ({', '.join(r.run_key)}) group_left ()"
        return f"sum {per} (increase({rec(record, in_cluster)}[{rng}])\n* {on_run}\n{ranks})"

    gpu_wall = f"({gpu_seconds(r.productive_total)}\n+ {gpu_seconds(r.badput_total)})"
    slow_share = f"{gpu_seconds(r.slowdown.slowdown_total)}\n/\n{gpu_wall}"
    failure_share = f"{gpu_seconds(r.slowdown.failure_total)}\n/\n{gpu_wall}"
    by_cause = rec(r.slowdown.gpu_rate_by_cause, in_cluster)
    slow_by_cause = (
        f"sum {by((c, 'slowdown_cause'))} (avg_over_time({by_cause}[{rng}]) * {range_s})"
        f"\n/ on ({c}) group_left ()\n{gpu_wall}"
    )
    rank_hours = f"(avg_over_time({rec(r.cluster_ranks, in_cluster)}[{rng}]) * {hours})"
    gpu_hours = f"(avg_over_time({rec(r.cluster_gpus, in_cluster)}[{rng}]) * {hours})"
    interruptions = f"1000 * {grown(r.restarts_total)} / {rank_hours}"
    # The rule counts the Xid errors of each rate window: its mean times the windows in the range.
    xid_rate = (
        f"1000 * sum {by((c, 'action'))} (avg_over_time({rec(r.xid_new, in_cluster)}[{rng}]) * {range_s} "
        f"/ {window_s})\n/ on ({c}) group_left ()\n{gpu_hours}"
    )
    bandwidth = f"{integral(r.checkpoint_bytes_rate)}\n/\n{integral(r.checkpoint_save_rate)}"
    storage_p99 = f"max {per} (quantile_over_time(0.99, {rec(r.storage_probe_p99, in_cluster)}[{rng}]))"
    lost_steps = Steps("green", ((cfg.slowdown_share / 2, "orange"), (cfg.slowdown_share, "red")))
    columns = (
        ("Value #A", "MFU p50 of runs"),
        ("Value #B", "MFU p10 of runs"),
        ("Value #C", "goodput"),
        ("Value #D", "interruptions / 1000 rank-h"),
        ("Value #E", "ckpt save B/s per rank"),
        ("Value #F", "storage probe p99"),
        ("Value #G", "GPU time lost to slow steps"),
        ("Value #H", "GPU time lost to failures"),
        (c, "cluster"),
    )
    items: list[Panel | Row] = [
        Row("Scorecard over the selected time range"),
        Panel(
            "Scorecard",
            (
                Target(mfu_quantile(0.5), mode="instant"),
                Target(mfu_quantile(0.1), mode="instant"),
                Target(goodput, mode="instant"),
                Target(interruptions, mode="instant"),
                Target(bandwidth, mode="instant"),
                Target(storage_p99, mode="instant"),
                Target(slow_share, mode="instant"),
                Target(failure_share, mode="instant"),
            ),
            kind="table",
            width=24,
            height=8,
            columns=columns,
            column_formats=(
                Column("MFU p50 of runs", "percentunit", mfu_steps(cfg)),
                Column("MFU p10 of runs", "percentunit", mfu_steps(cfg)),
                Column("goodput", "percentunit", goodput_steps(cfg)),
                Column("interruptions / 1000 rank-h", "short", decimals=2),
                Column("ckpt save B/s per rank", "Bps"),
                Column(
                    "storage probe p99",
                    "s",
                    Steps("green", ((cfg.storage_probe_slow_seconds, "red"),)),
                ),
                Column("GPU time lost to slow steps", "percentunit", lost_steps),
                Column("GPU time lost to failures", "percentunit", lost_steps),
            ),
            description="One row per cluster. MFU: each run's median over the range, then p50 and p10 over "
            "runs. Interruptions: restarts per 1000 rank-hours (a rank is about one GPU). GPU time lost: "
            "the ledger's slowdown (steps beyond the ideal step time) and failures (downtime, lost "
            "progress, startup, checkpoint loads, hangs), each run's weighted by its ranks.",
        ),
        Row("Efficiency"),
        Panel(
            "MFU distribution over runs",
            (
                Target(f"quantile {per} (0.1, {mfu})", "{{" + c + "}} p10"),
                Target(f"quantile {per} (0.5, {mfu})", "{{" + c + "}} p50"),
                Target(f"quantile {per} (0.9, {mfu})", "{{" + c + "}} p90"),
            ),
            unit="percentunit",
            min=0,
            width=12,
            thresholds=mfu_steps(cfg),
        ),
        Panel(
            "Goodput",
            (Target(goodput, "{{" + c + "}}", mode="instant"),),
            kind="bargauge",
            unit="percentunit",
            min=0,
            max=1,
            width=12,
            thresholds=goodput_steps(cfg),
            description="Productive time over wall time of all runs in the range.",
        ),
        Row("Slowness next to failures"),
        Panel(
            "GPU time lost: slow steps vs failures",
            (
                Target(slow_share, "{{" + c + "}} slow steps", mode="instant"),
                Target(failure_share, "{{" + c + "}} failures", mode="instant"),
            ),
            kind="bargauge",
            unit="percentunit",
            min=0,
            width=12,
            thresholds=lost_steps,
            description="Share of the runs' GPU time lost to steps slower than the run's ideal (fail-slow: "
            "nothing failed) next to the share lost to failures and their restarts.",
        ),
        Panel(
            "GPU time lost to slow steps, by likely cause",
            (Target(slow_by_cause, "{{" + c + "}} {{slowdown_cause}}", mode="instant"),),
            kind="bargauge",
            unit="percentunit",
            min=0,
            width=12,
            description="The slowdown by the cause the rule named while it was booked: a GPU throttling, "
            "a PCIe link below its width, fabric errors on the culprit's host, a straggler rank with "
            "none of these, or unknown. babysitter report RUN_DIR --prometheus URL names each episode.",
        ),
        Row("Reliability"),
        Panel(
            "Interruptions per 1000 rank-hours",
            (Target(interruptions, "{{" + c + "}}", mode="instant"),),
            kind="bargauge",
            width=8,
        ),
        Panel(
            "Xid errors per 1000 GPU-hours, by action",
            (Target(xid_rate, "{{" + c + "}} {{action}}", mode="instant"),),
            kind="bargauge",
            width=16,
            description="Reset, reboot and drain actions are the ones that stop jobs.",
        ),
        Row("Storage"),
        Panel(
            "Checkpoint save bandwidth per rank",
            (Target(bandwidth, "{{" + c + "}}", mode="instant"),),
            kind="bargauge",
            unit="Bps",
            width=12,
            description="Bytes written by checkpoint saves over their blocking time.",
        ),
        Panel(
            "Storage probe p99 (write + fsync)",
            (Target(storage_p99, "{{" + c + "}}", mode="instant"),),
            kind="bargauge",
            unit="s",
            width=12,
        ),
    ]
    variables = (Variable("cluster", f"label_values(up, {c})", "Cluster"),)
    return Dashboard(
        title="babysitter / Cluster scorecard",
        file_name=FILE_NAME,
        description="The hardware lottery, scored: MFU distribution, goodput, interruptions, Xid rate by "
        "action, checkpoint bandwidth and storage latency per cluster, side by side.",
        variables=variables,
        items=tuple(items),
        time_from="now-7d",
        refresh="5m",
    )
