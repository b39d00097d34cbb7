"""Which ranks speak for a run: a rank number no launcher declared, or one two hosts claim, decides
nothing about the run's stall, its culprit (so a drain), its stragglers or its likely cause.

A run's ``run`` and ``rank`` labels come from its trainers, and any user can register an endpoint
with the node agent of their own host claiming another user's run (docs/security.md, "Across hosts").
Only where a series comes from (``instance``) and what the agents themselves serve about each
registration (its scrape success, and its rank as a number: ``N.TRAINER_SCRAPE_SUCCESS``,
``N.TRAINER_RANK``) are beyond a trainer's reach. From those, and from what the run's rank 0 says:

* **declared**: the run's rank 0 declares its world size W (``T.WORLD_SIZE``); a rank number at
  or past W (the agent serves each registration's rank as a number: PromQL cannot compare a label
  with one) is **undeclared**. W is rank 0's value while one host alone claims rank 0; while two do,
  or rank 0's series are gone (stopped, exited), the smallest W an uncontested rank 0 declared within
  the stall lookback. So a second rank 0 claimed while the real one runs changes nothing, and one
  claimed while the run is down can lower W (noise: real ranks listed), never raise it past what the
  real rank 0 declared in the lookback. A run whose trackers export no world size (older versions)
  has no undeclared ranks.
* **contested**: a run and rank whose registrations two hosts' agents serve (TrainingRankOnTwoHosts).

The excluded record (:attr:`RankRecords.excluded`) lists both, with ``reason`` ``undeclared`` or
``contested``. The rules that decide a stall and name a culprit read every rank ``unless`` it is
listed, except that a contested rank keeps its most pessimistic voice where that can only make a run
look *more* stalled: its longest stall clock and its oldest last step (while every claimant answers),
so a second claimant can wake someone, never silence a page, and two honest jobs that share a run
name still page when one hangs. Neither claimant of a contested rank, nor an undeclared rank, is ever
a culprit, so ``culprit_hosts`` never names their hosts and ``babysitter remediate`` never drains them.

The list is normally empty, so ``unless`` against it costs one hash lookup per series. Every recording
rule reading it sits in the same group, after it (``babysitter-stall.rules``): a claim is judged at
the same evaluation that first sees its series, so no rule records a stranger's step time even once
(the last step time is remembered for hours). The TrainingStalled alert reads it from the group's last
evaluation: a claim born since can count for one evaluation of the alert (a stall clock read then,
never remembered).
"""

from __future__ import annotations

from dataclasses import dataclass

from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, eq, record_name, select, unit_test

__all__ = ["RankRecords", "rank_rules", "rank_tests"]


@dataclass(frozen=True)
class RankRecords:
    """Names of the rank-trust rules, and the ``unless`` clauses that apply them."""

    cfg: GenerateConfig

    @property
    def key(self) -> tuple[str, ...]:
        """A run's rank as the agents name it: cluster, run, rank (never ``GenerateConfig.run_labels``,
        which only the trainers' series carry)."""
        return (self.cfg.cluster_label, "run", "rank")

    @property
    def on(self) -> str:
        """``on (cluster, run, rank)``."""
        return f"on ({', '.join(self.key)})"

    @property
    def world_size(self) -> str:
        """1 series per run: the world size its rank 0 declares, while one host alone claims rank 0."""
        return record_name(["run"], T.WORLD_SIZE.name, "declared")

    @property
    def undeclared(self) -> str:
        """1 series per rank served at or past its run's declared world size, and host serving it
        (value: the rank)."""
        return record_name(["run", "rank"], N.TRAINER_RANK.name, "undeclared")

    @property
    def excluded(self) -> str:
        """1 series per rank of a run that takes no part in its stall, culprits, stragglers and likely
        cause, with ``reason``: ``undeclared`` or ``contested`` (claimed on two or more hosts)."""
        return record_name(["run", "rank"], N.TRAINER_RANK.name, "excluded")

    def contested(self) -> str:
        """The excluded ranks that two hosts claim (and that their run declares)."""
        listed = self.excluded
        return f'{listed}{{reason="contested"}}\n  unless {self.on} {listed}{{reason="undeclared"}}'

    def ignoring(self, expr: str, *, reason: str = "") -> str:
        """``expr`` without the excluded ranks (only those excluded for ``reason`` when given)."""
        listed = f'{self.excluded}{{reason="{reason}"}}' if reason else self.excluded
        return f"{expr} unless {self.on} {listed}"

    def counted(self, selector: str, worst: str, rank_key: tuple[str, ...]) -> str:
        """The series of ``selector`` that speak for their run: every rank not excluded, plus each
        contested rank's ``worst`` value over its claimants (``max`` of a stall clock, ``min`` of a
        last-step time) while all of them answer (a claimant that does not answer has no series to
        compare: the rank then counts as not answering, not as whatever the other one says)."""
        failing = f"{select(N.TRAINER_SCRAPE_SUCCESS, self.cfg.node_selector)} == 0"
        return (
            f"{self.ignoring(selector)}\nor\n(\n  {worst} {by(rank_key)} ({selector} and {self.on} (\n"
            f"    {self.contested()}\n  ))\n  unless {self.on} ({failing})\n)"
        )

    def ignoring_remembered(self, expr: str, window: str) -> str:
        """``expr`` without the ranks excluded at any time within ``window``: for ranks whose series and
        registration are gone (a rank that served for one scrape and exited is still judged)."""
        return f"{expr} unless {self.on} last_over_time({self.excluded}[{window}])"


def rank_rules(cfg: GenerateConfig) -> list[dict[str, object]]:
    """The declared world size, the undeclared ranks and the excluded ranks, in that order."""
    k = RankRecords(cfg)
    c, ts, ns = cfg.cluster_label, cfg.tracker_selector, cfg.node_selector
    run = (c, "run")
    on_run = f"on ({', '.join(run)})"
    claims = select(N.TRAINER_SCRAPE_SUCCESS, ns)

    def hosts(selector: str, key: tuple[str, ...]) -> str:
        """How many hosts' agents serve a registration of each ``key``."""
        return f"count {by(key)} (group {by((*key, 'instance'))} ({selector}))"

    rank0_contested = hosts(select(N.TRAINER_SCRAPE_SUCCESS, ns, eq("rank", "0")), run) + " > 1"
    declared = f"({k.world_size} or {on_run} min_over_time({k.world_size}[{cfg.stall_lookback_window}]))"
    # A registration seen within the window is judged, so one that lived for a single scrape between
    # two evaluations is still listed (the window is at least one evaluation interval).
    recent = f"last_over_time({select(N.TRAINER_RANK, ns)}[{cfg.culprit_silent_for}])"
    ranks = f"max {by((*k.key, 'instance'))} ({recent})"

    def reason(expr: str, why: str) -> str:
        return f'label_replace(\n  group {by(k.key)} ({expr}),\n  "reason", "{why}", "", ""\n)'

    return [
        {
            # NaN fails the comparison; a value below 1 (no rank at all) is taken as 1: rank 0 always counts.
            "record": k.world_size,
            "expr": (
                f"clamp_min(min {by(run)} ({select(T.WORLD_SIZE, ts, eq('rank', '0'))}), 1) >= 1\n"
                f"unless {on_run}\n{rank0_contested}"
            ),
        },
        {"record": k.undeclared, "expr": f"{ranks}\n>= {on_run} group_left ()\n{declared}"},
        {
            "record": k.excluded,
            "expr": (
                f"{reason(k.undeclared, 'undeclared')}\nor\n"
                f"{reason(hosts(claims, k.key) + ' > 1', 'contested')}"
            ),
        },
    ]


def rank_tests(cfg: GenerateConfig, *, last_step: str, step_baseline: str) -> dict[str, object]:
    """A promtool test of the rank-trust rules and the stall records that read them (default config),
    evaluated at 10m. A user on host n9 serves ranks of other users' runs through its own agent:

    * ``a1``: ranks 0-3 on n1 and n2, rank 0 declares 4. n9 serves rank 9 (declaring 16 for itself),
      stepping fresher and 100 times slower: undeclared; the run's last step and typical step time are
      its real ranks'.
    * ``a2``: ranks 0 and 1 on n1, rank 0 declares 2; from 5m n9 claims rank 0 too, declaring 1:
      contested. The world size is no one's while two hosts claim rank 0, and rank 1 stays declared (2,
      remembered); the contested rank's last step is its oldest claimant's.
    * ``a3``: trackers without a world size (an older version): n9's rank 9 is not judged (its fresher
      last step counts: the limit of this check).
    * ``a4``: rank 0 (declaring 2) exited at 2m, its series gone; from 6m n9 serves rank 5: undeclared
      against the remembered world size.
    """
    k = RankRecords(cfg)
    base = {"cluster": "c1", "job": "babysitter-node"}
    inputs: list[tuple[str, str]] = []

    def series(name: str, labels: dict[str, str]) -> str:
        inner = ", ".join(f'{key}="{value}"' for key, value in labels.items())
        return f"{name}{{{inner}}}"

    def rank(run: str, number: str, host: str, *, since: int = 0, until: int = 10, per_step: int = 1) -> None:
        """A registered rank serving from minute ``since`` to ``until``, a 1 s step every second..."""
        labels = {**base, "instance": host, "run": run, "rank": number}
        gap, n = (f"_x{since} " if since else ""), until - since

        def add(name: str, values: str) -> None:
            inputs.append((series(name, labels), gap + values))

        add(N.TRAINER_SCRAPE_SUCCESS.name, f"1+0x{n}")
        add(N.TRAINER_RANK.name, f"{number}+0x{n}")
        # ...or, for the strangers, a step every 2 s reported as its own 'now' (fresher than the real).
        stamp = 60 if host != "n9:9400" else 120
        add(T.LAST_STEP_TIMESTAMP.name, f"{since * stamp}+{stamp}x{n}")
        add(f"{T.STEP_DURATION.name}_sum", f"0+{60 * per_step}x{n}")
        add(f"{T.STEP_DURATION.name}_count", f"0+60x{n}")

    def world(run: str, number: str, host: str, size: int, *, since: int = 0, until: int = 10) -> None:
        labels = {**base, "instance": host, "run": run, "rank": number}
        gap = f"_x{since} " if since else ""
        inputs.append((series(T.WORLD_SIZE.name, labels), f"{gap}{size}+0x{until - since}"))

    for number, host in (("0", "n1:9400"), ("1", "n1:9400"), ("2", "n2:9400"), ("3", "n2:9400")):
        rank("a1", number, host)
    world("a1", "0", "n1:9400", 4)
    rank("a1", "9", "n9:9400", per_step=100)
    world("a1", "9", "n9:9400", 16)
    rank("a2", "0", "n1:9400")
    rank("a2", "1", "n1:9400")
    world("a2", "0", "n1:9400", 2)
    rank("a2", "0", "n9:9400", since=5)
    world("a2", "0", "n9:9400", 1, since=5)
    rank("a3", "0", "n1:9400")
    rank("a3", "9", "n9:9400")
    rank("a4", "0", "n1:9400", until=2)
    rank("a4", "1", "n1:9400")
    world("a4", "0", "n1:9400", 2, until=2)
    rank("a4", "5", "n9:9400", since=6)

    def out(record: str, run: str, **labels: str) -> str:
        return series(record, {"cluster": "c1", **labels, "run": run})

    cases: list[tuple[str, list[tuple[str, float]]]] = [
        (k.world_size, [(out(k.world_size, "a1"), 4.0)]),
        (
            k.undeclared,
            [
                (out(k.undeclared, "a1", instance="n9:9400", rank="9"), 9.0),
                (out(k.undeclared, "a4", instance="n9:9400", rank="5"), 5.0),
            ],
        ),
        (
            k.excluded,
            [
                (out(k.excluded, "a1", rank="9", reason="undeclared"), 1.0),
                (out(k.excluded, "a2", rank="0", reason="contested"), 1.0),
                (out(k.excluded, "a4", rank="5", reason="undeclared"), 1.0),
            ],
        ),
        # a4's rank 1 at 600, its stranger (rank 5) excluded.
        (
            last_step,
            [
                (out(last_step, "a1"), 600.0),
                (out(last_step, "a2"), 600.0),
                (out(last_step, "a3"), 1200.0),
                (out(last_step, "a4"), 600.0),
            ],
        ),
        (
            step_baseline,
            [(out(step_baseline, run), 1.0) for run in ("a1", "a2", "a4")]
            + [(out(step_baseline, "a3"), 1.0)],
        ),
    ]
    return unit_test(inputs, cases, interval="1m", eval_time="10m")
