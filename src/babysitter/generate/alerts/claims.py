"""A run and rank that two hosts claim: visible as an alert naming both, instead of merged silently.

On one host the node agent serves a run and rank from one registration only (a later claim is
refused as ``conflict``), but no agent sees the other hosts. A rank registered on two hosts (two jobs
sharing a run name such as the fallback ``unnamed``, a rank restarted elsewhere while its old
process lives on, or a user on one host claiming another host's run to mislead its rules) keeps two
series apart by ``instance``, and every run-level rule sums both. The agents' own
per-registration scrape success series (which no trainer can serve: docs/security.md) says
which hosts claim each rank, so the alert counts the hosts per run and rank and fires once per host,
each naming all of them.
"""

from __future__ import annotations

from babysitter.catalog import node as N
from babysitter.generate.alerts._common import _V, Alert, AlertTest, _l, _node_labels, _series, _with
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


def claim_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """TrainingRankOnTwoHosts."""
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
        f"{cfg.claimed_twice_for}. The run's rules sum both hosts' series, so its MFU, step time and "
        "goodput mix two sources: two jobs share a run name, a rank restarted elsewhere while its old "
        "process lives on, or a user on one host claims another host's run (docs/security.md)."
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
                f"The run's rules sum both hosts' series, so its MFU, step time and goodput mix two "
                f"sources: two jobs share a run name, a rank restarted elsewhere while its old process "
                f"lives on, or a user on one host claims another host's run (docs/security.md)."
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
        )
    ]
