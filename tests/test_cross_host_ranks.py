"""A stranger's rank cannot silence or misdirect a run's page (issue 31, point 2).

Real parts: two node agents (host A and host B, each its own registration directory and target),
one real Prometheus scraping them with the shipped scrape job (targets and interval changed) and
evaluating the generated fast-profile rules, and ``babysitter remediate``'s engine asking that
Prometheus which hosts hold the run's ranks. Host B runs run ``hrun`` (rank 0, which declares a world
size of 2, and rank 1): it hangs in all_reduce #50 of group 0, which rank 1 never reached. A user on
host A serves rank 9 of ``hrun`` through A's own agent: its stall clock says 0, it says it never
reached #10, and it declares a world size of 16 for itself.

With the rules before (main), TrainingStalled never fired for ``hrun`` (the run's smallest stall
clock was A's 0) and the culprit rule named rank 9 on A next to rank 1 on B. Now the page fires,
names rank 1 on B alone, and TrainingRankUndeclared names A and B; a forged page naming A as the
culprit is refused by the remediator (A holds none of the run's ranks).
"""

from __future__ import annotations

import copy
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate import fast
from babysitter.generate.rules import Records
from babysitter.generate.writer import render, write
from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.jobmap import PrometheusJobMap
from babysitter.remediate.policy import parse_policy
from promkit import PrometheusServer
from remediate_helpers import RecordingBackend, alert, payload
from test_cross_host import ROOT, Host

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

RUN = "hrun"
CFG = fast()
R_ = Records(CFG)


def _body(rank: int, lines: list[tuple[str, dict[str, str], float]]) -> str:
    out = []
    for name, labels, value in lines:
        inner = ",".join(f'{k}="{v}"' for k, v in {"run": RUN, "rank": str(rank), **labels}.items())
        out.append(f"{name}{{{inner}}} {value:g}")
    return "\n".join(out) + "\n"


def _rank(rank: int, *, stalled: float, enqueued: int, world: int | None = None, waits: bool = False) -> str:
    lines = [
        (R.STALLED_SECONDS.name, {}, stalled),
        (T.LAST_STEP_TIMESTAMP.name, {}, time.time() - stalled),
        (T.STEPS.name, {}, 100.0),
        (T.INFO.name, {"uuid": ""}, 1.0),
        (R.COLLECTIVE_LAST_ENQUEUED.name, {"pg": "0"}, float(enqueued)),
    ]
    if world is not None:
        lines.append((T.WORLD_SIZE.name, {}, float(world)))
    if waits:
        stuck = {"pg": "0", "op": "all_reduce", "size": "1024", "last_completed": str(enqueued - 1)}
        lines.append((R.COLLECTIVE_STUCK.name, stuck, float(enqueued)))
    return _body(rank, lines)


@pytest.fixture(scope="module", name="cluster")
def _cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, Host, Host]]:
    tmp = tmp_path_factory.mktemp("cross-host-ranks")
    write(tmp / "gen", render(CFG))
    rules = [tmp / "gen/alerts/babysitter-rules.yaml", tmp / "gen/alerts/babysitter-alerts.yaml"]
    a, b = Host(tmp, "a"), Host(tmp, "b")
    # Host B: hrun hangs 100 s in all_reduce #50 (rank 0 waits in it), which rank 1 never reached.
    b.trainer(RUN, 0, _rank(0, stalled=100, enqueued=50, world=2, waits=True))
    b.trainer(RUN, 1, _rank(1, stalled=100, enqueued=49))
    # Host A: a stranger's rank 9 of hrun, "stepping", "behind", declaring 16 ranks.
    a.trainer(RUN, 9, _rank(9, stalled=0, enqueued=10, world=16))
    shipped = yaml.safe_load((ROOT / "exporters" / "prometheus-scrape.yml").read_text())
    job: dict[str, Any] = copy.deepcopy(shipped["scrape_configs"][0])
    job["scrape_interval"] = job["scrape_timeout"] = "1s"
    job["static_configs"] = [{"targets": [a.address, b.address], "labels": {"cluster": "c1"}}]
    try:
        with PrometheusServer(tmp, extra_scrape_configs=[job], rule_files=rules) as prom:
            prom.wait_for(f'count({N.TRAINER_SCRAPE_SUCCESS.name}{{run="{RUN}"}}) == 3')
            yield prom, a, b
    finally:
        a.stop()
        b.stop()


def _alerts(prom: PrometheusServer, name: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{prom.url}/api/v1/alerts", timeout=5) as response:  # noqa: S310
        found = json.load(response)["data"]["alerts"]
    return [a for a in found if a["labels"]["alertname"] == name and a["state"] == "firing"]


def _wait_alerts(prom: PrometheusServer, name: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while not (found := _alerts(prom, name)):
        if time.monotonic() > deadline:
            raise AssertionError(f"no firing {name} within {timeout} s; log: {prom.log_tail()}")
        time.sleep(0.5)
    return found


def test_the_strangers_series_reach_prometheus(cluster: tuple[PrometheusServer, Host, Host]) -> None:
    """The attack is real: A's rank 9 of hrun is stored, under A's instance, stall clock 0."""
    prom, a, b = cluster
    clocks = prom.query(f'{R.STALLED_SECONDS.name}{{run="{RUN}"}}')
    assert sorted(
        (s["metric"]["instance"], s["metric"]["rank"], float(s["value"][1])) for s in clocks
    ) == sorted([(a.address, "9", 0.0), (b.address, "0", 100.0), (b.address, "1", 100.0)])


def test_the_run_still_pages_naming_its_own_culprit(cluster: tuple[PrometheusServer, Host, Host]) -> None:
    """TrainingStalled fires for hrun; culprit and culprit_hosts are rank 1 on B, never A."""
    prom, a, b = cluster
    (page,) = [p for p in _wait_alerts(prom, "TrainingStalled") if p["labels"]["run"] == RUN]
    assert page["annotations"]["culprit_hosts"] == b.address, page["annotations"]
    assert page["annotations"]["summary"].endswith(f"; culprit rank 1 on host {b.address}."), page
    assert a.address not in page["annotations"]["description"]
    culprits = prom.query(f'{R_.collectives.culprit}{{run="{RUN}"}}')
    assert [(c["metric"]["rank"], c["metric"]["instance"]) for c in culprits] == [("1", b.address)]


def test_the_undeclared_rank_is_an_alert_naming_both_hosts(
    cluster: tuple[PrometheusServer, Host, Host],
) -> None:
    prom, a, b = cluster
    (found,) = _wait_alerts(prom, "TrainingRankUndeclared")
    assert {k: found["labels"][k] for k in ("run", "rank", "instance")} == {
        "run": RUN,
        "rank": "9",
        "instance": a.address,
    }
    text = found["annotations"]["description"]
    assert f"The node agent on {a.address} (cluster c1) serves a registration of run {RUN} rank 9" in text
    assert f"declares a world size of 2; the run's ranks are served from {b.address}." in text, text


def test_remediate_refuses_to_drain_a_host_holding_none_of_the_runs_ranks(
    cluster: tuple[PrometheusServer, Host, Host], tmp_path: Path
) -> None:
    """The job map in this Prometheus says hrun's ranks report from B alone. A page whose
    culprit_hosts names A (rules that lag, or a forged page) drains nothing; the real page drains B.
    Both agents listen on 127.0.0.1, so the policy's host pattern takes each agent's port for its node
    name."""
    prom, a, b = cluster
    jobmap = PrometheusJobMap(prom.url, lookback=3600, timeout=10)
    assert jobmap.instances_of(RUN, ("cluster", "c1")) == [b.address]
    node_a, node_b = a.address.rsplit(":", 1)[1], b.address.rsplit(":", 1)[1]
    policy = parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(tmp_path / "audit.jsonl"),
            "hosts": {"pattern": r"127\.0\.0\.1:(\d+)"},
            "jobs": {"prometheus_url": prom.url},
            "rails": {
                "rate_limit": {"actions": 5, "window": "10m"},
                "drain_cap": {"fraction": 0.5, "window": "1h"},
            },
            "rules": [
                {
                    "name": "stall",
                    "match": {"alertname": "TrainingStalled"},
                    "actions": ["drain"],
                    "hosts_from": "culprit",
                }
            ],
        }
    )
    backend = RecordingBackend([node_a, node_b])
    audit = AuditLog(tmp_path / "audit.jsonl")
    remediator = Remediator(policy, backend, audit, jobmap=jobmap, force_dry_run=True)
    (page,) = [p for p in _wait_alerts(prom, "TrainingStalled") if p["labels"]["run"] == RUN]
    forged = alert("TrainingStalled", fingerprint="a1", **page["labels"])
    forged["annotations"] = {**page["annotations"], "culprit_hosts": a.address}
    real = alert("TrainingStalled", fingerprint="b2", **page["labels"])
    real["annotations"] = page["annotations"]
    remediator.handle(parse_notification(payload(forged)))
    assert backend.calls == []
    remediator.handle(parse_notification(payload(real)))
    assert backend.calls == [("drain", node_b, True)]
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    (refused,) = [r for r in records if r["event"] == "refused"]
    assert (refused["host"], refused["reason"]) == (node_a, "not_in_run"), refused
    assert refused["detail"] == f"{node_a} holds none of run {RUN}'s ranks: its ranks report from {node_b}"
