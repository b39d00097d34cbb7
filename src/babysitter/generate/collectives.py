"""Naming the bad node in PromQL: the rank a hung collective waits for, and where each rank runs.

From what every rank exports (``training/collectives.py``): the last collective it enqueued on each
process group, always; while it is stalled, the collective it waits in; and from the node agent,
whether it still answers. During a hang:

* **waiting** ranks report the collective they wait in (group, sequence number, operation);
* a rank **behind**: its last enqueued collective on that group is below the one the others wait
  in: it never reached it (it is stuck elsewhere: a data loader, another group's collective, a
  device). A rank that itself waits in some collective is never named this way (it is a victim of a
  culprit further down the chain);
* a rank **not answering**: its node agent has failed to fetch its metrics for
  ``culprit_silent_for`` while others wait (a stopped or hard-hung process); or **gone**: it stopped
  exporting within ``stall_baseline_window`` (it exited, its host went away). It cannot say where it
  stopped.

``run_rank:train_collective:culprit`` holds the culprits, value the sequence number of the collective
waited in, labelled with the rank, its host (``instance``), its GPU (``uuid``, where the rank's info
series names one), the group, the operation and ``reason`` (``behind``, ``not_answering``, ``gone``).
The alerts name them with :func:`culprit_text` (a template query when the page is rendered, like the likely
cause), and ``babysitter remediate`` drains the hosts of :func:`culprit_hosts_text` when a policy
rule asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, record_name, select
from babysitter.generate.ranks import RankRecords


class _Keys(Protocol):
    """What the rules need of ``generate.rules.Records`` (imported the other way round)."""

    @property
    def ranks(self) -> RankRecords: ...

    @property
    def run_key(self) -> tuple[str, ...]: ...

    @property
    def rank_key(self) -> tuple[str, ...]: ...


__all__ = [
    "CollectiveRecords",
    "collective_rules",
    "collective_tests",
    "culprit_hosts_text",
    "culprit_short_text",
    "culprit_text",
    "host_text",
]

#: Waiting ranks a page lists by number (the rest are counted).
_LIST = 8


@dataclass(frozen=True)
class CollectiveRecords:
    """Names of the collective recording rules (``Records.collectives``)."""

    cfg: GenerateConfig

    @property
    def waiting(self) -> str:
        """1 series per stalled rank and group it waits in: value the sequence number, labelled with
        the rank's host, the group, operation, element count and its last completed collective."""
        return record_name(["run", "rank"], "train_collective", "waiting")

    @property
    def stuck(self) -> str:
        """Per run and group, the collective its waiting ranks wait in (value: its sequence number)."""
        return record_name(["run", "pg"], "train_collective", "stuck")

    @property
    def not_answering(self) -> str:
        """Ranks of a run with waiting ranks whose node agent cannot fetch them (stopped, dead)."""
        return record_name(["run", "rank"], "train_collective", "not_answering")

    @property
    def behind(self) -> str:
        """Ranks that never reached the collective the others wait in (and wait in nothing)."""
        return record_name(["run", "rank"], "train_collective", "behind")

    @property
    def culprit(self) -> str:
        """The ranks a hung run waits for (see the module docstring)."""
        return record_name(["run", "rank"], "train_collective", "culprit")

    @property
    def host(self) -> str:
        """1 per rank: its host (``instance``) and GPU (``uuid``, empty on CPU), remembered for the
        stall lookback so a stopped rank is still placed."""
        return record_name(["run", "rank"], T.INFO.name, "host")


def collective_rules(cfg: GenerateConfig, r: _Keys) -> list[dict[str, object]]:
    """The rules of group ``babysitter-collectives.rules``, each reading the ones before it."""
    c, k = CollectiveRecords(cfg), r.ranks
    ts, ns = cfg.tracker_selector, cfg.node_selector
    run_key = ", ".join(r.run_key)
    rank_key = ", ".join(r.rank_key)
    on_run, on_rank, on_pg = f"on ({run_key})", f"on ({rank_key})", f"on ({run_key}, pg)"
    lb, quiet, gone_window = cfg.stall_lookback_window, cfg.culprit_silent_for, cfg.stall_baseline_window
    stuck = select(R.COLLECTIVE_STUCK, ts)
    enqueued = select(R.COLLECTIVE_LAST_ENQUEUED, ts)
    fetched = select(N.TRAINER_SCRAPE_SUCCESS, ns)
    recently_waiting = f"max {by(r.rank_key)} (last_over_time({stuck}[{quiet}]))"
    # The collective a run waits in on each group, with its operation (one per run and group).
    stuck_op = f"topk by ({run_key}, pg) (1, max by ({run_key}, pg, op) ({c.waiting}))"
    info = select(T.INFO, ts, 'uuid!=""')
    placed = select(T.INFO, ts)
    # A rank's GPU now, or (a rank no longer scraped) the last one seen; one per rank.
    gpu = (
        f"topk by ({rank_key}) (1, max {by((*r.rank_key, 'uuid'))} (\n  {info}\n  or {on_rank}\n"
        f"  last_over_time({info}[{lb}])\n))"
    )
    culprits = f"({c.not_answering}\nor\n({c.behind} unless {on_rank} {c.not_answering}))"
    return [
        {
            "record": c.waiting,
            "expr": (
                f"max {by((*r.rank_key, 'instance', 'pg', 'op', 'size', 'last_completed'))} "
                f"({k.ignoring(stuck)})"
            ),
        },
        {"record": c.stuck, "expr": f"max by ({run_key}, pg) ({c.waiting})"},
        {
            # Ranks of a run with waiting ranks that the node agent failed to fetch for the whole
            # window (reason not_answering: a stopped or hard-hung process), or that stopped
            # exporting within the baseline window and are no longer registered with an agent (gone:
            # exited, its host lost), and that did not report waiting themselves; value: the
            # collective the others wait in.
            "record": c.not_answering,
            "expr": f" or {on_rank} ".join(
                f"label_replace(\n  0 * (\n    {who}\n    unless {on_rank}\n    {recently_waiting}\n  )\n"
                f"  + {on_run} group_left (pg, op)\n  topk by ({run_key}) (1, {stuck_op}),\n"
                f'  "reason", "{reason}", "", ""\n)'
                for who, reason in (
                    (
                        "("
                        + k.ignoring(
                            f"max {by((*r.rank_key, 'instance'))} (max_over_time({fetched}[{quiet}]) == 0)"
                        )
                        + ")",
                        "not_answering",
                    ),
                    (
                        # Still registered (its fetch fails) is not gone: not_answering names it in time.
                        # A rank excluded while it lived stays so once gone (it cannot be judged then).
                        "("
                        + k.ignoring_remembered(
                            f"max {by((*r.rank_key, 'instance'))} (last_over_time({enqueued}[{gone_window}]))"
                            f" unless {on_rank} {enqueued} unless {on_rank} {fetched}",
                            gone_window,
                        )
                        + ")",
                        "gone",
                    ),
                )
            ),
        },
        {
            # Ranks whose last enqueued collective on a group is below the one the others wait in, and
            # that wait in nothing themselves; value: the collective they never reached.
            "record": c.behind,
            "expr": (
                f"label_replace(\n  0 * (\n    (max {by((*r.rank_key, 'instance', 'pg'))} "
                f"({k.ignoring(enqueued)})\n"
                f"    < {on_pg} group_left (op)\n    {stuck_op})\n"
                f"    unless {on_rank}\n    {recently_waiting}\n  )\n"
                f"  + {on_pg} group_left ()\n  {c.stuck},\n"
                '  "reason", "behind", "", ""\n)'
            ),
        },
        {
            "record": c.culprit,
            "expr": f"(\n  {culprits}\n  * {on_rank} group_left (uuid)\n  {gpu}\n)\nor {on_rank}\n{culprits}",
        },
        {
            # A rank's series with its GPU first, then without (a CPU rank; or one whose tracker had
            # not learnt its GPU yet: its first series lacks the uuid), now, then as last seen. Never
            # both: the series without the uuid stays behind for a while, on VictoriaMetrics at once
            # (its instant selector looks back past the staleness marker) and on Prometheus once the
            # rank stops (the last seen of each).
            "record": c.host,
            "expr": f"max {by((*r.rank_key, 'instance', 'uuid'))} (\n  {info}\n  or {on_rank} {placed}\n"
            f"  or {on_rank} last_over_time({info}[{lb}])\n  or {on_rank} last_over_time({placed}[{lb}])\n)",
        },
    ]


def _query(record: str, cluster_label: str, extra: str = "", args: str = "") -> str:
    """``{{ with query (printf "record{cluster=%q,run=%q...}" ...) }}``, the Go template opening."""
    selector = "%s{%s=%%q,run=%%q%s}" % (record, cluster_label, extra)  # noqa: UP031 - Go template braces
    return (
        '{{ with query (printf "'
        + selector.replace('"', '\\"')
        + f'" $labels.{cluster_label} $labels.run{args}) }}}}'
    )


#: " ranks 0, 1, 3 wait" (at most _LIST listed) for the waiting ranks of culprit ``$c``'s group.
_WAITING = (
    "{{ if eq (len .) 1 }}rank {{ else }}ranks {{ end }}"
    '{{ range $j, $w := sortByLabel "rank" . }}{{ if lt $j @LIST@ }}{{ if $j }}, {{ end }}'
    "{{ $w.Labels.rank }}{{ end }}{{ end }}{{ if gt (len .) @LIST@ }} ({{ len . }} in all){{ end }}"
    "{{ if eq (len .) 1 }} waits{{ else }} wait{{ end }}"
).replace("@LIST@", str(_LIST))
_AT = '{{ $c.Labels.op }} #{{ printf "%.0f" $c.Value }} of group {{ $c.Labels.pg }}'
_CULPRIT = (
    ' Culprit: {{ range $i, $c := sortByLabel "rank" . }}{{ if $i }}; {{ end }}'
    "rank {{ $c.Labels.rank }} on host {{ $c.Labels.instance }}{{ with $c.Labels.uuid }} ({{ . }}){{ end }} "
    '{{ if eq $c.Labels.reason "behind" }}never reached @AT@; @WAITING@ in it'
    '{{ else }}{{ if eq $c.Labels.reason "gone" }}is gone (its process exited or its host went away)'
    "{{ else }}stopped answering its node agent (a stopped or hard-hung process){{ end }}"
    " while @WAITING@ in @AT@{{ end }}{{ end }}."
)


def culprit_text(c: CollectiveRecords, cluster_label: str) -> str:
    """ " Culprit: rank 2 on host n7:9400 (GPU-...) never reached all_reduce #1234 of group 0; ranks 0,
    1, 3 wait in it." for a description, read from the culprit rule when the page is rendered (nothing
    when the rule names no one: a hang without a collective culprit, or a run without the recorder)."""
    waiting = (
        _query(c.waiting, cluster_label, ",pg=%q", " $c.Labels.pg")
        + _WAITING
        + "{{ else }}other ranks wait{{ end }}"
    )
    return (
        _query(c.culprit, cluster_label)
        + _CULPRIT.replace("@AT@", _AT).replace("@WAITING@", waiting)
        + "{{ end }}"
    )


def culprit_short_text(c: CollectiveRecords, cluster_label: str, *, otherwise: str = "") -> str:
    """ "; culprit rank 2 on host n7:9400" for a summary (the culprits' ranks and hosts only); when no
    culprit is named, ``otherwise`` (a template: the likely cause)."""
    return (
        _query(c.culprit, cluster_label)
        + '; culprit {{ range $i, $c := sortByLabel "rank" . }}{{ if $i }}, {{ end }}'
        "rank {{ $c.Labels.rank }} on host {{ $c.Labels.instance }}{{ end }}"
        + ("{{ else }}" + otherwise if otherwise else "")
        + "{{ end }}"
    )


def culprit_hosts_text(c: CollectiveRecords, cluster_label: str) -> str:
    """The culprits' hosts, comma separated (``n7:9400``), for ``babysitter remediate``."""
    hosts = (
        '{{ range $i, $c := sortByLabel "instance" . }}{{ if $i }},{{ end }}{{ $c.Labels.instance }}{{ end }}'
    )
    return _query(c.culprit, cluster_label) + hosts + "{{ end }}"


def host_text(c: CollectiveRecords, cluster_label: str, *, sentence: bool = False) -> str:
    """ " on host n7:9400 (GPU-...)" of the alert's rank (``sentence``: " It runs on host n7:9400, GPU
    GPU-...."), from the host rule; nothing when unknown."""
    if sentence:
        where = " It runs on host {{ .Labels.instance }}{{ with .Labels.uuid }}, GPU {{ . }}{{ end }}."
    else:
        where = " on host {{ .Labels.instance }}{{ with .Labels.uuid }} ({{ . }}){{ end }}"
    return (
        _query(c.host, cluster_label, ",rank=%q", " $labels.rank")
        + "{{ with index . 0 }}"
        + where
        + "{{ end }}{{ end }}"
    )


def collective_tests(cfg: GenerateConfig) -> dict[str, object]:
    """A promtool test of the collective rules (default config): who is named, and who never is.

    Four hung runs, evaluated at 10m, all waiting in a collective from 4m:

    * ``h1``: ranks 0, 1, 3 wait in all_reduce #100 of group 0; rank 2 (alive, answering, its GPU in
      its info series) last enqueued #99: it alone is named, ``behind``.
    * ``h2``: a chain. Ranks 2 and 3 wait in #50 of group 0; rank 0 waits in broadcast #7 of group 1
      (ranks 0 and 1) and so never reached #50 either, but it waits: not named. Rank 1 reached neither
      (#6 of group 1, #49 of group 0) and waits in nothing: named for both groups.
    * ``h3``: rank 3 is stopped from 2m (the agent's fetch fails, its series vanish): named
      ``not_answering``; rank 0 waits and its fetch has failed for 30 s only (under the 1 min the
      rule asks for): not named.
    * ``h4``: rank 1 exited at 3m (series and registration gone) while rank 0 waits: ``gone``.
    * ``h5``: rank 2 was stopped a moment ago (its series just vanished, one failed fetch): still
      registered, so not ``gone``, and not yet ``not_answering`` (1 min): not named yet.
    * ``h6``: a user on another host served rank 9 (past the world size of 2 rank 0 declares) for two
      minutes, saying it was behind, then exited: ``gone`` by the series, but excluded while it lived
      (``generate/ranks.py``), so never named.
    """
    c = CollectiveRecords(cfg)
    base = {"cluster": "c1", "job": "babysitter-node"}

    def series(spec_name: str, labels: dict[str, str]) -> str:
        inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
        return f"{spec_name}{{{inner}}}"

    def rank(run: str, number: str, host: str, **extra: str) -> dict[str, str]:
        return {**base, "instance": host, "run": run, "rank": number, **extra}

    waiting_from = "_x4 {0}+0x6"
    inputs: list[tuple[str, str]] = []

    def waits(run: str, number: str, host: str, *, pg: str, seq: int, op: str) -> None:
        labels = rank(run, number, host, pg=pg, op=op, size="1024", last_completed=str(seq - 1))
        inputs.append((series(R.COLLECTIVE_STUCK.name, labels), waiting_from.format(seq)))

    def reached(run: str, number: str, host: str, *, seq: int, pg: str = "0", values: str = "") -> None:
        labels = rank(run, number, host, pg=pg)
        inputs.append((series(R.COLLECTIVE_LAST_ENQUEUED.name, labels), values or f"{seq}+0x10"))

    def answers(run: str, number: str, host: str, values: str = "1+0x10") -> None:
        labels = {**rank(run, number, host), "owner_uid": "1000"}
        inputs.append((series(N.TRAINER_SCRAPE_SUCCESS.name, labels), values))

    def info(run: str, number: str, host: str, uuid: str = "", values: str = "1+0x10") -> None:
        inputs.append((series(T.INFO.name, rank(run, number, host, uuid=uuid)), values))

    for number, host in (("0", "n1:9400"), ("1", "n1:9400"), ("3", "n8:9400")):
        waits("h1", number, host, pg="0", seq=100, op="all_reduce")
        reached("h1", number, host, seq=100)
        answers("h1", number, host)
        info("h1", number, host)
    reached("h1", "2", "n7:9400", seq=99)
    answers("h1", "2", "n7:9400")
    info("h1", "2", "n7:9400", uuid="GPU-7f3a9c21")
    # h2: group 0 is every rank, group 1 ranks 0 and 1.
    for number, host in (("2", "n2:9400"), ("3", "n2:9400")):
        waits("h2", number, host, pg="0", seq=50, op="all_reduce")
        reached("h2", number, host, seq=50)
        answers("h2", number, host)
    waits("h2", "0", "n1:9400", pg="1", seq=7, op="broadcast")
    reached("h2", "0", "n1:9400", pg="1", seq=7)
    reached("h2", "0", "n1:9400", seq=49)
    answers("h2", "0", "n1:9400")
    reached("h2", "1", "n1:9400", pg="1", seq=6)
    reached("h2", "1", "n1:9400", seq=49)
    answers("h2", "1", "n1:9400")
    # h3: rank 3 stopped at 2m; rank 0 waits, its last fetch failed 30 s before 10m (values each minute).
    for number in ("0", "1", "2"):
        waits("h3", number, "n1:9400", pg="0", seq=500, op="all_gather")
        reached("h3", number, "n1:9400", seq=500)
        answers("h3", number, "n1:9400", "1+0x9 0" if number == "0" else "1+0x10")
    reached("h3", "3", "n3:9400", seq=480, values="480+10x2")
    answers("h3", "3", "n3:9400", "1+0x2 0+0x8")
    # Its first series lacked the uuid (its tracker had not learnt its GPU): placed on its GPU only.
    info("h3", "3", "n3:9400", values="1")
    info("h3", "3", "n3:9400", uuid="GPU-0b1c2d3e", values="_ 1+0x1")
    # h4: rank 1 exited at 3m.
    waits("h4", "0", "n1:9400", pg="0", seq=8, op="barrier")
    reached("h4", "0", "n1:9400", seq=8)
    answers("h4", "0", "n1:9400")
    reached("h4", "1", "n4:9400", seq=5, values="5+1x3")
    answers("h4", "1", "n4:9400", "1+0x3")
    # h5: rank 2's last sample at 9m, its first failed fetch at 10m: the agent's scrape no longer has its
    # series, so Prometheus marks them stale (promtool needs it said).
    for number in ("0", "1"):
        waits("h5", number, "n1:9400", pg="0", seq=20, op="all_reduce")
        reached("h5", number, "n1:9400", seq=20)
        answers("h5", number, "n1:9400")
    reached("h5", "2", "n5:9400", seq=19, values="19+0x9 stale")
    answers("h5", "2", "n5:9400", "1+0x9 0")
    # h6: ranks 0 and 1 wait in #20 from 4m; rank 0 declares 2 ranks. A user on n9 served rank 9 of h6
    # at 1m and 2m only (past the world size), saying it reached #19, and exited: gone, but never named.
    for number in ("0", "1"):
        waits("h6", number, "n1:9400", pg="0", seq=20, op="all_reduce")
        reached("h6", number, "n1:9400", seq=20)
        answers("h6", number, "n1:9400")
        inputs.append((series(N.TRAINER_RANK.name, rank("h6", number, "n1:9400")), f"{number}+0x10"))
    inputs.append((series(T.WORLD_SIZE.name, rank("h6", "0", "n1:9400")), "2+0x10"))
    reached("h6", "9", "n9:9400", seq=19, values="_ 19+0x1")
    answers("h6", "9", "n9:9400", "_ 1+0x1")
    inputs.append((series(N.TRAINER_RANK.name, rank("h6", "9", "n9:9400")), "_ 9+0x1"))

    def culprit(run: str, number: str, host: str, *, pg: str, op: str, reason: str, **extra: str) -> str:
        labels = {"cluster": "c1", "instance": host, "op": op, "pg": pg, "rank": number, "reason": reason}
        return series(c.culprit, {**labels, "run": run, **extra})

    expected = [
        (culprit("h1", "2", "n7:9400", pg="0", op="all_reduce", reason="behind", uuid="GPU-7f3a9c21"), 100.0),
        (culprit("h2", "1", "n1:9400", pg="0", op="all_reduce", reason="behind"), 50.0),
        (culprit("h2", "1", "n1:9400", pg="1", op="broadcast", reason="behind"), 7.0),
        (
            culprit(
                "h3", "3", "n3:9400", pg="0", op="all_gather", reason="not_answering", uuid="GPU-0b1c2d3e"
            ),
            500.0,
        ),
        (culprit("h4", "1", "n4:9400", pg="0", op="barrier", reason="gone"), 8.0),
    ]
    waiting = [
        (
            series(c.waiting, rank(run, n, h, pg=pg, op=op, size="1024", last_completed=str(seq - 1))),
            float(seq),
        )
        for run, n, h, pg, seq, op in (
            ("h1", "0", "n1:9400", "0", 100, "all_reduce"),
            ("h1", "1", "n1:9400", "0", 100, "all_reduce"),
            ("h1", "3", "n8:9400", "0", 100, "all_reduce"),
            ("h2", "0", "n1:9400", "1", 7, "broadcast"),
            ("h2", "2", "n2:9400", "0", 50, "all_reduce"),
            ("h2", "3", "n2:9400", "0", 50, "all_reduce"),
            ("h3", "0", "n1:9400", "0", 500, "all_gather"),
            ("h3", "1", "n1:9400", "0", 500, "all_gather"),
            ("h3", "2", "n1:9400", "0", 500, "all_gather"),
            ("h4", "0", "n1:9400", "0", 8, "barrier"),
            ("h5", "0", "n1:9400", "0", 20, "all_reduce"),
            ("h5", "1", "n1:9400", "0", 20, "all_reduce"),
            ("h6", "0", "n1:9400", "0", 20, "all_reduce"),
            ("h6", "1", "n1:9400", "0", 20, "all_reduce"),
        )
    ]
    for i, (name, value) in enumerate(waiting):
        waiting[i] = (name.replace(', job="babysitter-node"', ""), value)

    def named(record: str, run: str, number: str, host: str, *, pg: str, op: str, reason: str) -> str:
        labels = {"cluster": "c1", "instance": host, "op": op, "pg": pg, "rank": number, "reason": reason}
        return series(record, {**labels, "run": run})

    stuck = [
        (series(c.stuck, {"cluster": "c1", "pg": pg, "run": run}), value)
        for run, pg, value in (
            ("h1", "0", 100.0),
            ("h2", "0", 50.0),
            ("h2", "1", 7.0),
            ("h3", "0", 500.0),
            ("h4", "0", 8.0),
            ("h5", "0", 20.0),
            ("h6", "0", 20.0),
        )
    ]
    not_answering = [
        (
            named(c.not_answering, "h3", "3", "n3:9400", pg="0", op="all_gather", reason="not_answering"),
            500.0,
        ),
        (named(c.not_answering, "h4", "1", "n4:9400", pg="0", op="barrier", reason="gone"), 8.0),
    ]
    behind = [
        (named(c.behind, "h1", "2", "n7:9400", pg="0", op="all_reduce", reason="behind"), 100.0),
        (named(c.behind, "h2", "1", "n1:9400", pg="0", op="all_reduce", reason="behind"), 50.0),
        (named(c.behind, "h2", "1", "n1:9400", pg="1", op="broadcast", reason="behind"), 7.0),
    ]
    hosts = [
        (series(c.host, {"cluster": "c1", "instance": host, "rank": number, "run": run, **extra}), 1.0)
        for run, number, host, extra in (
            ("h1", "0", "n1:9400", {}),
            ("h1", "1", "n1:9400", {}),
            ("h1", "2", "n7:9400", {"uuid": "GPU-7f3a9c21"}),
            ("h1", "3", "n8:9400", {}),
            # stopped at 2m: still placed, from its last train_info
            ("h3", "3", "n3:9400", {"uuid": "GPU-0b1c2d3e"}),
        )
    ]
    quiet_before = [(c.culprit, "3m")]  # nobody waits yet: nobody is named
    return {
        "interval": "1m",
        "input_series": [{"series": name, "values": values} for name, values in inputs],
        "promql_expr_test": [
            {
                "expr": c.culprit,
                "eval_time": "10m",
                "exp_samples": [{"labels": name, "value": value} for name, value in expected],
            },
            *(
                {
                    "expr": expr,
                    "eval_time": "10m",
                    "exp_samples": [{"labels": n, "value": v} for n, v in samples],
                }
                for expr, samples in (
                    (c.waiting, waiting),
                    (c.stuck, stuck),
                    (c.not_answering, not_answering),
                    (c.behind, behind),
                    (c.host, hosts),
                )
            ),
            *({"expr": expr, "eval_time": at, "exp_samples": []} for expr, at in quiet_before),
        ],
    }
