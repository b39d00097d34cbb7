"""A run's rank that two hosts claim, or that its launcher never declared: visible as an alert naming
the hosts, instead of merged silently.

On one host the node agent serves a run and rank from one registration only (a later claim is
refused as ``conflict``), but no agent sees the other hosts. A rank registered on two hosts (two jobs
sharing a run name such as the fallback ``unnamed``, a rank restarted elsewhere while its old
process lives on, or a user on one host claiming another host's run to mislead its rules) keeps two
series apart by ``instance``, and every run-level rule sums both. The agents' own
per-registration scrape success series (which no trainer can serve: docs/security.md) says
which hosts claim each rank, so the alert counts the hosts per run and rank and fires once per host,
each naming all of them. A rank number at or past the world size the run's rank 0 declares
(``generate/ranks.py``) names the host serving it and the hosts serving the run's ranks. Either way
the rank takes no part in the run's stall, culprit and drain decisions.
"""

from __future__ import annotations

from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.generate.alerts._common import (
    _V,
    Alert,
    AlertTest,
    Labels,
    _l,
    _node_labels,
    _series,
    _with,
)
from babysitter.generate.config import GenerateConfig
from babysitter.generate.promql import by, select
from babysitter.generate.rules import Records

__all__ = ["claim_alerts"]


def _hosts_text(selector: str, cluster: str) -> str:
    """The instances claiming the alert's run and rank, read when the notification is rendered."""
    query = "group by (instance) (%s{%s=%%q,run=%%q,rank=%%q})" % (selector, cluster)  # noqa: UP031 - Go
    return (
        '{{ range sortByLabel "instance" (query (printf "'
        + query.replace('"', '\\"')
        + f'" $labels.{cluster} $labels.run $labels.rank)) }}}}{{{{ .Labels.instance }}}} {{{{ end }}}}'
    )


def _run_hosts_text(r: Records, cluster: str) -> str:
    """The hosts serving the alert's run's ranks that speak for it (space separated)."""
    k = r.ranks
    claims = "%s{%s=%%q,run=%%q}" % (N.TRAINER_SCRAPE_SUCCESS.name, cluster)  # noqa: UP031 - Go
    query = f"group by (instance) ({k.ignoring(claims)})"
    return (
        '{{ range $i, $h := sortByLabel "instance" (query (printf "'
        + query.replace('"', '\\"')
        + f'" $labels.{cluster} $labels.run)) }}}}'
        + "{{ if $i }} {{ end }}{{ $h.Labels.instance }}{{ end }}"
    )


def _world_size_text(r: Records, cluster: str, lookback: str) -> str:
    """The world size the alert's run's rank 0 declares (now, else the smallest in the lookback)."""
    one = "%s{%s=%%q,run=%%q}" % (r.ranks.world_size, cluster)  # noqa: UP031 - Go template braces
    query = f"{one} or min_over_time({one}[{lookback}])"
    args = f"$labels.{cluster} $labels.run"
    return (
        '{{ with query (printf "'
        + query.replace('"', '\\"')
        + f'" {args} {args}) }}}}{{{{ . | first | value | printf "%.0f" }}}}{{{{ end }}}}'
    )


def _undeclared(cfg: GenerateConfig, r: Records) -> Alert:
    c = cfg.cluster_label
    labels = _with(_node_labels(), run="r1", owner_uid="1000")
    stranger = _with(labels, instance="n9:9400", owner_uid="1001")
    text = (
        "The node agent on n9:9400 (cluster c1) serves a registration of run r1 rank 9, for 5m, but the "
        "run's rank 0 declares a world size of 4; the run's ranks are served from n1:9400 n7:9400. Rank 9 "
        "is left out of the run's stall, culprits, stragglers and likely cause, so n9:9400 is never "
        "drained for it; its MFU, tokens and goodput still add to the run's. No launcher started it: a "
        "user on n9:9400 claims another user's run, a process of an earlier, larger incarnation of the "
        "run lives on, or two jobs share a run name (docs/security.md)."
    )

    def rank(base: Labels, number: str, values: str) -> tuple[tuple[str, str], ...]:
        labels = _with(base, rank=number)
        return (
            (_series(N.TRAINER_SCRAPE_SUCCESS, labels), values),
            (_series(N.TRAINER_RANK, labels), values.replace("1+", f"{number}+")),
        )

    tracker = {key: value for key, value in labels.items() if key != "owner_uid"}
    return Alert(
        name="TrainingRankUndeclared",
        expr=r.ranks.undeclared,
        severity="warning",
        component="training",
        summary=(
            f"Run {_l('run')} rank {_l('rank')}, served from {_l('instance')}, is past the run's world size."
        ),
        description=(
            f"The node agent on {_l('instance')} (cluster {_l(c)}) serves a registration of run {_l('run')} "
            f"rank {_l('rank')}, for {cfg.claimed_twice_for}, but the run's rank 0 declares a world size of "
            f"{_world_size_text(r, c, cfg.stall_lookback_window)}; the run's ranks are served from "
            f"{_run_hosts_text(r, c)}. Rank {_l('rank')} is left out of the run's stall, culprits, "
            f"stragglers and likely cause, so {_l('instance')} is never drained for it; its MFU, tokens "
            f"and goodput still add to the run's. No launcher started it: a user on {_l('instance')} "
            f"claims another user's "
            f"run, a process of an earlier, larger incarnation of the run lives on, or two jobs share a "
            f"run name (docs/security.md)."
        ),
        for_=cfg.claimed_twice_for,
        test=AlertTest(
            series=(
                # Run r1: ranks 0 and 1 on n1, 2 and 3 on n7; its rank 0 declares 4 ranks.
                *(
                    item
                    for number, host in (
                        ("0", "n1:9400"),
                        ("1", "n1:9400"),
                        ("2", "n7:9400"),
                        ("3", "n7:9400"),
                    )
                    for item in rank(_with(labels, instance=host), number, "1+0x30")
                ),
                (_series(T.WORLD_SIZE, _with(tracker, rank="0")), "4+0x30"),
                # From 5m a user on n9 serves rank 9 of r1, declaring 16 ranks for itself, and rank 3
                # (contested: TrainingRankOnTwoHosts, not this alert).
                *rank(stranger, "9", "_x4 1+0x26"),
                (_series(T.WORLD_SIZE, _with(tracker, instance="n9:9400", rank="9")), "_x4 16+0x26"),
                *rank(stranger, "3", "_x4 1+0x26"),
                # Run r2's trackers export no world size (an older version): nothing is undeclared.
                *rank(_with(labels, run="r2"), "0", "1+0x30"),
                *rank(_with(stranger, run="r2"), "9", "1+0x30"),
            ),
            quiet=(("3m", "nobody serves rank 9 yet"), ("8m", "rank 9 served, before for:")),
            fire_at="15m",
            fire_labels=({"cluster": "c1", "instance": "n9:9400", "rank": "9", "run": "r1"},),
            fire_text=(("Run r1 rank 9, served from n9:9400, is past the run's world size.", text),),
        ),
    )


def claim_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """TrainingRankOnTwoHosts, TrainingRankUndeclared."""
    c = cfg.cluster_label
    claims = select(N.TRAINER_SCRAPE_SUCCESS, cfg.node_selector)
    rank_key = (c, "run", "rank")
    per_host = f"group {by((*rank_key, 'instance'))} ({claims})"
    expr = f"{per_host}\n* on ({', '.join(rank_key)}) group_left ()\ncount {by(rank_key)} ({per_host})\n> 1"
    labels = _with(_node_labels(), run="r1", rank="0", owner_uid="1000")
    n2 = _with(labels, instance="n2:9400", owner_uid="1001")
    success = N.TRAINER_SCRAPE_SUCCESS
    text = (
        "The node agents on n1:9400 n2:9400 (cluster c1) each serve a registration of run r1 rank 0, for "
        f"{cfg.claimed_twice_for}. The run's MFU, tokens and goodput mix both hosts' series; the rank is "
        "left out of its culprits, stragglers and likely cause (its stall counts the longest stall clock), "
        "so neither host is drained for it. Two jobs share a run name, a rank restarted elsewhere while "
        "its old process lives on, or a user on one host claims another host's run (docs/security.md)."
    )
    return [
        Alert(
            name="TrainingRankOnTwoHosts",
            expr=expr,
            severity="warning",
            component="training",
            summary=f"Run {_l('run')} rank {_l('rank')} is claimed on {_V} hosts.",
            description=(
                f"The node agents on {_hosts_text(N.TRAINER_SCRAPE_SUCCESS.name, c)}(cluster {_l(c)}) each "
                f"serve a registration of run {_l('run')} rank {_l('rank')}, for {cfg.claimed_twice_for}. "
                "The run's MFU, tokens and goodput mix both hosts' series; the rank is left out of its "
                "culprits, stragglers and likely cause (its stall counts the longest stall clock), so "
                "neither host is drained for it. Two jobs share a run name, a rank restarted elsewhere "
                "while its old process lives on, or a user on one host claims another host's run "
                "(docs/security.md)."
            ),
            for_=cfg.claimed_twice_for,
            test=AlertTest(
                series=(
                    # r1 rank 0 on n1 all along; on n2 from 5m on (a second job named r1, or a squat).
                    (_series(success, labels), "1+0x30"),
                    (_series(success, n2), "_x4 0+0x26"),
                    # r1 rank 1 on n1 only, r2 rank 0 on n2 only: one host each, never an alert.
                    (_series(success, _with(labels, rank="1")), "1+0x30"),
                    (_series(success, _with(n2, run="r2")), "1+0x30"),
                ),
                quiet=(("3m", "one host claims it"), ("8m", "two hosts, before for:")),
                fire_at="15m",
                fire_labels=tuple(
                    {"cluster": "c1", "instance": host, "rank": "0", "run": "r1"}
                    for host in ("n1:9400", "n2:9400")
                ),
                fire_text=(("Run r1 rank 0 is claimed on 2 hosts.", text),) * 2,
            ),
        ),
        _undeclared(cfg, r),
    ]
