"""Recording rules of fail-slow time: each run's share of time lost to slow steps, its likely cause, and
the cluster roll-ups the scorecard compares (GPU time lost to slowness next to GPU time lost to
failures).

The ledger's badput counter with ``cause="slowdown"`` (rank 0, continued across restarts) is
the step time beyond the run's ideal. Its likely cause, in PromQL, per run with slowdown in the rate
window: the **culprit** is a rank whose straggler score (collective arrival) or step time is at least
1.1x the median rank's; a culprit whose GPU throttles is ``gpu_throttling`` (and so is any throttled
GPU of a run with no culprit: a power cap on every GPU slows them all alike), a culprit with a PCIe
link below its width ``pcie``, with new NIC errors or flaps ``fabric``, any other culprit
``straggler``, and a run with none of these ``unknown``. ``babysitter report --prometheus`` makes the
same split per episode of slow steps, from the raw series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig, parse_duration
from babysitter.generate.promql import by, eq, newest, record_name, regex, select, total_growth, unit_test
from babysitter.ledger.slowdown import TOLERANCE

__all__ = [
    "FAILURE_CAUSES",
    "SLOWDOWN_CAUSES",
    "SlowdownRecords",
    "slowdown_cause_text",
    "slowdown_recording_tests",
    "slowdown_rules",
]

#: The badput causes that are failures (a restart's price, a hang) in the scorecard's comparison.
FAILURE_CAUSES = ("downtime", "lost_progress", "startup", "checkpoint_load", "hang")
#: The causes the slowdown rule names, best evidence first (the value ``topk`` keeps).
SLOWDOWN_CAUSES = ("gpu_throttling", "pcie", "fabric", "straggler", "unknown")


class _Keys(Protocol):
    """What the rules need of ``generate.rules.Records`` (which imports this module)."""

    @property
    def run_key(self) -> tuple[str, ...]: ...
    @property
    def rank_key(self) -> tuple[str, ...]: ...
    @property
    def rank_step_ratio(self) -> str: ...
    @property
    def rank_gpu_throttle(self) -> str: ...
    @property
    def rank_pcie_width(self) -> str: ...
    @property
    def rank_nic_errors(self) -> str: ...


@dataclass(frozen=True)
class SlowdownRecords:
    """Names of the slowdown recording rules (``Records.slowdown``)."""

    cfg: GenerateConfig

    @property
    def ratio(self) -> str:
        """Share of the run's wall time lost to slow steps over ``slowdown_window`` (the alert's input)."""
        return record_name(["run"], "train_slowdown", f"ratio{self.cfg.slowdown_window}")

    @property
    def cause(self) -> str:
        """1 per run with slowdown in the rate window, labelled ``slowdown_cause`` (and ``rank``,
        ``likely_host`` where a culprit is named)."""
        return record_name(["run"], "train_slowdown", "cause")

    @property
    def slowdown_total(self) -> str:
        """A run's slowdown seconds (the ledger's total, continued across restarts)."""
        return record_name(["run"], G.BADPUT_SECONDS.name, "slowdown_max")

    @property
    def failure_total(self) -> str:
        """A run's seconds lost to failures: downtime, lost progress, startup, checkpoint loads, hangs."""
        return record_name(["run"], G.BADPUT_SECONDS.name, "failures_sum")

    @property
    def ranks(self) -> str:
        """Ranks of a run (one GPU each): the weight of its seconds in GPU time."""
        return record_name(["run"], T.STEPS.base_name, "ranks")

    @property
    def gpu_rate_by_cause(self) -> str:
        """GPU-seconds lost to slow steps per second, per run and likely cause (ranks x slowdown rate)."""
        return record_name(["run"], "train_slowdown_gpu_seconds", f"rate{self.cfg.rate_window}")


def slowdown_rules(cfg: GenerateConfig, r: _Keys, s: SlowdownRecords) -> list[dict[str, object]]:
    """The ``babysitter-slowdown.rules`` group (after the rank-GPU and fabric groups it reads)."""
    ts, w = cfg.tracker_selector, cfg.rate_window
    run, rank = by(r.run_key), by(r.rank_key)
    on_run, on_rank = f"on ({', '.join(r.run_key)})", f"on ({', '.join(r.rank_key)})"
    slow = select(G.BADPUT_SECONDS, ts, eq("cause", "slowdown"))
    failures = select(G.BADPUT_SECONDS, ts, regex("cause", FAILURE_CAUSES))
    grown = total_growth(slow, r.run_key, r.run_key, w, cfg.stall_lookback_window)
    limit = f"{1.0 + TOLERANCE:g}"
    culprit = (
        f"(max {rank} ({select(R.STRAGGLER_SCORE, ts)}) >= {limit}\n"
        f"or max {rank} ({r.rank_step_ratio}) >= {limit})"
    )

    def host(expr: str) -> str:
        labeled = f'label_replace({expr}, "likely_host", "$1", "instance", "(.*)")'
        return f"max {by((*r.rank_key, 'likely_host'))} ({labeled})"

    def named(expr: str, cause: str) -> str:
        value = len(SLOWDOWN_CAUSES) - SLOWDOWN_CAUSES.index(cause)
        return f'label_replace(0 * ({expr}) + {value}, "slowdown_cause", "{cause}", "", "")'

    rank_gpu = f"max {by((*r.rank_key, 'instance'))} ({r.rank_gpu_throttle})"
    candidates = {
        "gpu_throttling": (
            f"{host(f'{rank_gpu} > 0 and {on_rank} {culprit}')}\n"
            f"or on ({', '.join(r.run_key)})\n{host(f'{rank_gpu} > 0 unless {on_run} {culprit}')}"
        ),
        "pcie": host(f"{r.rank_pcie_width} < 1 and {on_rank} {culprit}"),
        "fabric": host(f"{r.rank_nic_errors} > 0 and {on_rank} {culprit}"),
        "straggler": f"max {rank} ({culprit})",
    }
    best = "\nor\n".join(named(expr, cause) for cause, expr in candidates.items())
    slowing = f"(sum {run} ({grown}) > 0)"
    unknown = f'label_replace(0 * {slowing} + 1, "slowdown_cause", "unknown", "", "")'
    seconds = parse_duration(w)
    return [
        {"record": s.slowdown_total, "expr": f"max {run} ({slow})"},
        {
            "record": s.failure_total,
            "expr": f"sum {run} (max {by((*r.run_key, 'cause'))} ({failures}))",
        },
        {"record": s.ranks, "expr": f"count {run} ({select(T.STEPS, ts)})"},
        {
            "record": s.ratio,
            "expr": (
                f"{total_growth(slow, r.run_key, r.run_key, cfg.slowdown_window, cfg.stall_lookback_window)}"
                f"\n/ {parse_duration(cfg.slowdown_window)}"
            ),
        },
        {
            "record": s.cause,
            "expr": (
                f"0 * topk {run} (1,\n(\n{best}\n)\nand {on_run} {slowing}\n) + 1\nor {on_run}\n{unknown}"
            ),
        },
        {
            "record": s.gpu_rate_by_cause,
            "expr": (
                f"sum {run} ({grown}) / {seconds}\n* {on_run} group_left ()\n{s.ranks}\n"
                f"* {on_run} group_left (slowdown_cause)\n"
                f"max {by((*r.run_key, 'slowdown_cause'))} ({newest(s.cause, r.run_key)})"
            ),
        },
    ]


def slowdown_cause_text(s: SlowdownRecords, cluster_label: str) -> str:
    """ ": likely gpu throttling of rank 2 on host n1:9400" from the cause rule when the notification
    is rendered (nothing for ``unknown`` or no series): a template query, not a label, so a cause that
    changes does not make a new alert."""
    selector = "%s{%s=%%q,run=%%q}" % (s.cause, cluster_label)  # noqa: UP031 - Go template braces
    return (
        '{{ with query (printf "'
        + selector.replace('"', '\\"')
        + '" $labels.'
        + cluster_label
        + ' $labels.run) }}{{ with index . 0 }}{{ if ne .Labels.slowdown_cause "unknown" }}: likely '
        '{{ reReplaceAll "_" " " .Labels.slowdown_cause }}{{ with .Labels.rank }} of rank {{ . }}{{ end }}'
        "{{ with .Labels.likely_host }} on host {{ . }}{{ end }}{{ end }}{{ end }}{{ end }}"
    )


def slowdown_recording_tests(r: _Keys, s: SlowdownRecords) -> dict[str, object]:
    """A promtool test of the slowdown rules (default config; eval at 10m, 1m samples).

    ``s1`` loses 12 s a minute to slow steps (20%), its rank 1 straggles (score 1.5) on a GPU that
    throttles: gpu_throttling of rank 1 on its GPU's host. ``s2`` loses 3 s a minute, its rank 1
    straggles (1.4) on an unthrottled GPU: straggler. ``s3`` loses 6 s a minute with no culprit:
    unknown. ``s1`` also loses 6 s a minute to downtime (a failure).
    """
    base = {"cluster": "c1", "instance": "t1:9400", "job": "babysitter-node"}

    def ser(name: str, labels: dict[str, str]) -> str:
        inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
        return f"{name}{{{inner}}}"

    def out(record: str, **labels: str) -> str:
        return ser(record, {"cluster": "c1", **labels})

    gpu = {"cluster": "c1", "instance": "h1:9400", "job": "gpu", "gpu": "1", "pci_bus_id": "0000:28:00"}
    model = {"model": "NVIDIA H100 80GB HBM3"}
    series: list[tuple[str, str]] = [
        (ser(G.BADPUT_SECONDS.name, {**base, "run": "s1", "rank": "0", "cause": "slowdown"}), "0+12x20"),
        (ser(G.BADPUT_SECONDS.name, {**base, "run": "s1", "rank": "0", "cause": "downtime"}), "0+6x20"),
        (ser(G.BADPUT_SECONDS.name, {**base, "run": "s2", "rank": "0", "cause": "slowdown"}), "0+3x20"),
        (ser(G.BADPUT_SECONDS.name, {**base, "run": "s3", "rank": "0", "cause": "slowdown"}), "0+6x20"),
        *(
            (ser(T.STEPS.name, {**base, "run": run, "rank": n}), "0+60x20")
            for run, ranks in (("s1", "01"), ("s2", "01"), ("s3", "0"))
            for n in ranks
        ),
        *(
            (ser(R.STRAGGLER_SCORE.name, {**base, "run": run, "rank": n}), f"{score}+0x20")
            for run, scores in (("s1", ("1", "1.5")), ("s2", ("1", "1.4")))
            for n, score in zip("01", scores, strict=True)
        ),
        (ser(T.INFO.name, {**base, "run": "s1", "rank": "1", "uuid": "GPU-s1"}), "1+0x20"),
        (ser(N.GPU_UP.name, {**gpu, "uuid": "GPU-s1", **model}), "1+0x20"),
        (
            ser(N.GPU_CLOCK_EVENT_ACTIVE.name, {**gpu, "uuid": "GPU-s1", **model, "reason": "hw_slowdown"}),
            "1+0x20",
        ),
    ]
    cause = "slowdown_cause"
    cases: list[tuple[str, list[tuple[str, float]]]] = [
        (
            s.slowdown_total,
            [(out(s.slowdown_total, run=run), v) for run, v in (("s1", 120.0), ("s2", 30.0), ("s3", 60.0))],
        ),
        (s.failure_total, [(out(s.failure_total, run="s1"), 60.0)]),
        (s.ranks, [(out(s.ranks, run=run), v) for run, v in (("s1", 2.0), ("s2", 2.0), ("s3", 1.0))]),
        # Runs younger than the window count whole: 120 s of the 1800 s window.
        (
            s.ratio,
            [(out(s.ratio, run=run), v / 1800) for run, v in (("s1", 120), ("s2", 30), ("s3", 60))],
        ),
        (
            s.cause,
            [
                (out(s.cause, run="s1", rank="1", likely_host="h1:9400", **{cause: "gpu_throttling"}), 1),
                (out(s.cause, run="s2", rank="1", **{cause: "straggler"}), 1),
                (out(s.cause, run="s3", **{cause: "unknown"}), 1),
            ],
        ),
        # Over the 5m rate window: 60 s of s1's slowdown x 2 ranks / 300 s, 15 s x 2, 30 s x 1.
        (
            s.gpu_rate_by_cause,
            [
                (out(s.gpu_rate_by_cause, run="s1", **{cause: "gpu_throttling"}), 0.4),
                (out(s.gpu_rate_by_cause, run="s2", **{cause: "straggler"}), 0.1),
                (out(s.gpu_rate_by_cause, run="s3", **{cause: "unknown"}), 0.1),
            ],
        ),
    ]
    return {
        "evaluation_interval": "1m",
        "tests": [unit_test(series, cases, interval="1m", eval_time="10m")],
    }
