"""Alert rules, each with the promtool test cases that prove it fires and that it stays quiet.

Every alert carries ``severity`` (``critical`` pages, ``warning`` goes to chat), ``component``
(``training``, ``checkpoint``, ``storage``, ``gpu``, ``node``: what Alertmanager groups and inhibits by),
a summary, a description that quotes the value and the labels, and a ``runbook_url`` from the config's
one pattern. Each alert's test runs promtool against the generated recording and alert rules together:
quiet cases (before ``for:`` or below the threshold, often next to a healthy twin series) and a firing
case with its exact labels and rendered annotations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from babysitter.catalog import MetricSpec
from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import remediate as M
from babysitter.catalog import runtime as R
from babysitter.catalog import storage as S
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig, parse_duration
from babysitter.generate.promql import by, eq, new_or_increased, regex, select
from babysitter.generate.rules import Records

__all__ = ["Alert", "AlertTest", "alert_groups", "alerts", "test_file"]

Labels = Mapping[str, str]


@dataclass(frozen=True)
class AlertTest:
    """promtool input series and expectations for one alert (written for the default config)."""

    series: tuple[tuple[str, str], ...]
    #: Eval times at which the alert must not fire, with why (before ``for:``, below threshold...).
    quiet: tuple[tuple[str, str], ...]
    fire_at: str
    #: Labels of each alert expected at ``fire_at`` (besides severity and component), in order.
    fire_labels: tuple[Labels, ...]
    #: Expected summary and description, rendered, one pair per firing alert.
    fire_text: tuple[tuple[str, str], ...]
    interval: str = "1m"


@dataclass(frozen=True)
class Alert:
    """One alerting rule and its test."""

    name: str
    expr: str
    severity: str
    component: str
    summary: str
    description: str
    for_: str
    test: AlertTest | None = field(default=None, compare=False)

    def rule(self, cfg: GenerateConfig) -> dict[str, object]:
        """The rule as it goes into the rule file."""
        rule: dict[str, object] = {"alert": self.name, "expr": self.expr}
        if parse_duration(self.for_) > 0:
            rule["for"] = self.for_
        rule["labels"] = {"component": self.component, "severity": self.severity}
        rule["annotations"] = {
            "description": self.description,
            "runbook_url": cfg.runbook_url(self.name),
            "summary": self.summary,
        }
        return rule


def _l(name: str) -> str:
    return "{{ $labels.%s }}" % name  # noqa: UP031 - braces of Go templates fight f-strings


_V = "{{ $value | humanize }}"
_STEP = '{{ $value | printf "%.0f" }}'
_VD = "{{ $value | humanizeDuration }}"
_VP = "{{ $value | humanizePercentage }}"


def _series(spec: MetricSpec, labels: Labels, suffix: str = "") -> str:
    """A promtool input series name for a catalog entry."""
    inner = ", ".join(eq(key, value) for key, value in labels.items())
    return f"{spec.name}{suffix}{{{inner}}}"


def _up_series(labels: Labels) -> str:
    inner = ", ".join(eq(key, value) for key, value in labels.items())
    return f"up{{{inner}}}"


# Test fixtures: the label sets series carry in a real deployment (tracker series come through the
# node agent, so they carry its job and instance too).
_TRAIN = {"cluster": "c1", "instance": "n1:9400", "job": "babysitter-node", "run": "r1", "rank": "0"}
_GPU = {
    "cluster": "c1",
    "gpu": "3",
    "instance": "n1:9400",
    "job": "babysitter-node",
    "model": "NVIDIA H100 80GB HBM3",
    "pci_bus_id": "0000:9b:00",
    "uuid": "GPU-8c5d3f3a",
}


def _with(base: Labels, **extra: str) -> dict[str, str]:
    return {**base, **extra}


def _run_labels(run: str = "r1") -> dict[str, str]:
    return {"cluster": "c1", "run": run}


def _gpu_labels(**extra: str) -> dict[str, str]:
    keep = ("cluster", "instance", *N.GPU_LABELS)
    return {**{key: _GPU[key] for key in keep}, **extra}


def _stepping(labels: Labels, values: str) -> tuple[tuple[str, str], ...]:
    """A rank whose last-step time and 1 s steps follow ``values`` (seconds since the test began)."""
    return (
        (_series(T.LAST_STEP_TIMESTAMP, labels), values),
        (_series(T.STEP_DURATION, labels, "_sum"), values),
        (_series(T.STEP_DURATION, labels, "_count"), values),
    )


def _training(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ts, c = cfg.tracker_selector, cfg.cluster_label
    run, on_run = by(r.run_key), f"on ({', '.join(r.run_key)})"
    stall_min = cfg.stall_min_seconds
    remembered = f"max_over_time({r.last_step}[{cfg.stall_lookback_window}])"
    not_answering = f"max {run} ({select(N.TRAINER_SCRAPE_SUCCESS, cfg.node_selector)} == 0)"
    stalled = Alert(
        name="TrainingStalled",
        # Answering ranks report the tracker's own stall clock, which pauses during checkpoints and marked
        # phases (a 20-minute save is not a stall); the slowest-to-stall rank decides. A run whose ranks
        # no longer answer the node agent (stopped, hard hang) falls back to the age of its last step,
        # remembered after its series vanish; so does a tracker too old to export the stall clock. A run
        # that finished unregistered itself and matches neither.
        expr=(
            f"(\n  min {run} ({select(R.STALLED_SECONDS, ts)})\n  or {on_run}\n"
            f"  (\n    time() - {remembered}\n    and {on_run}\n"
            f"    ({r.last_step} or {on_run} {not_answering})\n  )\n)\n> {on_run}\n"
            f"(\n  ({cfg.stall_step_factor:g} * {r.step_baseline} > {stall_min})\n  or {on_run}\n"
            f"  (0 * {remembered} + {stall_min})\n)"
        ),
        severity="critical",
        component="training",
        summary=f"Run {_l('run')} has not finished a step for {_VD}.",
        description=(
            f"No rank of run {_l('run')} on cluster {_l(c)} finished a training step for {_VD}; the stall "
            f"threshold is max({stall_min}s, {cfg.stall_step_factor:g} x the run's mean step time over "
            f"{cfg.stall_baseline_window}). The job hangs (collective, data loader, storage) or is stopped."
        ),
        for_=cfg.stall_for,
        test=AlertTest(
            series=(
                # r1 hangs but its endpoint still answers; r2 keeps stepping.
                *_stepping(_TRAIN, "0+60x20 1200+0x40"),
                *_stepping(_with(_TRAIN, run="r2"), "0+60x60"),
                # r3 is stopped (SIGSTOP): its series vanish, the node agent's fetch of it fails.
                *_stepping(_with(_TRAIN, run="r3"), "0+60x20"),
                (_series(N.TRAINER_SCRAPE_SUCCESS, _with(_TRAIN, run="r3")), "1+0x20 0+0x40"),
                # r4 finished cleanly: series and registration gone.
                *_stepping(_with(_TRAIN, run="r4"), "0+60x20"),
                (_series(N.TRAINER_SCRAPE_SUCCESS, _with(_TRAIN, run="r4")), "1+0x20"),
                # r5 saves a long checkpoint: no step for 40 min, but its stall clock is paused.
                *_stepping(_with(_TRAIN, run="r5"), "0+60x20 1200+0x40"),
                (_series(R.STALLED_SECONDS, _with(_TRAIN, run="r5")), "0+0x60"),
                # r6 hangs and its tracker says so; rank 1 of it is still (barely) stepping.
                *_stepping(_with(_TRAIN, run="r6"), "0+60x20 1200+0x40"),
                (_series(R.STALLED_SECONDS, _with(_TRAIN, run="r6")), "0+0x20 60+60x40"),
                (_series(R.STALLED_SECONDS, _with(_TRAIN, run="r6", rank="1")), "0+0x20 30+60x40"),
            ),
            quiet=(("25m", "5 min without a step is below the 10 min minimum"), ("31m", "before for:")),
            fire_at="32m",
            fire_labels=(_run_labels(), _run_labels("r3"), _run_labels("r6")),
            fire_text=tuple(
                (
                    f"Run {run_name} has not finished a step for {age}.",
                    f"No rank of run {run_name} on cluster c1 finished a training step for {age}; the stall "
                    "threshold is max(600s, 10 x the run's mean step time over 1h). The job hangs "
                    "(collective, data loader, storage) or is stopped.",
                )
                for run_name, age in (("r1", "12m 0s"), ("r3", "12m 0s"), ("r6", "11m 30s"))
            ),
        ),
    )
    dropped = select(N.TRAINER_REGISTRATIONS_DROPPED, cfg.node_selector)
    exited = Alert(
        name="TrainingProcessExited",
        expr=f"sum by ({c}, instance) (\n  {new_or_increased(dropped, cfg.trainer_exit_window)}\n)",
        severity="warning",
        component="training",
        summary=f"A training process on {_l('instance')} exited without closing its tracker.",
        description=(
            f"{_V} training processes on {_l('instance')} (cluster {_l(c)}) died in the last "
            f"{cfg.trainer_exit_window} without unregistering (crash, OOM kill, SIGKILL). If the job does "
            f"not restart, nothing else pages: its series are gone."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(N.TRAINER_REGISTRATIONS_DROPPED, _node_labels()), "0+0x10 1+0x20"),
                (
                    _series(N.TRAINER_REGISTRATIONS_DROPPED, _with(_node_labels(), instance="n2:9400")),
                    "0+0x30",
                ),
            ),
            quiet=(("10m", "no exit yet"), ("25m", "the exit left the window")),
            fire_at="12m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400"},),
            fire_text=(
                (
                    "A training process on n1:9400 exited without closing its tracker.",
                    "1 training processes on n1:9400 (cluster c1) died in the last 10m without unregistering "
                    "(crash, OOM kill, SIGKILL). If the job does not restart, nothing else pages: its series "
                    "are gone.",
                ),
            ),
        ),
    )
    target_labels = {"cluster": "c1", "instance": "n1:8000", "job": "babysitter-train"}
    train_down = Alert(
        name="TrainingTargetDown",
        expr=f"up{{{cfg.tracker_up_selector}}} == 0",
        severity="warning",
        component="training",
        summary=f"Training metrics endpoint {_l('instance')} is down.",
        description=(
            f"Prometheus has not scraped {_l('job')} at {_l('instance')} for {cfg.target_down_for}: the "
            "training process died, hangs hard, or its port is unreachable. Its run's alerts are blind."
        ),
        for_=cfg.target_down_for,
        test=AlertTest(
            series=(
                (_up_series(target_labels), "1+0x5 0+0x10"),
                (_up_series(_with(target_labels, instance="n2:8000")), "1+0x15"),
            ),
            quiet=(("5m", "target up"), ("10m", "before for:")),
            fire_at="12m",
            fire_labels=(target_labels,),
            fire_text=(
                (
                    "Training metrics endpoint n1:8000 is down.",
                    "Prometheus has not scraped babysitter-train at n1:8000 for 5m: the training process "
                    "died, hangs hard, or its port is unreachable. Its run's alerts are blind.",
                ),
            ),
        ),
    )
    mfu = r.mfu
    mfu_drop = Alert(
        name="TrainingMfuDrop",
        expr=(
            f"{mfu}\n< {on_run}\n"
            f"({1 - cfg.mfu_drop_fraction:g} * "
            f"quantile_over_time(0.5, {mfu}[{cfg.mfu_baseline_window}]))"
            f"\nand {on_run}\n{r.steps_rate} > 0"
        ),
        severity="warning",
        component="training",
        summary=f"MFU of run {_l('run')} dropped to {_VP}.",
        description=(
            f"Run {_l('run')} on cluster {_l(c)} runs at {_VP} MFU, more than "
            f"{cfg.mfu_drop_fraction:.0%} below its median over the last {cfg.mfu_baseline_window}, "
            f"while still stepping. Look for a slow node, throttling GPUs or a data stall."
        ),
        for_=cfg.mfu_drop_for,
        test=AlertTest(
            series=(
                (_series(T.MODEL_FLOPS, _TRAIN), "0+3000x120 361800+1800x80"),
                (_series(T.PEAK_FLOPS, _TRAIN), "100+0x200"),
                (_series(T.STEPS, _TRAIN), "0+60x200"),
                (_series(T.MODEL_FLOPS, _with(_TRAIN, run="r2")), "0+3000x200"),
                (_series(T.PEAK_FLOPS, _with(_TRAIN, run="r2")), "100+0x200"),
                (_series(T.STEPS, _with(_TRAIN, run="r2")), "0+60x200"),
            ),
            quiet=(("100m", "MFU at its baseline"), ("150m", "before for:")),
            fire_at="160m",
            fire_labels=(_run_labels(),),
            fire_text=(
                (
                    "MFU of run r1 dropped to 30%.",
                    "Run r1 on cluster c1 runs at 30% MFU, more than 20% below its median over the last "
                    "6h, while still stepping. Look for a slow node, throttling GPUs or a data stall.",
                ),
            ),
        ),
    )
    straggler = Alert(
        name="TrainingStragglerRank",
        expr=(
            f"(\n  {r.rank_step_ratio} > {cfg.straggler_ratio:g}\n"
            f"  and {on_run}\n  count {run} ({r.rank_step_mean}) >= 2\n)\n"
            # The in-process score compares each rank's own work time, which lockstep collectives
            # hide from step time; it exists only where the run turned the exchange on.
            f"or\nmax {by((*r.run_key, 'rank'))} ({select(R.STRAGGLER_SCORE, ts)}) > {cfg.straggler_ratio:g}"
        ),
        severity="warning",
        component="training",
        summary=f"Rank {_l('rank')} of run {_l('run')} steps {_V}x slower than the median rank.",
        description=(
            f"Rank {_l('rank')} of run {_l('run')} on cluster {_l(c)} is {_V} times slower than the median "
            f"rank over {cfg.rate_window} (mean step time, or its own work time where the run reports "
            f"straggler scores). Find its host on the Stragglers dashboard and check that node's GPUs "
            f"(throttling, Xid), NICs and data loader."
        ),
        for_=cfg.straggler_for,
        test=AlertTest(
            series=(
                *(
                    item
                    for rank, per_step in (("0", 60), ("1", 60), ("2", 90))
                    for item in (
                        (_series(T.STEP_DURATION, _with(_TRAIN, rank=rank), "_sum"), f"0+{per_step}x40"),
                        (_series(T.STEP_DURATION, _with(_TRAIN, rank=rank), "_count"), "0+60x40"),
                    )
                ),
                # Lockstep run r2: equal step times, but rank 1's own work is 1.4x the median.
                (_series(R.STRAGGLER_SCORE, _with(_TRAIN, run="r2", rank="0")), "1+0x40"),
                (_series(R.STRAGGLER_SCORE, _with(_TRAIN, run="r2", rank="1")), "1.4+0x40"),
                (_series(R.STRAGGLER_SCORE, _with(_TRAIN, run="r3", rank="0")), "1.1+0x40"),
            ),
            quiet=(("10m", "before for:"),),
            fire_at="20m",
            fire_labels=(_with(_run_labels(), rank="2"), _with(_run_labels("r2"), rank="1")),
            fire_text=(
                (
                    "Rank 2 of run r1 steps 1.5x slower than the median rank.",
                    "Rank 2 of run r1 on cluster c1 is 1.5 times slower than the median rank over 5m "
                    "(mean step time, or its own work time where the run reports straggler scores). Find "
                    "its host on the Stragglers dashboard and check that node's GPUs (throttling, Xid), "
                    "NICs and data loader.",
                ),
                (
                    "Rank 1 of run r2 steps 1.4x slower than the median rank.",
                    "Rank 1 of run r2 on cluster c1 is 1.4 times slower than the median rank over 5m "
                    "(mean step time, or its own work time where the run reports straggler scores). Find "
                    "its host on the Stragglers dashboard and check that node's GPUs (throttling, Xid), "
                    "NICs and data loader.",
                ),
            ),
        ),
    )
    goodput = Alert(
        name="TrainingGoodputLow",
        expr=(
            f"{r.goodput_window} < {cfg.goodput_target:g}\n"
            f"and {on_run}\n({r.productive_window} + {r.badput_window}) > {cfg.goodput_min_wall_seconds}"
        ),
        severity="warning",
        component="training",
        summary=f"Goodput of run {_l('run')} is {_VP} over {cfg.goodput_window}.",
        description=(
            f"Run {_l('run')} on cluster {_l(c)} turned only {_VP} of its wall time into kept progress "
            f"over the last {cfg.goodput_window} (target {cfg.goodput_target:.0%}). The Run overview "
            f"dashboard splits the rest by cause."
        ),
        for_=cfg.goodput_for,
        test=AlertTest(
            series=(
                (_series(G.PRODUCTIVE_SECONDS, _TRAIN), "0+48x300"),
                (_series(G.BADPUT_SECONDS, _with(_TRAIN, cause="downtime")), "0+12x300"),
                (_series(G.PRODUCTIVE_SECONDS, _with(_TRAIN, run="r2")), "0+57x300"),
                (_series(G.BADPUT_SECONDS, _with(_TRAIN, run="r2", cause="startup")), "0+3x300"),
            ),
            quiet=(("170m", "younger than 3h of wall time"), ("235m", "before for:")),
            fire_at="250m",
            fire_labels=(_run_labels(),),
            fire_text=(
                (
                    "Goodput of run r1 is 80% over 24h.",
                    "Run r1 on cluster c1 turned only 80% of its wall time into kept progress over the "
                    "last 24h (target 90%). The Run overview dashboard splits the rest by cause.",
                ),
            ),
        ),
    )
    nonfinite = Alert(
        name="TrainingNonFiniteLoss",
        expr=f"sum {run} (\n  {new_or_increased(select(T.NONFINITE_LOSS, ts), cfg.nonfinite_window)}\n)",
        severity="critical",
        component="training",
        summary=f"Run {_l('run')} produced a NaN or infinite loss.",
        description=(
            f"Run {_l('run')} on cluster {_l(c)} read {_V} non-finite loss values in the last "
            f"{cfg.nonfinite_window}. Every step from here on may be wasted: decide whether to roll back "
            f"to the last good checkpoint."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(T.NONFINITE_LOSS, _TRAIN), "0+0x10 3+0x10"),
                (_series(T.NONFINITE_LOSS, _with(_TRAIN, run="r2")), "0+0x20"),
            ),
            quiet=(("10m", "no non-finite loss yet"),),
            fire_at="12m",
            fire_labels=(_run_labels(),),
            fire_text=(
                (
                    "Run r1 produced a NaN or infinite loss.",
                    "Run r1 on cluster c1 read 3 non-finite loss values in the last 10m. Every step from "
                    "here on may be wasted: decide whether to roll back to the last good checkpoint.",
                ),
            ),
        ),
    )
    writer_state = select(G.LEDGER_WRITER_STATE, ts, 'state!="writing"')
    ledger = Alert(
        name="TrainingLedgerNotWriting",
        expr=f"max by ({', '.join(r.run_key)}, state) (\n  {writer_state}\n) == 1",
        severity="critical",
        component="training",
        summary=f"Run {_l('run')} writes no goodput ledger: its writer is {_l('state')}.",
        description=(
            f"The goodput ledger writer of run {_l('run')} on cluster {_l(c)} has been {_l('state')} "
            f"for {cfg.ledger_not_writing_for} (waiting: another writer's lock is not stale yet; "
            f"failing: the run directory's storage fails; fenced: another writer took the lock over). "
            f"Its records pile up in memory or are lost, and the run's goodput history gets a hole."
        ),
        for_=cfg.ledger_not_writing_for,
        test=AlertTest(
            series=(
                (_series(G.LEDGER_WRITER_STATE, _with(_TRAIN, state="writing")), "1+0x5 0+0x30"),
                (_series(G.LEDGER_WRITER_STATE, _with(_TRAIN, state="waiting")), "0+0x5 1+0x30"),
                # A restart after a crash elsewhere: two minutes of waiting, then writing.
                (_series(G.LEDGER_WRITER_STATE, _with(_TRAIN, run="r2", state="writing")), "0+0x2 1+0x33"),
                (_series(G.LEDGER_WRITER_STATE, _with(_TRAIN, run="r2", state="waiting")), "1+0x2 0+0x33"),
            ),
            quiet=(("5m", "still writing"), ("18m", "before for:")),
            fire_at="25m",
            fire_labels=({**_run_labels(), "state": "waiting"},),
            fire_text=(
                (
                    "Run r1 writes no goodput ledger: its writer is waiting.",
                    "The goodput ledger writer of run r1 on cluster c1 has been waiting for 15m (waiting: "
                    "another writer's lock is not stale yet; failing: the run directory's storage fails; "
                    "fenced: another writer took the lock over). Its records pile up in memory or are lost, "
                    "and the run's goodput history gets a hole.",
                ),
            ),
        ),
    )
    return [stalled, exited, train_down, mfu_drop, straggler, goodput, nonfinite, ledger]


def _checkpoint(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ts, ns, c = cfg.tracker_selector, cfg.node_selector, cfg.cluster_label
    run, on_run = by(r.run_key), f"on ({', '.join(r.run_key)})"
    last = select(T.CKPT_LAST_SUCCESS, ts)
    start = select(T.RUN_START_TIMESTAMP, ts)
    # The reference time: the last successful save, or the incarnation's start before any save.
    since = f"(max {run} ({last} > 0) or {on_run} max {run} ({start}))"
    limit = cfg.checkpoint_overdue_max_seconds
    overdue = Alert(
        name="CheckpointOverdue",
        expr=(
            f"time() - {since}\n> {on_run}\n"
            f"(\n  clamp_max({cfg.checkpoint_overdue_factor:g} * {r.checkpoint_interval}, {limit})\n"
            f"  or {on_run}\n  (0 * {since} + {limit})\n)"
        ),
        severity="warning",
        component="checkpoint",
        summary=f"Run {_l('run')} has not saved a checkpoint for {_VD}.",
        description=(
            f"The last successful checkpoint save of run {_l('run')} on cluster {_l(c)} was {_VD} ago, "
            f"more than {cfg.checkpoint_overdue_factor:g}x its observed save interval (at most {limit}s). "
            f"A crash now loses all of that progress."
        ),
        for_=cfg.checkpoint_overdue_for,
        test=AlertTest(
            series=(
                (_series(T.CKPT_LAST_SUCCESS, _TRAIN), "_x10 600+0x29 2400+0x29 4200+0x29 6000+0x120"),
                (_series(T.RUN_START_TIMESTAMP, _TRAIN), "0+0x220"),
                (
                    _series(T.CKPT_LAST_SUCCESS, _with(_TRAIN, run="r2")),
                    "_x10 600+0x29 2400+0x29 4200+0x29 6000+0x29 7800+0x29 9600+0x29 11400+0x29",
                ),
                (_series(T.RUN_START_TIMESTAMP, _with(_TRAIN, run="r2")), "0+0x220"),
            ),
            quiet=(("150m", "within 2x the 30 min interval"), ("165m", "before for:")),
            fire_at="170m",
            fire_labels=(_run_labels(),),
            fire_text=(
                (
                    "Run r1 has not saved a checkpoint for 1h 10m 0s.",
                    "The last successful checkpoint save of run r1 on cluster c1 was 1h 10m 0s ago, more "
                    "than 2x its observed save interval (at most 14400s). A crash now loses all of that "
                    "progress.",
                ),
            ),
        ),
    )
    fw = cfg.checkpoint_failure_window
    failing = Alert(
        name="CheckpointSaveFailing",
        expr=f"sum {run} (\n  {new_or_increased(select(T.CKPT_FAILURES, ts), fw)}\n)",
        severity="critical",
        component="checkpoint",
        summary=f"Checkpoint saves of run {_l('run')} are failing.",
        description=(
            f"{_V} checkpoint saves of run {_l('run')} on cluster {_l(c)} raised an error in the last {fw}. "
            f"Until one succeeds, every step is at risk."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(T.CKPT_FAILURES, _TRAIN), "0+0x30 1+0x30"),
                (_series(T.CKPT_FAILURES, _with(_TRAIN, run="r2")), "0+0x60"),
            ),
            quiet=(("30m", "no failure yet"), ("65m", "the failure left the window")),
            fire_at="35m",
            fire_labels=(_run_labels(),),
            fire_text=(
                (
                    "Checkpoint saves of run r1 are failing.",
                    "1 checkpoint saves of run r1 on cluster c1 raised an error in the last 30m. Until one "
                    "succeeds, every step is at risk.",
                ),
            ),
        ),
    )
    sw = cfg.checkpoint_slow_window
    save_sum = select(T.CKPT_SAVE_DURATION, ts, suffix="_sum")
    save_count = select(T.CKPT_SAVE_DURATION, ts, suffix="_count")
    slow = Alert(
        name="CheckpointSaveSlow",
        expr=(
            # "> 0" keeps a restart (the histogram starting over) from dividing by a zero rate.
            f"max {run} (\n  rate({save_sum}[{sw}])\n  /\n  (rate({save_count}[{sw}]) > 0)\n)"
            f" > {cfg.checkpoint_save_slow_seconds:g}"
        ),
        severity="warning",
        component="checkpoint",
        summary=f"Checkpoint saves of run {_l('run')} take {_VD}.",
        description=(
            f"Checkpoint saves of run {_l('run')} on cluster {_l(c)} blocked training for {_VD} on average "
            f"over the last {sw} (threshold {cfg.checkpoint_save_slow_seconds:g}s). Check the storage probe "
            f"of the run's nodes."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(T.CKPT_SAVE_DURATION, _TRAIN, "_sum"), "0+0x10 900+0x20"),
                (_series(T.CKPT_SAVE_DURATION, _TRAIN, "_count"), "0+0x10 1+0x20"),
                (_series(T.CKPT_SAVE_DURATION, _with(_TRAIN, run="r2"), "_sum"), "0+0x10 60+0x20"),
                (_series(T.CKPT_SAVE_DURATION, _with(_TRAIN, run="r2"), "_count"), "0+0x10 1+0x20"),
            ),
            quiet=(("10m", "no save yet"),),
            fire_at="20m",
            fire_labels=(_run_labels(),),
            fire_text=(
                (
                    "Checkpoint saves of run r1 take 15m 0s.",
                    "Checkpoint saves of run r1 on cluster c1 blocked training for 15m 0s on average over "
                    "the last 2h (threshold 600s). Check the storage probe of the run's nodes.",
                ),
            ),
        ),
    )
    missing_key = (c, "run")
    missing = Alert(
        name="CheckpointMissing",
        # The value is the newest missing step (the sentinel counts missing checkpoints per run and
        # names the newest, instead of a series per step).
        expr=(
            f"max {by(missing_key)} ({select(S.CHECKPOINT_MISSING_STEP, ns)})\n"
            f"and on ({', '.join(missing_key)})\n"
            f"max {by(missing_key)} ({select(S.CHECKPOINT_MISSING, ns)}) > 0"
        ),
        severity="critical",
        component="checkpoint",
        summary=f"Checkpoint of step {_STEP} of run {_l('run')} is missing.",
        description=(
            f"The ledger of run {_l('run')} on cluster {_l(c)} records a completed checkpoint of step "
            f"{_STEP}, but the sentinel finds it missing or of the wrong size (and maybe older ones: see "
            f"{S.CHECKPOINT_MISSING.name}). A restart from it would fail; the last good checkpoint is older."
        ),
        for_=cfg.checkpoint_missing_for,
        test=AlertTest(
            series=(
                (_series(S.CHECKPOINT_MISSING, _with(_node_labels(), run="r1")), "0+0x5 1+0x20"),
                (_series(S.CHECKPOINT_MISSING_STEP, _with(_node_labels(), run="r1")), "_x5 4000+0x20"),
                (_series(S.CHECKPOINT_MISSING, _with(_node_labels(), run="r2")), "0+0x25"),
            ),
            quiet=(("5m", "present"), ("7m", "before for:")),
            fire_at="10m",
            fire_labels=({"cluster": "c1", "run": "r1"},),
            fire_text=(
                (
                    "Checkpoint of step 4000 of run r1 is missing.",
                    "The ledger of run r1 on cluster c1 records a completed checkpoint of step 4000, but the "
                    "sentinel finds it missing or of the wrong size (and maybe older ones: see "
                    f"{S.CHECKPOINT_MISSING.name}). A restart from it would fail; the last good checkpoint "
                    "is older.",
                ),
            ),
        ),
    )
    return [overdue, failing, slow, missing]


def _node(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ns, c = cfg.node_selector, cfg.cluster_label
    host_path = (c, "instance", "path")
    slow_s = f"{cfg.storage_probe_slow_seconds:g}"
    running = select(S.STORAGE_PROBE_RUNNING, ns)
    storage_slow = Alert(
        name="StorageProbeSlow",
        # Slow probes, or one that has not returned at all (a hung mount never updates the timings).
        expr=(
            f"max {by(host_path)} (avg_over_time({r.storage_probe_total}[{cfg.storage_probe_window}]))"
            f" > {slow_s}\nor\nmax {by(host_path)} ({running}) > {slow_s}"
        ),
        severity="warning",
        component="storage",
        summary=f"Checkpoint storage {_l('path')} on {_l('instance')} is slow: {_VD} per probe.",
        description=(
            f"A small write + fsync in {_l('path')} on {_l('instance')} (cluster {_l(c)}) took {_VD} on "
            f"average over {cfg.storage_probe_window}, or has been running that long (threshold {slow_s}s). "
            f"Checkpoint saves there will be slow, time out or hang."
        ),
        for_=cfg.storage_probe_for,
        test=AlertTest(
            series=(
                (_series(S.STORAGE_PROBE_WRITE, _with(_GPU, path="/ckpt")), "0.5+0x40"),
                (_series(S.STORAGE_PROBE_FSYNC, _with(_GPU, path="/ckpt")), "0.2+0x10 8+0x30"),
                (_series(S.STORAGE_PROBE_RUNNING, _with(_GPU, path="/ckpt")), "0+0x40"),
                (_series(S.STORAGE_PROBE_WRITE, _with(_GPU, path="/fast")), "0.5+0x40"),
                (_series(S.STORAGE_PROBE_FSYNC, _with(_GPU, path="/fast")), "0.2+0x40"),
                (_series(S.STORAGE_PROBE_RUNNING, _with(_GPU, path="/fast")), "0+0x40"),
                # /hung: the last probe was fast, the current one never returns.
                (_series(S.STORAGE_PROBE_WRITE, _with(_GPU, path="/hung")), "0.5+0x40"),
                (_series(S.STORAGE_PROBE_FSYNC, _with(_GPU, path="/hung")), "0.2+0x40"),
                (_series(S.STORAGE_PROBE_RUNNING, _with(_GPU, path="/hung")), "0+0x20 60+60x20"),
            ),
            quiet=(("10m", "fast"), ("25m", "before for:")),
            fire_at="35m",
            fire_labels=(
                {"cluster": "c1", "instance": "n1:9400", "path": "/ckpt"},
                {"cluster": "c1", "instance": "n1:9400", "path": "/hung"},
            ),
            fire_text=tuple(
                (
                    f"Checkpoint storage {path} on n1:9400 is slow: {took} per probe.",
                    f"A small write + fsync in {path} on n1:9400 (cluster c1) took {took} on average over "
                    "10m, or has been running that long (threshold 5s). Checkpoint saves there will be slow, "
                    "time out or hang.",
                )
                for path, took in (("/ckpt", "8.5s"), ("/hung", "15m 0s"))
            ),
        ),
    )
    host_key = (c, "instance")
    probe_up = S.STORAGE_PROBE_UP
    storage_failing = Alert(
        name="StorageProbeFailing",
        expr=f"max {by(host_path)} ({select(probe_up, ns)}) == 0",
        severity="warning",
        component="storage",
        summary=f"Checkpoint storage {_l('path')} on {_l('instance')} fails the storage probe.",
        description=(
            f"The storage probe of {_l('path')} on {_l('instance')} (cluster {_l(c)}) has failed for "
            f"{cfg.storage_failing_for}: the directory is missing, read-only, full, not permitted or "
            f"returns I/O errors (the reason label of the probe's error counter says which). Checkpoint "
            f"saves there fail."
        ),
        for_=cfg.storage_failing_for,
        test=AlertTest(
            series=(
                (_series(probe_up, _with(_node_labels(), path="/ckpt")), "1+0x5 0+0x20"),
                (_series(probe_up, _with(_node_labels(), path="/fast")), "1+0x25"),
            ),
            quiet=(("5m", "succeeding"), ("9m", "before for:")),
            fire_at="15m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400", "path": "/ckpt"},),
            fire_text=(
                (
                    "Checkpoint storage /ckpt on n1:9400 fails the storage probe.",
                    "The storage probe of /ckpt on n1:9400 (cluster c1) has failed for 5m: the directory is "
                    "missing, read-only, full, not permitted or returns I/O errors (the reason label of the "
                    "probe's error counter says which). Checkpoint saves there fail.",
                ),
            ),
        ),
    )
    success = N.COLLECTOR_SUCCESS
    collector_key = (*host_key, "collector")
    collector_failing = Alert(
        name="NodeCollectorFailing",
        expr=f"max {by(collector_key)} ({select(success, ns)}) == 0",
        severity="warning",
        component="node",
        summary=f"Node agent collector {_l('collector')} on {_l('instance')} fails.",
        description=(
            f"The {_l('collector')} collector of the node agent on {_l('instance')} (cluster {_l(c)}) has "
            f"failed for {cfg.collector_failing_for}; what it watches (GPUs, Xid, storage, trainers) is "
            f"blind there. Its log line says why."
        ),
        for_=cfg.collector_failing_for,
        test=AlertTest(
            series=(
                (_series(success, {**_node_labels(), "collector": "xid"}), "1+0x5 0+0x20"),
                (_series(success, {**_node_labels(), "collector": "gpu"}), "1+0x25"),
            ),
            quiet=(("5m", "succeeding"), ("15m", "before for:")),
            fire_at="20m",
            fire_labels=({"cluster": "c1", "collector": "xid", "instance": "n1:9400"},),
            fire_text=(
                (
                    "Node agent collector xid on n1:9400 fails.",
                    "The xid collector of the node agent on n1:9400 (cluster c1) has failed for 10m; what "
                    "it watches (GPUs, Xid, storage, trainers) is blind there. Its log line says why.",
                ),
            ),
        ),
    )
    sources = N.XID_SOURCE_UP
    xid_blind = Alert(
        name="NodeXidBlind",
        # One source (kernel log or NVML events) is enough; only when every one fails is the host blind.
        expr=f"max {by(host_key)} ({select(sources, ns)}) == 0",
        severity="warning",
        component="node",
        summary=f"Xid errors on {_l('instance')} go unseen.",
        description=(
            f"No Xid source (kernel log, NVML events) of the node agent on {_l('instance')} (cluster "
            f"{_l(c)}) has worked for {cfg.collector_failing_for}: GPU faults there raise no Xid alert. "
            f"Usually /dev/kmsg is unreadable for the agent's user or container."
        ),
        for_=cfg.collector_failing_for,
        test=AlertTest(
            series=(
                (_series(sources, {**_node_labels(), "source": "kmsg"}), "1+0x5 0+0x20"),
                (_series(sources, {**_node_labels(), "source": "nvml"}), "0+0x25"),
                (_series(sources, {**_node_labels(), "instance": "n2:9400", "source": "kmsg"}), "0+0x25"),
                (_series(sources, {**_node_labels(), "instance": "n2:9400", "source": "nvml"}), "1+0x25"),
            ),
            quiet=(("5m", "the kernel log still works"), ("15m", "before for:")),
            fire_at="20m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400"},),
            fire_text=(
                (
                    "Xid errors on n1:9400 go unseen.",
                    "No Xid source (kernel log, NVML events) of the node agent on n1:9400 (cluster c1) has "
                    "worked for 10m: GPU faults there raise no Xid alert. Usually /dev/kmsg is unreadable "
                    "for the agent's user or container.",
                ),
            ),
        ),
    )
    agent_labels = {"cluster": "c1", "instance": "n1:9400", "job": "babysitter-node"}
    agent_down = Alert(
        name="NodeAgentDown",
        expr=f"up{{{cfg.node_up_selector}}} == 0",
        severity="critical",
        component="node",
        summary=f"Node agent {_l('instance')} is down.",
        description=(
            f"Prometheus has not scraped the node agent at {_l('instance')} (cluster {_l(c)}) for "
            f"{cfg.target_down_for}: the host is down or unreachable, or the agent died. Its GPU alerts "
            f"are silenced meanwhile."
        ),
        for_=cfg.target_down_for,
        test=AlertTest(
            series=(
                (_up_series(agent_labels), "1+0x5 0+0x10"),
                (_up_series(_with(agent_labels, instance="n2:9400")), "1+0x15"),
            ),
            quiet=(("5m", "up"), ("10m", "before for:")),
            fire_at="12m",
            fire_labels=(agent_labels,),
            fire_text=(
                (
                    "Node agent n1:9400 is down.",
                    "Prometheus has not scraped the node agent at n1:9400 (cluster c1) for 5m: the host is "
                    "down or unreachable, or the agent died. Its GPU alerts are silenced meanwhile.",
                ),
            ),
        ),
    )
    rk = cfg.rack_label
    rack_key = by((c, rk))
    node_up = f"up{{{cfg.node_up_selector}}}"
    rack_labels = {"cluster": "c1", rk: "r07", "instance": "n1:9400", "job": "babysitter-node"}
    rack_silent = Alert(
        name="RackMetricsMissing",
        # Remote write sends no staleness marker when the sender dies: the rack's series just stop,
        # so no target-down alert can fire for it. Its hosts' ``up`` series, remembered over the
        # lookback, tell the rack that went silent.
        expr=(
            f"group {rack_key} (max_over_time({node_up}[{cfg.rack_lookback_window}]))\nunless\n"
            f"group {rack_key} (max_over_time({node_up}[{cfg.rack_silent_window}]))"
        ),
        severity="critical",
        component="node",
        summary=f"No metrics arrive from rack {_l(rk)}.",
        description=(
            f"No series of rack {_l(rk)} (cluster {_l(c)}) reached this Prometheus for "
            f"{cfg.rack_silent_window}: the rack's agent Prometheus died, cannot reach the central tier, "
            f"or the whole rack is down. Every alert about its hosts and ranks is blind meanwhile."
        ),
        for_=cfg.rack_silent_for,
        test=AlertTest(
            series=(
                (_up_series(rack_labels), "1+0x10"),
                (_up_series(_with(rack_labels, instance="n2:9400")), "1+0x10"),
                (_up_series(_with(rack_labels, **{rk: "r08"})), "1+0x30"),
            ),
            quiet=(
                ("10m", "metrics arrive"),
                ("13m", "silent for less than the window"),
                ("14m", "before for:"),
            ),
            fire_at="16m",
            fire_labels=({"cluster": "c1", rk: "r07"},),
            fire_text=(
                (
                    "No metrics arrive from rack r07.",
                    "No series of rack r07 (cluster c1) reached this Prometheus for 3m: the rack's agent "
                    "Prometheus died, cannot reach the central tier, or the whole rack is down. Every alert "
                    "about its hosts and ranks is blind meanwhile.",
                ),
            ),
        ),
    )
    return [storage_slow, storage_failing, collector_failing, xid_blind, agent_down, rack_silent]


def _trainer_fetches(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """The node agent's own view of the trainers it serves: endpoints it cannot fetch, registrations it
    refuses (docs/security.md), when they keep failing."""
    ns, c, w, f = cfg.node_selector, cfg.cluster_label, cfg.trainer_failing_window, cfg.trainer_failing_for
    errors, skipped = N.TRAINER_SCRAPE_ERRORS, N.TRAINER_REGISTRATIONS_SKIPPED

    def keeps_growing(name: str, counter: str, **text: Any) -> Alert:
        """A warning per host and reason while ``counter`` grew in every ``w`` for ``f`` (a counter
        series appears with its first failure: new_or_increased counts that one too)."""
        expr = f"sum by ({c}, instance, reason) (\n  {new_or_increased(counter, w)}\n)"
        return Alert(name=name, expr=expr, severity="warning", component="node", for_=f, **text)

    fetch = keeps_growing(
        "NodeTrainerFetchFailing",
        select(errors, ns),
        summary=f"Trainer endpoints on {_l('instance')} keep failing: {_l('reason')}.",
        description=(
            f"The node agent on {_l('instance')} (cluster {_l(c)}) failed {_V} fetches of registered trainer "
            f"endpoints with {_l('reason')} in the last {w}, and has kept failing for {f}. Those ranks' "
            f"metrics are missing, so their stall, MFU and goodput alerts are blind; "
            f"{errors.name} names the run and rank."
        ),
        test=AlertTest(
            series=(
                # n1: rank 0 of r1 times out at every scrape from 5m on (its series appears then).
                (_series(errors, _with(_node_labels(), run="r1", rank="0", reason="timeout")), "_x4 1+1x40"),
                # n2: one failed fetch (a trainer that was restarting), never again: no warning.
                (
                    _series(
                        errors,
                        _with(_node_labels(), instance="n2:9400", run="r2", rank="0", reason="connect"),
                    ),
                    "_x4 1+0x40",
                ),
            ),
            quiet=(("5m", "failing, before for:"), ("15m", "before for:")),
            fire_at="25m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400", "reason": "timeout"},),
            fire_text=(
                (
                    "Trainer endpoints on n1:9400 keep failing: timeout.",
                    "The node agent on n1:9400 (cluster c1) failed 10 fetches of registered trainer "
                    "endpoints with timeout in the last 10m, and has kept failing for 15m. Those ranks' "
                    "metrics are missing, so their stall, MFU and goodput alerts are blind; "
                    f"{errors.name} names the run and rank.",
                ),
            ),
        ),
    )
    registration = keeps_growing(
        "NodeTrainerRegistrationSkipped",
        # Each bad file is counted once, so growth means new ones keep coming; dead registrations (a
        # trainer that exited) are the normal churn of jobs ending, not a fault.
        select(skipped, ns, regex("reason", ("dead",), negate=True)),
        summary=f"The node agent on {_l('instance')} keeps refusing trainer registrations: {_l('reason')}.",
        description=(
            f"The node agent on {_l('instance')} (cluster {_l(c)}) refused {_V} new trainer registrations as "
            f"{_l('reason')} in the last {w}, and new ones have kept coming for {f}. Those trainers are not "
            f"served, so their runs look absent to Prometheus; docs/security.md says what each reason means."
        ),
        test=AlertTest(
            series=(
                # n1: a tracker restarted in a loop registers as another user's directory every minute.
                (_series(skipped, _with(_node_labels(), reason="wrong_owner")), "_x4 1+1x40"),
                # n1: trainers ending leave dead registrations: churn, never a warning.
                (_series(skipped, _with(_node_labels(), reason="dead")), "0+1x45"),
                # n2: one malformed file, counted once and logged: no warning.
                (
                    _series(skipped, _with(_node_labels(), instance="n2:9400", reason="malformed")),
                    "_x4 1+0x40",
                ),
            ),
            quiet=(("5m", "refused, before for:"), ("15m", "before for:")),
            fire_at="25m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400", "reason": "wrong_owner"},),
            fire_text=(
                (
                    "The node agent on n1:9400 keeps refusing trainer registrations: wrong_owner.",
                    "The node agent on n1:9400 (cluster c1) refused 10 new trainer registrations as "
                    "wrong_owner in the last 10m, and new ones have kept coming for 15m. Those trainers are "
                    "not served, so their runs look absent to Prometheus; docs/security.md says what each "
                    "reason means.",
                ),
            ),
        ),
    )
    return [fetch, registration]


def _node_labels() -> dict[str, str]:
    return {key: _GPU[key] for key in ("cluster", "instance", "job")}


def _gpu_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ns, c = cfg.node_selector, cfg.cluster_label
    gpu = by(r.gpu_key)
    where = f"GPU {_l('gpu')} ({_l('uuid')}, {_l('model')}) on {_l('instance')}, cluster {_l(c)}"
    xid = N.GPU_XID_ERRORS
    xid_key = by((*r.gpu_key, "xid", "action"))
    page = regex("action", cfg.xid_page_actions)
    rest = regex("action", (*cfg.xid_page_actions, *cfg.xid_ignore_actions), negate=True)
    xw = cfg.xid_window
    xid_series = (
        (_series(xid, _with(_GPU, xid="79", action="reboot")), "_x10 1+0x30"),
        (_series(xid, _with(_GPU, xid="13", action="restart_app")), "0+0x10 1+0x30"),
        (_series(xid, _with(_GPU, xid="43", action="ignore")), "0+0x10 5+0x30"),
    )
    xid_critical = Alert(
        name="GpuXidCritical",
        expr=f"sum {xid_key} (\n  {new_or_increased(select(xid, ns, page), xw)}\n)",
        severity="critical",
        component="gpu",
        summary=f"Xid {_l('xid')} on GPU {_l('gpu')} of {_l('instance')}: {_l('action')}.",
        description=(
            f"{where} reported Xid {_l('xid')} ({_V} in the last {xw}); its recovery action is "
            f"{_l('action')}. The job on this GPU is lost or will be: drain the node, then reset or reboot."
        ),
        for_="0s",
        test=AlertTest(
            series=xid_series,
            quiet=(("9m", "no Xid yet"), ("27m", f"the Xid left the {xw} window")),
            fire_at="12m",
            fire_labels=(_gpu_labels(action="reboot", xid="79"),),
            fire_text=(
                (
                    "Xid 79 on GPU 3 of n1:9400: reboot.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 reported Xid 79 "
                    "(1 in the last 15m); its recovery action is reboot. The job on this GPU is lost or will "
                    "be: drain the node, then reset or reboot.",
                ),
            ),
        ),
    )
    xid_warning = Alert(
        name="GpuXidError",
        expr=f"sum {xid_key} (\n  {new_or_increased(select(xid, ns, rest), xw)}\n)",
        severity="warning",
        component="gpu",
        summary=f"Xid {_l('xid')} on GPU {_l('gpu')} of {_l('instance')}.",
        description=(
            f"{where} reported Xid {_l('xid')} ({_V} in the last {xw}), recovery action {_l('action')}: "
            f"usually the application's fault; watch for repeats and for the job restarting."
        ),
        for_="0s",
        test=AlertTest(
            series=xid_series,
            quiet=(("10m", "no Xid yet"),),
            fire_at="12m",
            fire_labels=(_gpu_labels(action="restart_app", xid="13"),),
            fire_text=(
                (
                    "Xid 13 on GPU 3 of n1:9400.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 reported Xid 13 "
                    "(1 in the last 15m), recovery action restart_app: usually the application's fault; "
                    "watch for repeats and for the job restarting.",
                ),
            ),
        ),
    )
    down = Alert(
        name="GpuDown",
        expr=f"max {gpu} ({select(N.GPU_UP, ns)}) == 0",
        severity="critical",
        component="gpu",
        summary=f"GPU {_l('gpu')} of {_l('instance')} does not answer.",
        description=(
            f"{where} does not answer NVML/DCGM queries (fallen off the bus, driver hung). The job using "
            f"it is stuck or dead; drain and reboot the node."
        ),
        for_=cfg.gpu_down_for,
        test=AlertTest(
            series=(
                (_series(N.GPU_UP, _GPU), "1+0x5 0+0x10"),
                (_series(N.GPU_UP, _with(_GPU, gpu="0", uuid="GPU-11aa22bb")), "1+0x15"),
            ),
            quiet=(("5m", "up"), ("6m", "before for:")),
            fire_at="8m",
            fire_labels=(_gpu_labels(),),
            fire_text=(
                (
                    "GPU 3 of n1:9400 does not answer.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 does not answer "
                    "NVML/DCGM queries (fallen off the bus, driver hung). The job using it is stuck or dead; "
                    "drain and reboot the node.",
                ),
            ),
        ),
    )
    ecc_sel = select(N.GPU_ECC_ERRORS, ns, eq("type", cfg.ecc_uncorrected_type))
    ecc = Alert(
        name="GpuEccUncorrectable",
        expr=f"max {gpu} (\n  {new_or_increased(ecc_sel, cfg.ecc_window)}\n)",
        severity="critical",
        component="gpu",
        summary=f"Uncorrectable ECC error on GPU {_l('gpu')} of {_l('instance')}.",
        description=(
            f"{where} counted {_V} uncorrectable ECC errors in the last {cfg.ecc_window}. The job on it "
            f"has likely crashed; the GPU needs a reset before new work, and an RMA if it repeats."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (
                    _series(N.GPU_ECC_ERRORS, _with(_GPU, type="uncorrected", scope="volatile")),
                    "0+0x10 2+0x10",
                ),
                (_series(N.GPU_ECC_ERRORS, _with(_GPU, type="corrected", scope="volatile")), "0+5x20"),
            ),
            quiet=(("10m", "only corrected errors"),),
            fire_at="12m",
            fire_labels=(_gpu_labels(),),
            fire_text=(
                (
                    "Uncorrectable ECC error on GPU 3 of n1:9400.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 counted 2 "
                    "uncorrectable ECC errors in the last 15m. The job on it has likely crashed; the GPU "
                    "needs a reset before new work, and an RMA if it repeats.",
                ),
            ),
        ),
    )
    remap = N.GPU_REMAPPED_ROWS
    pending = Alert(
        name="GpuRowRemapPending",
        expr=f"max {gpu} ({select(remap, ns, eq('state', cfg.remap_pending_state))}) > 0",
        severity="warning",
        component="gpu",
        summary=f"GPU {_l('gpu')} of {_l('instance')} needs a reset to remap memory rows.",
        description=(
            f"{where} has {_V} memory row remaps pending; they take effect at the next GPU reset. Reset it "
            f"at the next job boundary (drain, nvidia-smi -r)."
        ),
        for_=cfg.remap_pending_for,
        test=AlertTest(
            series=(
                (_series(remap, _with(_GPU, state="pending")), "0+0x5 1+0x20"),
                (_series(remap, _with(_GPU, state="failure")), "0+0x25"),
            ),
            quiet=(("5m", "none pending"), ("15m", "before for:")),
            fire_at="20m",
            fire_labels=(_gpu_labels(),),
            fire_text=(
                (
                    "GPU 3 of n1:9400 needs a reset to remap memory rows.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 has 1 memory row "
                    "remaps pending; they take effect at the next GPU reset. Reset it at the next job "
                    "boundary (drain, nvidia-smi -r).",
                ),
            ),
        ),
    )
    failed = Alert(
        name="GpuRowRemapFailed",
        expr=f"max {gpu} ({select(remap, ns, eq('state', cfg.remap_failure_state))}) > 0",
        severity="critical",
        component="gpu",
        summary=f"GPU {_l('gpu')} of {_l('instance')} failed to remap a memory row.",
        description=(
            f"{where} reports a failed row remap: it has run out of spare rows. Drain the node and RMA "
            f"the GPU."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(remap, _with(_GPU, state="failure")), "0+0x5 1+0x10"),
                (_series(remap, _with(_GPU, state="pending")), "2+0x15"),
            ),
            quiet=(("5m", "no failure"),),
            fire_at="7m",
            fire_labels=(_gpu_labels(),),
            fire_text=(
                (
                    "GPU 3 of n1:9400 failed to remap a memory row.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 reports a failed "
                    "row remap: it has run out of spare rows. Drain the node and RMA the GPU.",
                ),
            ),
        ),
    )
    clock = N.GPU_CLOCK_EVENT_ACTIVE
    throttled = Alert(
        name="GpuThrottled",
        expr=(
            f"max {by((*r.gpu_key, 'reason'))} (\n"
            f"  avg_over_time({select(clock, ns, regex('reason', cfg.throttle_reasons))}"
            f"[{cfg.throttle_window}])\n) > {cfg.throttle_fraction:g}"
        ),
        severity="warning",
        component="gpu",
        summary=f"GPU {_l('gpu')} of {_l('instance')} is throttled: {_l('reason')}.",
        description=(
            f"{where} had clock event {_l('reason')} active {_VP} of the last {cfg.throttle_window}. "
            f"The whole job runs at the pace of this GPU: check cooling, power and the board."
        ),
        for_=cfg.throttle_for,
        test=AlertTest(
            series=(
                (_series(clock, _with(_GPU, reason="hw_thermal_slowdown")), "0+0x5 1+0x40"),
                (_series(clock, _with(_GPU, reason="sw_power_cap")), "1+0x45"),
            ),
            quiet=(("8m", "not sustained"), ("25m", "before for:")),
            fire_at="30m",
            fire_labels=(_gpu_labels(reason="hw_thermal_slowdown"),),
            fire_text=(
                (
                    "GPU 3 of n1:9400 is throttled: hw_thermal_slowdown.",
                    "GPU 3 (GPU-8c5d3f3a, NVIDIA H100 80GB HBM3) on n1:9400, cluster c1 had clock event "
                    "hw_thermal_slowdown active 100% of the last 10m. The whole job runs at the pace of this "
                    "GPU: check cooling, power and the board.",
                ),
            ),
        ),
    )
    return [xid_critical, xid_warning, down, ecc, pending, failed, throttled]


def _remediation(cfg: GenerateConfig, r: Records) -> list[Alert]:
    c, w = cfg.cluster_label, cfg.remediation_window
    labels = {"cluster": "c1", "instance": "mon1:9097", "job": "babysitter-remediate"}
    failed = select(M.ACTIONS, eq("result", "failed"))
    failing = Alert(
        name="RemediationFailing",
        expr=f"sum by ({c}, instance, action) (\n  {new_or_increased(failed, w)}\n)",
        severity="critical",
        component="remediation",
        summary=f"Remediation {_l('action')} failed on {_l('instance')}.",
        description=(
            f"{_V} {_l('action')} actions of the remediator at {_l('instance')} (cluster {_l(c)}) failed in "
            f"the last {w}: the scheduler refused or timed out. The fault they answered is not handled; "
            f"read the audit log and act by hand."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(M.ACTIONS, _with(labels, action="drain", result="failed")), "0+0x10 1+0x20"),
                (_series(M.ACTIONS, _with(labels, action="drain", result="ok")), "0+1x30"),
                (_series(M.ACTIONS, _with(labels, action="requeue", result="failed")), "0+0x30"),
            ),
            quiet=(("9m", "every action succeeded so far"), ("28m", f"the failure left the {w} window")),
            fire_at="12m",
            fire_labels=({"action": "drain", "cluster": "c1", "instance": "mon1:9097"},),
            fire_text=(
                (
                    "Remediation drain failed on mon1:9097.",
                    "1 drain actions of the remediator at mon1:9097 (cluster c1) failed in the last 15m: the "
                    "scheduler refused or timed out. The fault they answered is not handled; read the audit "
                    "log and act by hand.",
                ),
            ),
        ),
    )
    capped = select(M.REFUSALS, regex("reason", ("drain_cap", "rate_limit")))
    cap_hit = Alert(
        name="RemediationCapHit",
        expr=f"sum by ({c}, instance, reason) (\n  {new_or_increased(capped, w)}\n)",
        severity="critical",
        component="remediation",
        summary=f"The remediator on {_l('instance')} stopped acting: {_l('reason')}.",
        description=(
            f"The remediator at {_l('instance')} (cluster {_l(c)}) refused {_V} actions in the last {w} "
            f"because of its {_l('reason')} rail: more nodes failing at once than the policy allows, or "
            f"an alert rule firing everywhere. Nothing more is drained automatically; look before resuming."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(M.REFUSALS, _with(labels, action="drain", reason="drain_cap")), "0+0x10 3+0x20"),
                (_series(M.REFUSALS, _with(labels, action="drain", reason="missing_labels")), "0+1x30"),
                (_series(M.REFUSALS, _with(labels, action="requeue", reason="rate_limit")), "0+0x30"),
            ),
            quiet=(("9m", "only refusals for missing labels"), ("28m", f"the refusals left the {w} window")),
            fire_at="12m",
            fire_labels=({"cluster": "c1", "instance": "mon1:9097", "reason": "drain_cap"},),
            fire_text=(
                (
                    "The remediator on mon1:9097 stopped acting: drain_cap.",
                    "The remediator at mon1:9097 (cluster c1) refused 3 actions in the last 15m because of "
                    "its drain_cap rail: more nodes failing at once than the policy allows, or an alert rule "
                    "firing everywhere. Nothing more is drained automatically; look before resuming.",
                ),
            ),
        ),
    )
    return [failing, cap_hit]


_GROUPS: tuple[tuple[str, Callable[[GenerateConfig, Records], list[Alert]]], ...] = (
    ("babysitter-training.alerts", _training),
    ("babysitter-checkpoint.alerts", _checkpoint),
    ("babysitter-node.alerts", _node),
    ("babysitter-trainers.alerts", _trainer_fetches),
    ("babysitter-gpu.alerts", _gpu_alerts),
    ("babysitter-remediation.alerts", _remediation),
)


def alerts(cfg: GenerateConfig) -> list[Alert]:
    """Every alert for ``cfg``, in file order."""
    r = Records(cfg)
    found = [alert for _, make in _GROUPS for alert in make(cfg, r)]
    names = [alert.name for alert in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"duplicate alert names: {names}")
    return found


def alert_groups(cfg: GenerateConfig) -> list[dict[str, object]]:
    """The ``groups`` of the alert rule file."""
    r = Records(cfg)
    return [{"name": name, "rules": [alert.rule(cfg) for alert in make(cfg, r)]} for name, make in _GROUPS]


def test_file(alert: Alert, cfg: GenerateConfig, rule_files: list[str]) -> dict[str, object]:
    """The promtool test file of one alert; ValueError when the alert has no test."""
    if alert.test is None:
        raise ValueError(f"alert {alert.name} has no test")
    t = alert.test
    cases: list[dict[str, object]] = [
        {"eval_time": at, "alertname": alert.name, "exp_alerts": []} for at, _why in t.quiet
    ]
    expected = []
    for labels, (summary, description) in zip(t.fire_labels, t.fire_text, strict=True):
        expected.append(
            {
                "exp_labels": {**labels, "component": alert.component, "severity": alert.severity},
                "exp_annotations": {
                    "description": description,
                    "runbook_url": cfg.runbook_url(alert.name),
                    "summary": summary,
                },
            }
        )
    cases.append({"eval_time": t.fire_at, "alertname": alert.name, "exp_alerts": expected})
    return {
        "rule_files": rule_files,
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": t.interval,
                "input_series": [{"series": s, "values": v} for s, v in t.series],
                "alert_rule_test": cases,
            }
        ],
    }
