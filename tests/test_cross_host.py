"""Across hosts (issue 21, point 1): a trainer on host A cannot write into host B's series, nor make
NodeAgentDown fire for B; a run and rank claimed on two hosts is an alert naming both.

Real parts: two node agents (host A and host B, each its own registration directory and target),
one real Prometheus scraping them with the scrape job as shipped in exporters/prometheus-scrape.yml
(only the targets and the interval changed), and the generated alert expressions evaluated by it.
Before the fix (486be02), the shipped ``honor_labels: true`` stored A's
``train_steps_total{instance="<B>"} 1e9`` in B's own series and A's ``up{instance="<B>"} 0`` as B's
``up``: this test failed on both.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.catalog import node as N
from babysitter.generate.alerts import alerts
from babysitter.generate.config import GenerateConfig
from babysitter.node.agent import Agent, Server
from babysitter.node.workloads.trainers import TrainersCollector
from promkit import PrometheusServer
from test_node_trainers_bound import TextServer

ROOT = Path(__file__).resolve().parent.parent


def _expr(name: str) -> str:
    return next(a.expr for a in alerts(GenerateConfig()) if a.name == name)


class Host:
    """One host: its registration directory, its node agent serving the trainers registered there."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.reg = tmp / f"reg-{name}"
        self.agent = Agent([TrainersCollector(self.reg, timeout=0.5)], collector_timeout=5.0)
        self.server = Server.start(self.agent, "127.0.0.1", 0)
        self.address = self.server.address
        self.trainers: list[TextServer] = []

    def trainer(self, run: str, rank: int, body: str) -> None:
        self.trainers.append(TextServer(self.reg, run, rank, body))

    def stop(self) -> None:
        self.server.stop()
        self.agent.close()
        for t in self.trainers:
            t.stop()


@pytest.fixture(scope="module", name="cluster")
def _cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, Host, Host]]:
    tmp = tmp_path_factory.mktemp("cross-host")
    a, b = Host(tmp, "a"), Host(tmp, "b")
    # Host B runs the real rank 0 of run vrun.
    b.trainer(
        "vrun", 0, 'train_steps_total{run="vrun",rank="0"} 5\ntrain_mfu_ratio{run="vrun",rank="0"} 0.02\n'
    )
    # A user on host A claims vrun rank 0 too, and serves B's instance and B's up.
    forged = f'instance="{b.address}",job="babysitter-node"'
    a.trainer(
        "vrun",
        0,
        f'train_steps_total{{run="vrun",rank="0",{forged}}} 1e9\n'
        f'train_mfu_ratio{{run="vrun",rank="0",{forged}}} 0.99\n'
        f'up{{run="vrun",rank="0",{forged}}} 0\n',
    )
    # ...and, as rank 1, the same without the labels (names alone must not get through either).
    a.trainer("vrun", 1, 'up{run="vrun",rank="1"} 0\nprobe_node_lemon{check="matmul"} 1\n')
    shipped = yaml.safe_load((ROOT / "exporters" / "prometheus-scrape.yml").read_text())
    job: dict[str, Any] = copy.deepcopy(shipped["scrape_configs"][0])
    job["scrape_interval"] = job["scrape_timeout"] = "1s"
    job["static_configs"] = [{"targets": [a.address, b.address], "labels": {"cluster": "c1"}}]
    try:
        with PrometheusServer(tmp, extra_scrape_configs=[job]) as prom:
            prom.wait_for(f'count({N.TRAINER_SCRAPE_SUCCESS.name}{{run="vrun",rank="0"}}) == 2')
            time.sleep(2)  # a few more scrapes of both
            yield prom, a, b
    finally:
        a.stop()
        b.stop()


def test_a_trainer_on_host_a_cannot_change_host_b_series(
    cluster: tuple[PrometheusServer, Host, Host],
) -> None:
    """B's train_steps_total and train_mfu_ratio are B's values, at every scrape; nothing A served lands
    under B's instance (not even renamed: it is refused at the agent)."""
    prom, _, b = cluster
    steps = prom.query('max_over_time(train_steps_total{run="vrun",rank="0"}[1m])')
    assert [(s["metric"]["instance"], float(s["value"][1])) for s in steps] == [(b.address, 5.0)]
    assert prom.query_value(f'min_over_time(train_steps_total{{instance="{b.address}"}}[1m])') == 5.0
    mfu = prom.query('max_over_time(train_mfu_ratio{run="vrun"}[1m])')
    assert [(s["metric"]["instance"], float(s["value"][1])) for s in mfu] == [(b.address, 0.02)]
    assert prom.query('{exported_instance!=""}') == []
    assert prom.query("probe_node_lemon") == []


def test_a_trainer_cannot_make_node_agent_down_fire_for_another_host(
    cluster: tuple[PrometheusServer, Host, Host],
) -> None:
    """``up`` is Prometheus' own: one series per target, 1 for both hosts over the whole window, and
    NodeAgentDown's expression finds nothing."""
    prom, a, b = cluster
    ups = prom.query('min_over_time(up{job="babysitter-node"}[1m])')
    assert sorted((s["metric"]["instance"], float(s["value"][1])) for s in ups) == sorted(
        [(a.address, 1.0), (b.address, 1.0)]
    )
    assert prom.query(_expr("NodeAgentDown")) == []


def test_a_rank_claimed_on_two_hosts_names_both(cluster: tuple[PrometheusServer, Host, Host]) -> None:
    """The claim is visible instead of merged: TrainingRankOnTwoHosts' expression has one series per
    host claiming vrun rank 0, so the alert names both; rank 1 (claimed on A only) is not in it."""
    prom, a, b = cluster
    found = prom.query(_expr("TrainingRankOnTwoHosts"))
    assert sorted(
        (s["metric"]["run"], s["metric"]["rank"], s["metric"]["instance"]) for s in found
    ) == sorted([("vrun", "0", a.address), ("vrun", "0", b.address)])
    assert all(float(s["value"][1]) == 2 for s in found)
