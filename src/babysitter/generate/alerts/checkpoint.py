"""Checkpoint alerts: saves that fail, run slow or are overdue, and checkpoints the ledger records that
the sentinel cannot find."""

from __future__ import annotations

from babysitter.catalog import goodput as G
from babysitter.catalog import storage as S
from babysitter.catalog import train as T
from babysitter.generate.alerts._common import (
    _STEP,
    _TRAIN,
    _V,
    _VD,
    _VP,
    Alert,
    AlertTest,
    _l,
    _node_labels,
    _run_labels,
    _series,
    _with,
)
from babysitter.generate.alerts.integrity import checkpoint_corrupt_alert
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, eq, new_or_increased, select
from babysitter.generate.rules import Records

__all__ = ["checkpoint_alerts"]


def checkpoint_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
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
                # r3's process had failed 3 saves; it restarts at 32m (the counter starts over) and
                # fails 3 again: as many as before the window, yet all of them new.
                (_series(T.CKPT_FAILURES, _with(_TRAIN, run="r3")), "3+0x31 0 1 2 3+0x26"),
            ),
            quiet=(("30m", "no failure yet"), ("65m", "the failures left the window")),
            fire_at="35m",
            fire_labels=(_run_labels(), _run_labels("r3")),
            fire_text=tuple(
                (
                    f"Checkpoint saves of run {run} are failing.",
                    f"{count} checkpoint saves of run {run} on cluster c1 raised an error in the last 30m. "
                    "Until one succeeds, every step is at risk.",
                )
                for run, count in (("r1", 1), ("r3", 3))
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
        # The value is the mean save over the window (sum / count): said as such, so a 6 s save among
        # fast ones is not read as "saves take 2 s" (issue 22).
        summary=(
            f"Checkpoint saves of run {_l('run')} averaged {_VD} over the last {sw} "
            f"(threshold {cfg.checkpoint_save_slow_seconds:g}s)."
        ),
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
                    "Checkpoint saves of run r1 averaged 15m 0s over the last 2h (threshold 600s).",
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
    return [
        overdue,
        failing,
        slow,
        missing,
        checkpoint_corrupt_alert(cfg, r),
        _check_failing(cfg),
        _interval_off(cfg, r),
    ]


def _check_failing(cfg: GenerateConfig) -> Alert:
    """The sentinel cannot finish a run's checks (its worker ran past its time or memory budget, died,
    or could not take the owner's credentials). The value is how long since its last complete check."""
    ns, c = cfg.node_selector, cfg.cluster_label
    key = (c, "instance", "run", "reason")
    limit = cfg.checkpoint_check_failing_seconds
    node_r1 = _with(_node_labels(), run="r1")
    return Alert(
        name="CheckpointCheckFailing",
        expr=f"max {by(key)} ({select(S.CHECKPOINT_CHECK_FAILING, ns)}) >= {limit}",
        severity="warning",
        component="checkpoint",
        summary=f"The checkpoint sentinel on {_l('instance')} cannot check run {_l('run')}: {_l('reason')}.",
        description=(
            f"The checkpoint sentinel on {_l('instance')} (cluster {_l(c)}) has not finished checking run "
            f"{_l('run')} for {_VD} ({_l('reason')}: its worker for that run directory did not answer "
            "within --checkpoint-run-timeout, ran out of --checkpoint-run-memory, crashed, met an error, or "
            "could not take the run owner's credentials). Other runs are checked as usual; this run's "
            "checkpoint alerts show its last complete check, so a checkpoint deleted or corrupted since goes "
            "unseen. The agent's log names the run directory and why."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                # r1's worker times out from 5m on: the value counts up from its last complete check.
                (_series(S.CHECKPOINT_CHECK_FAILING, _with(node_r1, reason="timeout")), "_x5 60+60x20"),
                # r2 failed once, for one pass, and was checked again.
                (
                    _series(S.CHECKPOINT_CHECK_FAILING, _with(_node_labels(), run="r2", reason="crashed")),
                    "_x5 30 _x15",
                ),
            ),
            quiet=(("4m", "every run is checked"), ("13m", "failing for 9 minutes")),
            fire_at="15m",
            fire_labels=({"cluster": "c1", "instance": "n1:9400", "run": "r1", "reason": "timeout"},),
            fire_text=(
                (
                    "The checkpoint sentinel on n1:9400 cannot check run r1: timeout.",
                    "The checkpoint sentinel on n1:9400 (cluster c1) has not finished checking run r1 for "
                    "11m 0s (timeout: its worker for that run directory did not answer within "
                    "--checkpoint-run-timeout, ran out of --checkpoint-run-memory, crashed, met an error, or "
                    "could not take the run owner's credentials). Other runs are checked as usual; this "
                    "run's checkpoint alerts show its last complete check, so a checkpoint deleted or "
                    "corrupted since goes unseen. The agent's log names the run directory and why.",
                ),
            ),
        ),
    )


def _interval_off(cfg: GenerateConfig, r: Records) -> Alert:
    """The advisor's alert (info: chat, never a page): the interval is far from the advice and the
    expected gain is material. Its value is that gain."""
    ts, c = cfg.tracker_selector, cfg.cluster_label
    run, on_run = by(r.run_key), f"on ({', '.join(r.run_key)})"
    current = f"max {run} ({select(G.CKPT_INTERVAL, ts)})"
    advised = f"max {run} ({select(G.CKPT_INTERVAL_RECOMMENDED, ts)})"
    now, then = (
        f"max {run} ({select(G.CKPT_EXPECTED_GOODPUT, ts, eq('interval', which))})"
        for which in G.CKPT_INTERVAL_WHICH
    )
    k, gain = cfg.checkpoint_advice_factor, cfg.checkpoint_advice_min_gain
    rec = G.CKPT_INTERVAL_RECOMMENDED.name
    labels = {name: _with(_TRAIN, run=name) for name in ("r1", "r2", "r3", "r4", "r5")}

    def feed(
        name: str, cur: str, adv: str | None, g_now: str | None, g_then: str | None
    ) -> list[tuple[str, str]]:
        out = [(_series(G.CKPT_INTERVAL, labels[name]), cur)]
        if adv is not None:
            out.append((_series(G.CKPT_INTERVAL_RECOMMENDED, labels[name]), adv))
        for which, values in zip(G.CKPT_INTERVAL_WHICH, (g_now, g_then), strict=True):
            if values is not None:
                out.append((_series(G.CKPT_EXPECTED_GOODPUT, _with(labels[name], interval=which)), values))
        return out

    return Alert(
        name="CheckpointIntervalOffAdvice",
        expr=(
            f"({then}\n  - {on_run}\n  {now}\n) > {gain:g}\n"
            f"and {on_run}\n(\n  {current} > {on_run} {k:g} * {advised}\n"
            f"  or {on_run}\n  {current} < {on_run} {1 / k:g} * {advised}\n)"
        ),
        severity="info",
        component="checkpoint",
        summary=f"Run {_l('run')} would gain {_VP} goodput at the recommended checkpoint interval.",
        description=(
            f"The checkpoint interval of run {_l('run')} on cluster {_l(c)} is outside "
            f"[{1 / k:g}x, {k:g}x] of the interval the advisor recommends ({rec}), and the expected goodput "
            f"there is {_VP} higher (threshold {gain:.0%}). `babysitter report` shows the inputs "
            f"(save cost, restart cost, interruption rate) and how much data they rest on."
        ),
        for_=cfg.checkpoint_advice_for,
        test=AlertTest(
            series=(
                # r1: saves every hour, the advice is 15 min, +10% goodput: fires after for:.
                *feed("r1", "3600+0x200", "900+0x200", "0.6+0x200", "0.7+0x200"),
                # r2: 1000 s against 900 s: within the band.
                *feed("r2", "1000+0x200", "900+0x200", "0.69+0x200", "0.7+0x200"),
                # r3: far off, but the gain is 0.5%: not material.
                *feed("r3", "3600+0x200", "900+0x200", "0.695+0x200", "0.7+0x200"),
                # r4: saves too often (300 s against 900 s), +3%: fires.
                *feed("r4", "300+0x200", "900+0x200", "0.67+0x200", "0.7+0x200"),
                # r5: too few interruptions yet, so no advice is exported: quiet.
                *feed("r5", "3600+0x200", None, None, None),
            ),
            quiet=(("30m", "before for:"), ("119m", "before for: (2h)")),
            fire_at="150m",
            fire_labels=(_run_labels("r1"), _run_labels("r4")),
            fire_text=(
                (
                    "Run r1 would gain 10% goodput at the recommended checkpoint interval.",
                    "The checkpoint interval of run r1 on cluster c1 is outside [0.5x, 2x] of the interval "
                    f"the advisor recommends ({rec}), and the expected goodput there is 10% higher "
                    "(threshold 1%). `babysitter report` shows the inputs (save cost, restart cost, "
                    "interruption rate) and how much data they rest on.",
                ),
                (
                    "Run r4 would gain 3% goodput at the recommended checkpoint interval.",
                    "The checkpoint interval of run r4 on cluster c1 is outside [0.5x, 2x] of the interval "
                    f"the advisor recommends ({rec}), and the expected goodput there is 3% higher "
                    "(threshold 1%). `babysitter report` shows the inputs (save cost, restart cost, "
                    "interruption rate) and how much data they rest on.",
                ),
            ),
        ),
    )
