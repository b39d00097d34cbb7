"""Naming the bad node, end to end, in one real run: four gloo ranks under torchrun in lockstep.

Rank 2 computes 40% slower and rank 1 runs with its host clock 25 ms ahead (tests/scripts/
collectives_train.py says why patching its wall clock is a faithful stand-in). Step times are the same
on every rank, as lockstep makes them. The node agent serves the ranks, a real Prometheus evaluates the
generated fast-profile rules and a real Alertmanager (the example config) delivers to a webhook here.

1. The straggler: every rank's score comes from collective arrival (``train_info{flight_recorder="on"}``),
   rank 2's above 1.25 (its work is 84 ms of sleep to the others' 60 plus the same few ms of compute:
   about 1.35, read 1.28 to 1.36 here), the others within 0.1 of 1 (half the way to the page's 1.2; on
   a loaded 2-core machine one healthy rank read 0.946) - rank 1 included, whose clock is off (its lag
   stays within 5 ms: uncorrected, the 25 ms would show there); the TrainingStragglerRank page names
   rank 2 with its host and GPU, and no other rank; ``babysitter explain`` ranks it first with the same
   host.
2. The hang: rank 2 is stopped (SIGSTOP). The others wait in the step's all_reduce and say so; the
   TrainingStalled page names rank 2, its host and GPU, and the collective the others (0, 1, 3, never
   named) wait in; ``babysitter remediate`` with ``hosts_from: culprit`` plans to drain that host and
   nothing else; ``babysitter explain``'s hang cause names the same rank, host and collective.
3. The stragglers dashboard's collective panels return data (the live dashboard test, whose trainers run
   no process group, leaves them to this run).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.explain import explain
from babysitter.generate import fast
from babysitter.generate.writer import render, write
from babysitter.node.gpu.fake import fake_gpus
from babysitter.prom import PromClient
from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.jobmap import PrometheusJobMap
from babysitter.remediate.policy import parse_policy
from gen_helpers import (
    REPO,
    AlertmanagerServer,
    WebhookReceiver,
    alertmanager_config,
    has_data,
    substitute_grafana,
)
from node_helpers import read_port_file, wait_for
from promkit import PrometheusServer
from remediate_helpers import RecordingBackend, payload

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "collectives_train.py"
RUN, SLOW, SKEWED, SKEW_MS = "lockstep", "2", "1", 25
#: The collective panels of the stragglers dashboard (tests/test_dashboards_live.py leaves them here).
PANELS = (
    "Collective lag by rank",
    "Straggler score by rank",
    "Culprit of the last hang",
    "Ranks waiting in the last hang",
)


def _alerts(hook: WebhookReceiver, path: str, name: str) -> list[dict[str, Any]]:
    return [a for a in hook.alerts(path) if a["labels"]["alertname"] == name]


def _panel_exprs() -> list[tuple[str, str, bool]]:
    model = json.loads((REPO / "dashboards/babysitter-stragglers.json").read_text())
    found = [
        (panel["title"], target["expr"], bool(target.get("instant")))
        for panel in model["panels"]
        for target in panel.get("targets", [])
        if panel["title"] in PANELS
    ]
    assert {title for title, _, _ in found} == set(PANELS)
    return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun not installed")
    tmp = tmp_path_factory.mktemp("collectives")
    reg, run_dir, out = tmp / "reg", tmp / "run", tmp / "out"
    for folder in (reg, run_dir, out):
        folder.mkdir()
    write(tmp / "gen", render(fast()))
    rules = [tmp / "gen/alerts/babysitter-rules.yaml", tmp / "gen/alerts/babysitter-alerts.yaml"]
    logs = []
    agent_argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "4", "--port", "0"]
    agent_argv += ["--port-file", str(tmp / "addr"), "--registry-dir", str(reg), "--no-collector.xid"]
    agent_argv += ["--collector-timeout", "5", "--trainer-timeout", "0.5"]
    logs.append((tmp / "agent.log").open("wb"))
    agent = subprocess.Popen(agent_argv, stdout=logs[-1], stderr=subprocess.STDOUT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    logs.append((tmp / "train.log").open("wb"))
    # A 500-entry recorder (the user's choice, which watch() keeps): its dumps are cheap enough on this
    # loaded 2-core machine for every few straggler rounds (rounds come every 0.4 s here); torch's
    # default 2000 is spaced to a dump every few seconds by the 1% budget, which makes scores slower
    # to appear (benchmarks/results/collectives.md).
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "500"}
    train = subprocess.Popen(
        [*torchrun, str(SCRIPT), str(reg), str(run_dir), str(out), SLOW, SKEWED, str(SKEW_MS)],
        stdout=logs[-1],
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    pids: dict[str, int] = {}
    try:
        with WebhookReceiver() as hook, AlertmanagerServer(tmp, alertmanager_config(hook.url)) as am:
            address = read_port_file(tmp / "addr", timeout=60)
            job = {
                "job_name": "babysitter-node",
                "honor_labels": True,
                "static_configs": [{"targets": [address], "labels": {"cluster": "c1"}}],
            }
            with PrometheusServer(
                tmp, rule_files=rules, alertmanager=am.address, extra_scrape_configs=[job]
            ) as prom:
                yield {"prom": prom, "hook": hook, "address": address, "out": out, "pids": pids, "tmp": tmp}
    finally:
        for pid in pids.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        (out / "stop").write_text("")
        with contextlib.suppress(OSError):
            os.killpg(train.pid, signal.SIGTERM)
        agent.terminate()
        for proc in (train, agent):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL) if proc is train else proc.kill()
                proc.wait(timeout=10)
        for handle in logs:
            handle.close()


def test_a_lockstep_straggler_is_named_and_no_other_rank_whatever_its_clock(stack: Any) -> None:
    prom, hook = stack["prom"], stack["hook"]
    score = R.STRAGGLER_SCORE.name
    wait_for(
        lambda: (
            len(prom.query(f'{score}{{run="{RUN}"}}')) == 4
            and prom.query(f'{score}{{run="{RUN}", rank="{SLOW}"}} > 1.25')
        ),
        timeout=120,
        interval=0.5,
    )
    began = time.monotonic()
    time.sleep(3)  # a few more rounds
    scores = {r["metric"]["rank"]: float(r["value"][1]) for r in prom.query(f'{score}{{run="{RUN}"}}')}
    print("straggler scores:", scores)
    assert scores[SLOW] > 1.25, scores
    assert all(abs(v - 1.0) <= 0.1 for rank, v in scores.items() if rank != SLOW), scores  # rank 1 too
    # Step times alone cannot tell them apart (lockstep): the step-time rule reads ~1 everywhere.
    info = prom.query(f'{T.INFO.name}{{run="{RUN}", flight_recorder="on"}}')
    assert len(info) == 4, info
    lags = {
        r["metric"]["rank"]: float(r["value"][1])
        for r in prom.query(f'{R.COLLECTIVE_LAG.name}{{run="{RUN}"}}')
    }
    assert lags[SLOW] > 0.01 and all(abs(v) < 0.005 for rank, v in lags.items() if rank != SLOW), lags
    # The page is due after the rule's ``for`` (fast: seconds); 120 s covers a CI machine under load.
    pages: Any = wait_for(lambda: _alerts(hook, "/chat", "TrainingStragglerRank"), timeout=120, interval=0.5)
    print(f"scores to the straggler page: {time.monotonic() - began:.1f} s (for: {fast().straggler_for})")
    assert {a["labels"]["rank"] for a in _alerts(hook, "/chat", "TrainingStragglerRank")} == {SLOW}, pages
    uuid = fake_gpus(4)[int(SLOW)].uuid
    summary = pages[0]["annotations"]["summary"]
    assert summary.startswith(f"Rank {SLOW} of run {RUN} on host {stack['address']} ({uuid}) steps "), summary
    answer = explain(PromClient(prom.url), RUN, window=20, baseline=20, cluster="c1", cfg=fast())
    straggler = next(c for c in answer.causes if c.key == "straggler")
    print("\n".join(answer.lines()))
    assert straggler.ranks == [SLOW] and straggler.hosts == [stack["address"]] and straggler.gpus == [uuid]


def test_a_stopped_rank_is_named_in_the_stall_page_and_the_waiting_ranks_are_not(stack: Any) -> None:
    prom, hook, out = stack["prom"], stack["hook"], stack["out"]
    pids = {r: json.loads((out / f"rank{r}.json").read_text())["pid"] for r in range(4)}
    stack["pids"][SLOW] = pids[int(SLOW)]
    os.kill(pids[int(SLOW)], signal.SIGSTOP)
    stopped = time.monotonic()
    pages: Any = wait_for(
        lambda: [
            a
            for a in hook.pages()
            if a["labels"]["alertname"] == "TrainingStalled" and a["annotations"].get("culprit_hosts")
        ],
        timeout=60,
        interval=0.5,
    )
    page = pages[0]
    took = time.monotonic() - stopped
    print(f"stopped -> page naming the culprit: {took:.1f} s")
    uuid = fake_gpus(4)[int(SLOW)].uuid
    description = page["annotations"]["description"]
    match = re.search(r" Culprit: (.*)$", description)
    assert match, description
    assert re.fullmatch(
        rf"rank {SLOW} on host {re.escape(stack['address'])} \({uuid}\) stopped answering its node agent "
        r"\(a stopped or hard-hung process\) while ranks 0, 1, 3 wait in all_reduce #(\d+) of group 0\.",
        match.group(1),
    ), match.group(1)
    seq = int(re.search(r"#(\d+)", match.group(1)).group(1))  # type: ignore[union-attr]
    assert page["annotations"]["culprit_hosts"] == stack["address"]
    assert page["annotations"]["summary"].endswith(f"; culprit rank {SLOW} on host {stack['address']}."), page
    # The waiting ranks said what they wait in: the same collective, the last they completed just before.
    waiting = prom.query(f'{R.COLLECTIVE_STUCK.name}{{run="{RUN}"}}')
    assert {w["metric"]["rank"] for w in waiting} == {"0", "1", "3"}
    assert {(w["metric"]["op"], float(w["value"][1]), w["metric"]["last_completed"]) for w in waiting} == {
        ("all_reduce", float(seq), str(seq - 1))
    }
    # babysitter remediate, hosts_from: culprit, dry run: the culprit's host and nothing else, once the
    # job map in Prometheus says it holds the run's ranks.
    tmp = stack["tmp"]
    policy = parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(tmp / "audit.jsonl"),
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
    backend = RecordingBackend(["127.0.0.1", "n2"])
    jobmap = PrometheusJobMap(prom.url, lookback=3600, timeout=10)
    Remediator(policy, backend, AuditLog(tmp / "audit.jsonl"), jobmap=jobmap, force_dry_run=True).handle(
        parse_notification(payload(page))
    )
    assert backend.calls == [("drain", "127.0.0.1", True)]
    # babysitter explain: the hang cause names the same rank, host, GPU and collective.
    answer = explain(PromClient(prom.url), RUN, window=20, baseline=20, cluster="c1", cfg=fast())
    print("\n".join(answer.lines()))
    hang = next(c for c in answer.causes if c.key == "hang")
    assert hang.ranks == [SLOW] and hang.hosts == [stack["address"]] and hang.gpus == [uuid]
    assert f"all_reduce #{seq} of group 0" in hang.text and "ranks 0, 1, 3 wait" in hang.text, hang.text
    # The stopped rank's series end inside the window while the others' go on: the same job, not a
    # smaller one (tokens per step counted over the samples each rank has).
    assert "job_size" not in {c.key for c in answer.causes}, answer.lines()


def test_the_stragglers_dashboards_collective_panels_return_data(stack: Any) -> None:
    """Runs after the hang: every collective panel of the committed dashboard has data (the pattern of
    tests/test_dashboards_live.py, on this run's series)."""
    prom = stack["prom"]
    start = time.time() - 600
    missing = [
        title
        for title, expr, instant in _panel_exprs()
        if not has_data(prom, substitute_grafana(expr), instant, start)
    ]
    assert missing == []
