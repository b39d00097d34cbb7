"""Training alerts: a run that stalls, exits, loses its target, slows down, straggles, wastes its time
or writes no ledger."""

from __future__ import annotations

from babysitter.catalog import goodput as G
from babysitter.catalog import integrity as I
from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.alerts._common import (
    _GPU,
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
    _stepping,
    _up_series,
    _with,
    likely_text,
    with_team,
)
from babysitter.generate.alerts.integrity import first_nonfinite_text
from babysitter.generate.collectives import culprit_hosts_text, culprit_short_text, culprit_text, host_text
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, new_or_increased, select
from babysitter.generate.rules import Records

__all__ = ["training_alerts"]


def _hung_run(run: str, *, stopped: str = "", behind: str = "") -> tuple[tuple[str, str], ...]:
    """Series of a four-rank run that hangs in all_reduce #1234 of group 0 from 20m (test fixture)."""
    hosts = {"0": "n1:9400", "1": "n1:9400", "2": "n7:9400", "3": "n8:9400"}
    out: list[tuple[str, str]] = []
    for rank, host in hosts.items():
        labels = _with(_TRAIN, run=run, rank=rank, instance=host)
        culprit = rank in (stopped, behind)
        # The agent serves every registration's rank as a number, a stopped one's too.
        out.append((_series(N.TRAINER_RANK, labels), f"{rank}+0x60"))
        if rank == stopped:
            out += [*_stepping(labels, "0+60x20"), (_series(R.STALLED_SECONDS, labels), "0+0x20")]
            out.append((_series(R.COLLECTIVE_LAST_ENQUEUED, _with(labels, pg="0")), "0+62x19 1233"))
            out.append((_series(N.TRAINER_SCRAPE_SUCCESS, labels), "1+0x20 0+0x40"))
            info = _with(labels, uuid="GPU-7f3a9c21", pci_bus_id="0000:18:00")
            out.append((_series(T.INFO, info), "1+0x20"))
            continue
        out += [
            *_stepping(labels, "0+60x20 1200+0x40"),
            (_series(R.STALLED_SECONDS, labels), "0+0x20 60+60x40"),
        ]
        out.append(
            (
                _series(R.COLLECTIVE_LAST_ENQUEUED, _with(labels, pg="0")),
                "0+62x19 " + ("1233+0x40" if culprit else "1234+0x40"),
            )
        )
        out.append((_series(N.TRAINER_SCRAPE_SUCCESS, labels), "1+0x60"))
        out.append((_series(T.INFO, labels), "1+0x60"))
        if rank == "0":
            out.append((_series(T.WORLD_SIZE, labels), "4+0x60"))
        if not culprit:
            stuck = _with(labels, pg="0", op="all_reduce", size="1024", last_completed="1233")
            out.append((_series(R.COLLECTIVE_STUCK, stuck), "_x21 1234+0x39"))
    return tuple(out)


def _stranger(
    run: str,
    *,
    rank: str = "9",
    since: int = 0,
    stalled: str = "0+0x{n}",
    stepping: str = "{t}+60x{n}",
    enqueued: str = "",
    world: str = "16",
) -> tuple[tuple[str, str], ...]:
    """Series a user on host n9 serves through its own node agent for another user's run (test
    fixture): an endpoint registered as ``rank`` of ``run`` from minute ``since``, saying it steps
    (``stalled``: its stall clock, 0 by default), declaring a world size of ``world``, and, with
    ``enqueued``, the last collective it says it reached on group 0 (behind the others: a culprit)."""
    labels = _with(_TRAIN, run=run, rank=rank, instance="n9:9400")
    n, gap = 60 - since, "_x" + str(since) + " " if since else ""

    def values(text: str) -> str:
        return gap + text.format(n=n, t=since * 60)

    out = [
        *_stepping(labels, values(stepping)),
        (_series(R.STALLED_SECONDS, labels), values(stalled)),
        (_series(N.TRAINER_SCRAPE_SUCCESS, labels), values("1+0x{n}")),
        (_series(N.TRAINER_RANK, labels), values(rank + "+0x{n}")),
        (_series(T.INFO, labels), values("1+0x{n}")),
        (_series(T.WORLD_SIZE, labels), values(world + "+0x{n}")),
    ]
    if enqueued:
        out.append((_series(R.COLLECTIVE_LAST_ENQUEUED, _with(labels, pg="0")), values(enqueued)))
    return tuple(out)


def training_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    ts, c = cfg.tracker_selector, cfg.cluster_label
    run, on_run = by(r.run_key), f"on ({', '.join(r.run_key)})"
    stall_min = cfg.stall_min_seconds
    likely = likely_text(r.likely_cause, c)
    # A stall's summary names its culprit when the collectives do, else the likely cause: the likely
    # cause reads the minutes before (a straggler, an Xid) and may be an earlier fault's, next to the
    # right culprit (the campaign's "likely straggler on host h0; culprit rank 2 on host h2").
    culprit, culprit_short = (
        culprit_text(r.collectives, c),
        culprit_short_text(r.collectives, c, otherwise=likely),
    )
    remembered = f"max_over_time({r.last_step}[{cfg.stall_lookback_window}])"
    failing = f"{select(N.TRAINER_SCRAPE_SUCCESS, cfg.node_selector)} == 0"
    not_answering = f"max {run} ({r.ranks.ignoring(failing, reason='undeclared')})"
    stall_clock = r.ranks.counted(select(R.STALLED_SECONDS, ts), "max", r.rank_key)
    stopped_culprit = (
        " Culprit: rank 2 on host n7:9400 (GPU-7f3a9c21) stopped answering its node agent (a stopped or "
        "hard-hung process) while ranks 0, 1, 3 wait in all_reduce #1234 of group 0."
    )
    behind_culprit = (
        " Culprit: rank 2 on host n7:9400 never reached all_reduce #1234 of group 0; "
        "ranks 0, 1, 3 wait in it."
    )
    behind_culprit_gpu = behind_culprit.replace("n7:9400 never", "n7:9400 (GPU-3e14) never")
    stalled = Alert(
        name="TrainingStalled",
        # Answering ranks report the tracker's own stall clock, which pauses during checkpoints and marked
        # phases (a 20-minute save is not a stall); the slowest-to-stall rank decides. A run whose ranks
        # no longer answer the node agent (stopped, hard hang) falls back to the age of its last step,
        # remembered after its series vanish; so does a tracker too old to export the stall clock. A run
        # that finished unregistered itself and matches neither. Only the ranks that speak for the run
        # count (generate/ranks.py): a stranger's rank 9 stepping, or claiming a real rank, cannot stop
        # the page; a contested rank counts with its longest stall clock.
        expr=with_team(
            f"(\n  min {run} (\n{stall_clock}\n  )\n  or {on_run}\n"
            f"  (\n    time() - {remembered}\n    and {on_run}\n"
            f"    ({r.last_step} or {on_run} {not_answering})\n  )\n)\n> {on_run}\n"
            f"(\n  ({cfg.stall_step_factor:g} * {r.step_baseline} > {stall_min})\n  or {on_run}\n"
            f"  (0 * {remembered} + {stall_min})\n)",
            r.run_key,
            r.likely_team,
            "TrainingStalled",
        ),
        severity="critical",
        component="training",
        summary=f"Run {_l('run')} has not finished a step for {_VD}{culprit_short}.",
        description=(
            f"No rank of run {_l('run')} on cluster {_l(c)} finished a training step for {_VD}; the stall "
            f"threshold is max({stall_min}s, {cfg.stall_step_factor:g} x the run's mean step time over "
            f"{cfg.stall_baseline_window}). The job hangs (collective, data loader, storage) or is stopped."
            f"{culprit}"
        ),
        annotations={"culprit_hosts": culprit_hosts_text(r.collectives, c)},
        for_=cfg.stall_for,
        test=AlertTest(
            series=(
                # r1 hangs but its endpoint still answers; r2 keeps stepping.
                *_stepping(_TRAIN, "0+60x20 1200+0x40"),
                # r1's GPU threw an Xid 79 at 19m, a minute before its hang: the page names it and goes
                # to infra.
                (_series(T.INFO, _with(_TRAIN, uuid=_GPU["uuid"], pci_bus_id=_GPU["pci_bus_id"])), "1+0x60"),
                (_series(N.GPU_UP, _GPU), "1+0x60"),
                (_series(N.GPU_XID_ERRORS, _with(_GPU, xid="79", action="reset_gpu")), "_x19 1+0x41"),
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
                # r7, four ranks on three hosts: rank 2 (host n7, its GPU in train_info) is stopped at
                # 20m (its series vanish, the agent's fetch fails); ranks 0, 1 and 3 hang in all_reduce
                # #1234 of group 0 and say so from 21m (they report only while stalled).
                *_hung_run("r7", stopped="2"),
                # r8: rank 2 is alive but stuck outside any collective (its last one: #1233); the others
                # wait in #1234 for it.
                *_hung_run("r8", behind="2"),
                # A user on host n9 serves a rank of each of the next runs through its own node agent
                # (docs/security.md, "Across hosts"). r9 is r7, and the stranger's rank 9 (past the world
                # size of 4 rank 0 declares) says it steps, stall clock 0: the page still fires, naming
                # rank 2 on n7 alone. (Before, the run's smallest stall clock was the stranger's 0.)
                *_hung_run("r9", stopped="2"),
                *_stranger("r9"),
                # r10 is r8, and the stranger's rank 9 hangs too and says it never reached #1234: never
                # named (before, the page named n7 and n9, and remediate refused both: more than 1).
                *_stranger(
                    "r10",
                    stalled="0+0x20 60+60x40",
                    stepping="0+60x20 1200+0x40",
                    enqueued="0+62x19 1233+0x40",
                ),
                *_hung_run("r10", behind="2"),
                # r11 is r3 (one rank, stopped at 20m: its series vanish, its registration stays), and the
                # stranger's rank 9 steps on. Rank 0's world size of 1 is remembered after it vanished.
                *_stepping(_with(_TRAIN, run="r11"), "0+60x20"),
                (_series(N.TRAINER_SCRAPE_SUCCESS, _with(_TRAIN, run="r11")), "1+0x20 0+0x40"),
                (_series(N.TRAINER_RANK, _with(_TRAIN, run="r11")), "0+0x60"),
                (_series(T.WORLD_SIZE, _with(_TRAIN, run="r11")), "1+0x20"),
                *_stranger("r11"),
                # r12 is r6 (two ranks hang, the tracker says so), and from 10m the stranger claims rank 0
                # (contested: both hosts' agents serve it), with stall clock 0 and a world size of 1. A
                # contested rank counts with its longest stall clock, and the world size with the one rank
                # 0 declared alone: rank 1 still counts. (Before, the stranger's 0 was the run's.)
                *_stepping(_with(_TRAIN, run="r12"), "0+60x20 1200+0x40"),
                *(
                    item
                    for rank, clock in (("0", "0+0x20 60+60x40"), ("1", "0+0x20 30+60x40"))
                    for item in (
                        (_series(R.STALLED_SECONDS, _with(_TRAIN, run="r12", rank=rank)), clock),
                        (_series(N.TRAINER_SCRAPE_SUCCESS, _with(_TRAIN, run="r12", rank=rank)), "1+0x60"),
                        (_series(N.TRAINER_RANK, _with(_TRAIN, run="r12", rank=rank)), f"{rank}+0x60"),
                    )
                ),
                (_series(T.WORLD_SIZE, _with(_TRAIN, run="r12")), "2+0x60"),
                *_stranger("r12", rank="0", since=10, world="1"),
                # r13: all four ranks wait in #1234 (no rank behind: the fault is elsewhere), and the
                # stranger's rank 9 says it never reached it. Before, it was the culprit, on n9.
                *_hung_run("r13"),
                *_stranger(
                    "r13",
                    stalled="0+0x20 60+60x40",
                    stepping="0+60x20 1200+0x40",
                    enqueued="0+62x19 1233+0x40",
                ),
                # r14 is r8, and the behind rank's GPU (on n7) threw an Xid 79 at 19m: the likely cause
                # is a GPU fault on n7, the culprit rank 2 on n7. The summary names the culprit alone (a
                # likely cause reads the minutes before the stall: an earlier fault's, in a campaign).
                *_hung_run("r14", behind="2"),
                (
                    _series(
                        T.INFO,
                        _with(
                            _TRAIN,
                            run="r14",
                            rank="2",
                            instance="n7:9400",
                            uuid="GPU-3e14",
                            pci_bus_id="0000:28:00",
                        ),
                    ),
                    "1+0x60",
                ),
                (_series(N.GPU_UP, _with(_GPU, instance="n7:9400", uuid="GPU-3e14", gpu="1")), "1+0x60"),
                (
                    _series(
                        N.GPU_XID_ERRORS,
                        _with(_GPU, instance="n7:9400", uuid="GPU-3e14", gpu="1", xid="79", action="reboot"),
                    ),
                    "_x19 1+0x41",
                ),
            ),
            quiet=(
                ("20m", "every run stepped a minute ago"),
                ("21m", "1 min without a step is the minimum itself, not above it"),
            ),
            # 27m: r4's last samples (20m) have left the 5 m lookback, so only the stalled runs remain.
            fire_at="27m",
            fire_labels=(
                {**_run_labels("r1"), "team": "infra"},
                *(
                    {**_run_labels(name), "team": "training"}
                    for name in ("r3", "r6", "r7", "r8", "r9", "r10", "r11", "r12", "r13")
                ),
                {**_run_labels("r14"), "team": "infra"},
            ),
            fire_text=tuple(
                (
                    f"Run {run_name} has not finished a step for {age}{cause}{short}.",
                    f"No rank of run {run_name} on cluster c1 finished a training step for {age}; the stall "
                    "threshold is max(60s, 6 x the run's mean step time over 1h). The job hangs "
                    f"(collective, data loader, storage) or is stopped.{named}",
                )
                for run_name, age, cause, short, named in (
                    ("r1", "7m 0s", ": likely gpu fault on host n1:9400", "", ""),
                    ("r3", "7m 0s", "", "", ""),
                    ("r6", "6m 30s", "", "", ""),
                    ("r7", "7m 0s", "", "; culprit rank 2 on host n7:9400", stopped_culprit),
                    ("r8", "7m 0s", "", "; culprit rank 2 on host n7:9400", behind_culprit),
                    ("r9", "7m 0s", "", "; culprit rank 2 on host n7:9400", stopped_culprit),
                    ("r10", "7m 0s", "", "; culprit rank 2 on host n7:9400", behind_culprit),
                    ("r11", "7m 0s", "", "", ""),
                    ("r12", "6m 30s", "", "", ""),
                    ("r13", "7m 0s", "", "", ""),
                    ("r14", "7m 0s", "", "; culprit rank 2 on host n7:9400", behind_culprit_gpu),
                )
            ),
            # Where no rank is named the annotation is empty: babysitter remediate drains nothing. The
            # stranger's host n9 is never named.
            fire_annotations=tuple(
                {"culprit_hosts": hosts} for hosts in ("", "", "", *("n7:9400",) * 4, "", "", "", "n7:9400")
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
        expr=with_team(
            f"{mfu}\n< {on_run}\n"
            f"({1 - cfg.mfu_drop_fraction:g} * "
            f"quantile_over_time(0.5, {mfu}[{cfg.mfu_baseline_window}]))"
            f"\nand {on_run}\n{r.steps_rate} > 0",
            r.run_key,
            r.likely_team,
            "TrainingMfuDrop",
        ),
        severity="warning",
        component="training",
        summary=f"MFU of run {_l('run')} dropped to {_VP}{likely}.",
        description=(
            f"Run {_l('run')} on cluster {_l(c)} runs at {_VP} MFU, more than "
            f"{cfg.mfu_drop_fraction:.0%} below its median over the last {cfg.mfu_baseline_window}, "
            f"while still stepping. Look for a slow node, throttling GPUs or a data stall: "
            f"babysitter explain --run {_l('run')} --since 1h ranks the causes with their evidence."
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
                # r3 drops the same way because rank 1 steps 1.5x slower from 120m, on a GPU (host
                # n2) that reports thermal throttling from then on: the page names it, for infra.
                (_series(T.MODEL_FLOPS, _with(_TRAIN, run="r3")), "0+3000x120 361800+1800x80"),
                (_series(T.PEAK_FLOPS, _with(_TRAIN, run="r3")), "100+0x200"),
                (_series(T.STEPS, _with(_TRAIN, run="r3")), "0+60x200"),
                *(
                    item
                    for rank, step_sum in (("0", "0+60x200"), ("1", "0+60x120 7200+90x80"), ("2", "0+60x200"))
                    for item in (
                        (_series(T.STEP_DURATION, _with(_TRAIN, run="r3", rank=rank), "_sum"), step_sum),
                        (_series(T.STEP_DURATION, _with(_TRAIN, run="r3", rank=rank), "_count"), "0+60x200"),
                    )
                ),
                (
                    _series(
                        T.INFO,
                        _with(_TRAIN, run="r3", rank="1", uuid=_GPU["uuid"], pci_bus_id=_GPU["pci_bus_id"]),
                    ),
                    "1+0x200",
                ),
                (_series(N.GPU_UP, _with(_GPU, instance="n2:9400")), "1+0x200"),
                (
                    _series(
                        N.GPU_CLOCK_EVENT_ACTIVE,
                        _with(_GPU, instance="n2:9400", reason="hw_thermal_slowdown"),
                    ),
                    "0+0x120 1+0x80",
                ),
            ),
            quiet=(("100m", "MFU at its baseline"), ("150m", "before for:")),
            fire_at="160m",
            fire_labels=({**_run_labels(), "team": "training"}, {**_run_labels("r3"), "team": "infra"}),
            fire_text=(
                (
                    "MFU of run r1 dropped to 30%.",
                    "Run r1 on cluster c1 runs at 30% MFU, more than 20% below its median over the last "
                    "6h, while still stepping. Look for a slow node, throttling GPUs or a data stall: "
                    "babysitter explain --run r1 --since 1h ranks the causes with their evidence.",
                ),
                (
                    "MFU of run r3 dropped to 30%: likely gpu throttling on host n2:9400.",
                    "Run r3 on cluster c1 runs at 30% MFU, more than 20% below its median over the last "
                    "6h, while still stepping. Look for a slow node, throttling GPUs or a data stall: "
                    "babysitter explain --run r3 --since 1h ranks the causes with their evidence.",
                ),
            ),
        ),
    )
    where, where_sentence = host_text(r.collectives, c), host_text(r.collectives, c, sentence=True)
    straggler = Alert(
        name="TrainingStragglerRank",
        expr=(
            f"(\n  {r.rank_step_ratio} > {cfg.straggler_ratio:g}\n"
            f"  and {on_run}\n  count {run} ({r.rank_step_mean}) >= 2\n)\n"
            # The in-process score compares each rank's own work time, which lockstep collectives
            # hide from step time; it exists only where the run turned the exchange on.
            f"or\nmax {by((*r.run_key, 'rank'))} ({r.ranks.ignoring(select(R.STRAGGLER_SCORE, ts))})"
            f" > {cfg.straggler_ratio:g}"
        ),
        severity="warning",
        component="training",
        summary=f"Rank {_l('rank')} of run {_l('run')}{where} steps {_V}x slower than the median rank.",
        description=(
            f"Rank {_l('rank')} of run {_l('run')} on cluster {_l(c)} is {_V} times slower than the median "
            f"rank over {cfg.rate_window} (mean step time, or, where the run reports straggler scores, its "
            f"own work between collectives: the other ranks wait for it).{where_sentence} Check that "
            f"node's GPUs (throttling, Xid), NICs and data loader; the Stragglers dashboard shows its lag."
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
                # r1's rank 2 runs on a GPU train_info names: the page says where.
                (
                    _series(
                        T.INFO, _with(_TRAIN, rank="2", uuid=_GPU["uuid"], pci_bus_id=_GPU["pci_bus_id"])
                    ),
                    "1+0x40",
                ),
            ),
            quiet=(("10m", "before for:"),),
            fire_at="20m",
            fire_labels=(_with(_run_labels(), rank="2"), _with(_run_labels("r2"), rank="1")),
            fire_text=(
                (
                    "Rank 2 of run r1 on host n1:9400 (GPU-8c5d3f3a) steps 1.5x slower than the median rank.",
                    "Rank 2 of run r1 on cluster c1 is 1.5 times slower than the median rank over 5m (mean "
                    "step time, or, where the run reports straggler scores, its own work between "
                    "collectives: the other ranks wait for it). It runs on host n1:9400, GPU GPU-8c5d3f3a. "
                    "Check that node's GPUs (throttling, Xid), NICs and data loader; the Stragglers "
                    "dashboard shows its lag.",
                ),
                (
                    "Rank 1 of run r2 steps 1.4x slower than the median rank.",
                    "Rank 1 of run r2 on cluster c1 is 1.4 times slower than the median rank over 5m (mean "
                    "step time, or, where the run reports straggler scores, its own work between "
                    "collectives: the other ranks wait for it). Check that node's GPUs (throttling, Xid), "
                    "NICs and data loader; the Stragglers dashboard shows its lag.",
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
            f"{cfg.nonfinite_window}.{first_nonfinite_text(cfg)} Every step from here on may be wasted: "
            f"decide whether to roll back to the last good checkpoint."
        ),
        for_="0s",
        test=AlertTest(
            series=(
                (_series(T.NONFINITE_LOSS, _TRAIN), "0+0x10 3+0x10"),
                # Rank 2 (host n2) went first at step 100, ranks 0 and 1 at 101; every rank's gradient
                # norm (after the all-reduce) at 100. The page names rank 2.
                (_series(I.NONFINITE_FIRST_STEP, _with(_TRAIN, signal="loss")), "_x10 101+0x10"),
                (_series(I.NONFINITE_FIRST_STEP, _with(_TRAIN, rank="1", signal="loss")), "_x10 101+0x10"),
                (
                    _series(
                        I.NONFINITE_FIRST_STEP, _with(_TRAIN, rank="2", instance="n2:9400", signal="loss")
                    ),
                    "_x10 100+0x10",
                ),
                *(
                    (
                        _series(I.NONFINITE_FIRST_STEP, _with(_TRAIN, rank=k, signal="grad_norm")),
                        "_x10 100+0x10",
                    )
                    for k in ("0", "1", "2")
                ),
                (_series(T.NONFINITE_LOSS, _with(_TRAIN, run="r2")), "0+0x20"),
                # Run r3: two ranks went together; the page says so.
                (_series(T.NONFINITE_LOSS, _with(_TRAIN, run="r3")), "0+0x10 1+0x10"),
                *(
                    (
                        _series(I.NONFINITE_FIRST_STEP, _with(_TRAIN, run="r3", rank=k, signal="loss")),
                        "_x10 7+0x10",
                    )
                    for k in ("4", "5")
                ),
            ),
            quiet=(("10m", "no non-finite loss yet"),),
            fire_at="12m",
            fire_labels=(_run_labels(), _run_labels("r3")),
            fire_text=(
                (
                    "Run r1 produced a NaN or infinite loss.",
                    "Run r1 on cluster c1 read 3 non-finite loss values in the last 10m. The loss went "
                    "non-finite first on rank 2 (host n2:9400) at step 100. Every step from here on may be "
                    "wasted: decide whether to roll back to the last good checkpoint.",
                ),
                (
                    "Run r3 produced a NaN or infinite loss.",
                    "Run r3 on cluster c1 read 1 non-finite loss values in the last 10m. The loss went "
                    "non-finite first on rank 4 (host n1:9400) at step 7 (2 ranks at that step). Every step "
                    "from here on may be wasted: decide whether to roll back to the last good checkpoint.",
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
