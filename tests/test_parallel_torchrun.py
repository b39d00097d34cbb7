"""MFU under model parallelism with real torchrun jobs on CPU (gloo), scraped by a real Prometheus.

* TP=2 x DP=2 on 4 ranks: a tiny GPT sharded by ``torch.distributed.tensor.parallel`` (FSDP2 over the
  data-parallel dimension); watch() gets no layout and reads it from the model's DTensor mesh.
* A 2-stage pipeline on 2 ranks with ``torch.distributed.pipelining`` (GPipe, 4 micro-batches).
* Expert parallelism on 2 ranks: a tiny MoE whose experts are spread over the ranks, tokens sent to
  them by all-to-all; FLOPs checked against FlopCounterMode on every rank.
* Lightning's ModelParallelStrategy (tensor parallel over 2 ranks): the callback reads its mesh.

Context parallelism cannot run here: torch 2.13's ``context_parallel`` has no CPU attention kernel
("Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
registered"), so test_parallel_layout.py checks its arithmetic with the layout given explicitly.

For the Prometheus jobs, the test computes the truth itself from every rank's own log of step times:
job tokens in the window x FLOPs per token (by hand from the model's dimensions) / window / (ranks x
peak), and compares it with what PromQL, the generated ``run:`` recording rules, the scorecard's query
and each rank's in-process gauge say. The tolerance (15%) absorbs shared-CPU jitter at the window's
edges; the double count it guards against is 2x.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from babysitter.catalog import train as T
from babysitter.generate.config import fast
from babysitter.generate.rules import Records, recording_groups
from babysitter.scorecard.queries import QuerySet
from node_helpers import read_port_file
from promkit import PrometheusServer

pytestmark = [pytest.mark.slow]

pytest.importorskip("torch")

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from parallel_common import PEAK_FLOPS, RUN_PP, RUN_TP, Shape, palm_flops_per_token  # noqa: E402

WINDOW = 10  # seconds: the rate window of the rules and queries, and the trackers' mfu_window
TOLERANCE = 0.15
CFG = replace(fast(), rate_window=f"{WINDOW}s")


def _stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _torchrun(script: str, nproc: int, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return subprocess.Popen(
        [*argv, str(SCRIPTS / script), *args], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def _ranks(out: Path, nproc: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A node agent serving every registered rank, and Prometheus with the generated rules."""
    tmp = tmp_path_factory.mktemp("parallel")
    reg = tmp / "reg"
    reg.mkdir()
    rules = tmp / "rules.yml"
    rules.write_text(json.dumps({"groups": recording_groups(CFG)}))  # JSON is YAML
    agent_argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "1", "--port", "0"]
    agent_argv += ["--port-file", str(tmp / "addr"), "--registry-dir", str(reg), "--no-collector.xid"]
    agent = subprocess.Popen(agent_argv, stdout=(tmp / "agent.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        address = read_port_file(tmp / "addr", timeout=60)
        job = {"job_name": "node", "honor_labels": True, "static_configs": [{"targets": [address]}]}
        with PrometheusServer(tmp, rule_files=[rules], extra_scrape_configs=[job]) as prom:
            yield prom, reg
    finally:
        _stop(agent)


def _job_while_running(
    stack: tuple[PrometheusServer, Path], tmp: Path, script: str, *, nproc: int, run: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the job; once every rank has stepped for a full window, read everything at one instant."""
    prom, reg = stack
    out = tmp / "out"
    out.mkdir()
    train = _torchrun(script, nproc, [str(reg), str(out), "150"], tmp / "train.log")
    sel = f'run="{run}"'
    try:
        prom.wait_for(f"count({T.STEPS.name}{{{sel}}} > 0) == {nproc}", timeout=150)
        # The whole window inside steady training, and so the rule windows the scorecard's points
        # read (the scorecard reads the run rule over its window: points reaching back 2 windows).
        time.sleep(2 * WINDOW + 3)
        prom.wait_for(f"min(increase({T.STEPS.name}{{{sel}}}[{WINDOW}s])) > 10", timeout=30)
        at = time.time() - 0.5
        r = Records(CFG)
        qs = QuerySet(window=f"{WINDOW}s", rate_window=f"{WINDOW}s", step="1s", tracker_selector=sel)
        flops, tokens, peak = (f"{m.name}{{{sel}}}" for m in (T.MODEL_FLOPS, T.TOKENS, T.PEAK_FLOPS))
        seen = {
            "at": at,
            "promql_mfu": prom.query_value(f"sum(rate({flops}[{WINDOW}s])) / sum({peak})", at),
            "promql_tokens": prom.query_value(f"sum(rate({tokens}[{WINDOW}s]))", at),
            "rule_mfu": prom.query_value(f"{r.mfu}{{{sel}}}", at),
            "rule_tokens": prom.query_value(f"{r.tokens_rate}{{{sel}}}", at),
            "scorecard_mfu": prom.query_value(qs.mfu(), at),
            # Per rank from its counters (every rank's share over its own peak), and rank 0's
            # in-process gauge (the gauge is the run's view: rank 0 alone exports it).
            "rank_mfu": {
                s["metric"]["rank"]: float(s["value"][1])
                for s in prom.query(f"rate({flops}[{WINDOW}s]) / {peak}", at)
            },
            "rank0_gauge": prom.query_value(f"{T.MFU.name}{{{sel}}}", at),
            "flops_per_step": {
                s["metric"]["rank"]: float(s["value"][1])
                for s in prom.query(f"{flops} / {T.STEPS.name}{{{sel}}}", at)
            },
        }
        (out / "stop").write_text("")
        assert train.wait(timeout=120) == 0, (tmp / "train.log").read_text()[-3000:]
    finally:
        (out / "stop").write_text("")
        _stop(train)
    return seen, _ranks(out, nproc)


def _truth(ranks: list[dict[str, Any]], at: float, shape: Shape) -> tuple[float, float]:
    """(job MFU, job tokens/s) over (at - WINDOW, at] from the ranks' own step logs."""
    replicas: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        replicas.setdefault(rank["dp_rank"], rank)  # one rank speaks for its replica's batches
    tokens = sum(
        sum(1 for t in rank["steps"] if at - WINDOW < t <= at) * rank["tokens_per_step"]
        for rank in replicas.values()
    )
    tokens_per_second = tokens / WINDOW
    return tokens_per_second * palm_flops_per_token(shape) / (len(ranks) * PEAK_FLOPS), tokens_per_second


def _assert_job_numbers(seen: dict[str, Any], ranks: list[dict[str, Any]], shape: Shape) -> None:
    mfu, tokens_per_second = _truth(ranks, seen["at"], shape)
    assert mfu > 0
    numbers = {k: seen[k] for k in ("promql_mfu", "rule_mfu")}
    numbers |= {f"rank {k} rate(flops) / peak": v for k, v in seen["rank_mfu"].items()}
    numbers["rank 0 train_mfu_ratio"] = seen["rank0_gauge"]
    assert len(seen["rank_mfu"]) == len(ranks)
    for name, value in numbers.items():
        assert value == pytest.approx(mfu, rel=TOLERANCE), (name, value, mfu, seen)
    # The scorecard takes the median of the run rule's points over its window, each point a rate over
    # the WINDOW before it: its truth is the median of the ranks' own MFU over those windows (CPU ranks
    # sharing two cores speed up and slow down from one window to the next).
    points = sorted(_truth(ranks, math.floor(seen["at"]) - k, shape)[0] for k in range(WINDOW))
    median = (points[(WINDOW - 1) // 2] + points[WINDOW // 2]) / 2
    assert seen["scorecard_mfu"] == pytest.approx(median, rel=TOLERANCE), (points, seen)
    for name in ("promql_tokens", "rule_tokens"):
        assert seen[name] == pytest.approx(tokens_per_second, rel=TOLERANCE), (name, seen, tokens_per_second)


@pytest.mark.prometheus
def test_tensor_x_data_parallel_mfu_is_the_job_mfu(stack: Any, tmp_path: Path) -> None:
    """TP=2 x DP=2: per-rank MFU, sum(rate(flops)) / sum(peak), the run: rules and the scorecard all give
    the job's MFU; sum(rate(tokens)) gives the job's tokens/s (every token once, not once per TP rank)."""
    seen, ranks = _job_while_running(stack, tmp_path, "parallel_tp_train.py", nproc=4, run=RUN_TP)
    shape = Shape()
    _assert_job_numbers(seen, ranks, shape)
    per_step = palm_flops_per_token(shape) * shape.batch * shape.seq / 2  # each rank: half its replica's
    for rank, value in seen["flops_per_step"].items():
        assert value == pytest.approx(per_step), rank
    # the model really was sharded (q's rows split over TP, then again by FSDP2), and the layout came
    # from its DeviceMesh
    assert {r["layout"] for r in ranks} == {"tp=2,pp=1,cp=1,ep=1,dp=2"}
    assert all(r["local_q_weight"] == [shape.d // 4, shape.d] for r in ranks)
    assert sorted(r["dp_rank"] for r in ranks) == [0, 0, 1, 1]


@pytest.mark.prometheus
def test_pipeline_stages_share_flops_and_the_bubble_lowers_mfu(stack: Any, tmp_path: Path) -> None:
    """PP=2 (GPipe, 4 micro-batches): each stage is credited half the replica's FLOPs whatever the
    bubble, the halves add up to what FlopCounterMode measured on the two stages, and MFU is the job's
    (the bubble is in the step time the truth divides by)."""
    seen, ranks = _job_while_running(stack, tmp_path, "parallel_pp_train.py", nproc=2, run=RUN_PP)
    shape = Shape(**ranks[0]["shape"])
    _assert_job_numbers(seen, ranks, shape)
    tokens = shape.batch * shape.seq
    credited = palm_flops_per_token(shape) * tokens
    assert sum(seen["flops_per_step"].values()) == pytest.approx(credited)
    assert seen["flops_per_step"]["0"] == pytest.approx(seen["flops_per_step"]["1"])
    # really computed by the two stages in one step; the 1.1% above PaLM's count is SDPA's backward
    # (5 matmuls, docs/flops.md "Why measured and analytic differ")
    measured = sum(r["measured_model_flops"] for r in ranks)
    assert measured == pytest.approx(credited, rel=0.02)
    assert {r["layout"] for r in ranks} == {"tp=1,pp=2,cp=1,ep=1,dp=1"}


def test_expert_parallel_moe_counts_active_parameters_once_per_token(tmp_path: Path) -> None:
    """EP=2: the FLOPs credited to the two ranks add up exactly to the FLOPs FlopCounterMode saw them
    do (dense part on their own tokens, experts on whatever tokens were routed to them), i.e. the
    active parameters once per token: not divided by EP, not counted again on each expert's rank."""
    out = tmp_path / "out"
    out.mkdir()
    steps = 20
    train = _torchrun(
        "parallel_ep_train.py", 2, [str(tmp_path), str(out), str(steps)], tmp_path / "train.log"
    )
    try:
        assert train.wait(timeout=180) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        _stop(train)
    ranks = _ranks(out, 2)
    credited_per_step = sum(r["model_flops"] for r in ranks) / steps
    measured_per_step = sum(r["measured_model_flops"] for r in ranks)
    assert credited_per_step == measured_per_step  # exact: no attention, every matmul counted by both
    assert ranks[0]["measured_model_flops"] != ranks[1]["measured_model_flops"]  # routing is uneven
    assert all(r["layout"] == "tp=1,pp=1,cp=1,ep=2,dp=2" for r in ranks)
    assert sum(r["tokens"] for r in ranks) == 2 * steps * 4 * 16


def test_lightning_model_parallel_strategy_layout_is_read_from_its_mesh(tmp_path: Path) -> None:
    """Lightning's ModelParallelStrategy with tensor parallelism over 2 ranks: the callback gets no
    layout, reads it from the strategy's DeviceMesh, and the two TP ranks together count each batch
    once."""
    pytest.importorskip("lightning")
    out = tmp_path / "out"
    out.mkdir()
    steps = 12
    train = _torchrun("parallel_lightning_train.py", 2, [str(out), str(steps)], tmp_path / "train.log")
    try:
        assert train.wait(timeout=240) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        _stop(train)
    ranks = _ranks(out, 2)
    batch_tokens, fpt = ranks[0]["batch_tokens"], ranks[0]["flops_per_token"]
    assert sum(r["tokens"] for r in ranks) == steps * batch_tokens
    assert sum(r["model_flops"] for r in ranks) == pytest.approx(steps * batch_tokens * fpt)
    assert [(r["layout"], r["source"]) for r in ranks] == [("tp=2,pp=1,cp=1,ep=1,dp=1", "mesh")] * 2
