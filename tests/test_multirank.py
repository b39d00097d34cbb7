"""torchrun --nproc-per-node 3 on CPU (gloo), one rank slowed on purpose, seen through the node agent.

Checks in one run (starting torchrun, the agent and Prometheus costs most of the time):
the slowed rank's in-process straggler score and the PromQL straggler ratio (the generated
recording rule, evaluated by a real Prometheus) both flag it and only it; every rank's metrics
reach Prometheus through the node agent's /metrics; only rank 0 writes the ledger.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.config import fast
from babysitter.generate.rules import Records, recording_groups
from node_helpers import read_port_file
from promkit import PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "multirank_train.py"
SLOW = 2
RUN = "multirank"


def _stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_torchrun_three_ranks_straggler_agent_and_ledger(tmp_path: Path) -> None:
    if shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun not installed")
    reg, run_dir, out = tmp_path / "reg", tmp_path / "run", tmp_path / "out"
    for d in (reg, run_dir, out):
        d.mkdir()
    cfg = fast()
    rules = tmp_path / "rules.yml"
    rules.write_text(json.dumps({"groups": recording_groups(cfg)}))  # JSON is YAML
    ratio = Records(cfg).rank_step_ratio

    agent_argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "1", "--port", "0"]
    agent_argv += ["--port-file", str(tmp_path / "addr"), "--registry-dir", str(reg), "--no-collector.xid"]
    agent = subprocess.Popen(agent_argv, stdout=(tmp_path / "agent.log").open("wb"), stderr=subprocess.STDOUT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    train = subprocess.Popen(
        [*torchrun, str(SCRIPT), str(reg), str(run_dir), str(out), "90", str(SLOW)],
        stdout=(tmp_path / "train.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        address = read_port_file(tmp_path / "addr", timeout=60)
        job = {"job_name": "node", "honor_labels": True, "static_configs": [{"targets": [address]}]}
        with PrometheusServer(tmp_path, rule_files=[rules], extra_scrape_configs=[job]) as prom:
            # every rank, through the agent alone
            prom.wait_for(f'count({T.STEPS.name}{{job="node", run="{RUN}"}} > 20) == 3', timeout=90)
            # PromQL: the generated recording rule flags the slowed rank, and only it
            prom.wait_for(f'{ratio}{{run="{RUN}", rank="{SLOW}"}} > 1.5', timeout=60)
            ratios = {
                r["metric"]["rank"]: float(r["value"][1]) for r in prom.query(f'{ratio}{{run="{RUN}"}}')
            }
            assert set(ratios) == {"0", "1", "2"}
            assert ratios["0"] < 1.2 and ratios["1"] < 1.2, ratios
            # in-process: the exchanged straggler score says the same
            prom.wait_for(
                f'{R.STRAGGLER_SCORE.name}{{job="node", run="{RUN}", rank="{SLOW}"}} > 1.5', timeout=60
            )
            scores = {
                r["metric"]["rank"]: float(r["value"][1])
                for r in prom.query(f'{R.STRAGGLER_SCORE.name}{{job="node", run="{RUN}"}}')
            }
            assert all(scores[rank] < 1.2 for rank in scores if rank != str(SLOW)), scores
            assert len(scores) >= 2, scores  # the slowed rank and at least one fast one
        (out / "stop").write_text("")
        assert train.wait(timeout=120) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        (out / "stop").write_text("")
        _stop(train)
        _stop(agent)
    # only rank 0 wrote the ledger
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(3)}
    ledgers = list(run_dir.glob("*.jsonl"))
    assert len(ledgers) == 1
    starts = [json.loads(line) for line in ledgers[0].open() if '"k":"start"' in line]
    assert [s["pid"] for s in starts] == [ranks[0]["pid"]]
    assert starts[0]["info"]["world_size"] == 3
