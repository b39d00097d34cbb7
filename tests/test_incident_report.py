"""``babysitter incidents`` on a campaign's Prometheus: the right nodes, the right counts, and costs that
add up to the ledgers' downtime and lost progress.

The campaign, over two and a half days on two clusters (its alerts and the runs' step counters
backfilled into a real Prometheus with ``promtool tsdb create-blocks-from openmetrics``, its two runs'
ledgers written record by record):

- c1/n1: Xid 79 (GpuXidCritical and GpuDown, 30 s apart: one incident), and a day later an
  uncorrectable ECC error: two incidents, a lemon node. c1/n2: an InfiniBand link down. c1/n3: only a
  TrainingStalled page, which is no hardware incident. c2/m1: an Xid 48.
- Run ``alpha`` (16 GPUs, on n1 and n2) restarts after each of its three hardware incidents and once
  after its own bug; run ``beta`` (8 GPUs, on m1) once after the Xid 48, with the remediator's note.

Known answers: alpha's first restart cost 490 s of downtime and 410 s of lost progress (its steps 61-100
after the checkpoint at step 60, and its 10 s tail) x 16 GPUs = 4.00 GPU-hours, $10.00 at $2.50.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from babysitter.incident.gather import Gatherer, Limits, Target, incident_id
from babysitter.ledger.records import (
    Alive,
    CheckpointBegin,
    CheckpointEnd,
    End,
    Progress,
    Record,
    Start,
    encode,
    fence_tag,
)
from promkit import PrometheusServer

pytestmark = [pytest.mark.prometheus]

US = 1_000_000
STEP = 10  # seconds per step
NODES = {"alpha": ("n1", "n2"), "beta": ("m1",)}


class Ledger:
    """A run's ledger, incarnation by incarnation, in absolute seconds."""

    def __init__(self, run: str, world: int) -> None:
        self.run, self.world = run, world
        self.lines: list[bytes] = []
        self.n = 0
        self.tag: str | None = None

    def _add(self, record: Record) -> None:
        self.lines.append(encode(record, fence=self.tag))

    def incarnation(self, begin: float, end: float, *, host: str, resume: int, save_every: int = 60) -> int:
        """Steps ``resume+1..`` every STEP s from ``begin`` until ``end`` (its last step's end, its last
        sign of life); a save every ``save_every`` steps. Returns the last step saved."""
        self.n += 1
        iid = f"{self.run}{self.n}"
        self.tag = None
        self._add(
            Start(
                t=round(begin * US),
                pst=round(begin * US),
                id=iid,
                host=host,
                pid=self.n,
                run=self.run,
                info={"world_size": self.world},
            )
        )
        self.tag = fence_tag(iid)
        if resume:
            self._add(CheckpointBegin(t=round(begin * US), op="load", step=resume, path=None))
            self._add(
                CheckpointEnd(t=round(begin * US), op="load", step=resume, ok=True, nbytes=None, path=None)
            )
        step, t, saved, batch = resume, begin, resume, []
        while t + STEP <= end:
            step, t = step + 1, t + STEP
            batch.append((step, t))
            if step % save_every == 0 or len(batch) == 400 or t + STEP > end:
                self._add(
                    Progress(
                        t=round(t * US),
                        steps=tuple(s for s, _ in batch),
                        ends=tuple(round(e * US) for _, e in batch),
                        data_wait=0,
                        model_flops=1e15,
                        peak_flops=1e15,
                    )
                )
                batch = []
            if step % save_every == 0:
                self._add(CheckpointBegin(t=round(t * US), op="save", step=step, path=f"/ck/{step}"))
                self._add(
                    CheckpointEnd(
                        t=round(t * US), op="save", step=step, ok=True, nbytes=1, path=f"/ck/{step}"
                    )
                )
                saved = step
        return saved

    def end(self, t: float) -> None:
        """The run finished cleanly (else the ledger would count downtime until now)."""
        self._add(End(t=round(t * US), clean=True))

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "babysitter-ledger.jsonl").write_bytes(b"".join(self.lines))


def _openmetrics(t0: float, episodes: list[tuple[dict[str, str], float, float]], until: float) -> str:
    lines = ["# TYPE ALERTS gauge"]
    for labels, start, end in episodes:
        text = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "alertstate": "firing"}.items()))
        t = start
        while t <= end:
            lines.append(f"ALERTS{{{text}}} 1 {t:.3f}")
            t += 15
    lines.append("# TYPE train_steps_total gauge")
    for run, nodes in NODES.items():
        cluster = "c1" if run == "alpha" else "c2"
        for node in nodes:
            t = t0
            while t <= until:
                lines.append(
                    f'train_steps_total{{cluster="{cluster}",instance="{node}:9400",rank="0",run="{run}"}} 1 {t:.3f}'
                )
                t += 60
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _alert(name: str, cluster: str, node: str, component: str, **labels: str) -> dict[str, str]:
    return {
        "alertname": name,
        "cluster": cluster,
        "instance": f"{node}:9400",
        "component": component,
        **labels,
    }


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("campaign")
    end = float(int(time.time()) - 600)
    t0 = end - 216_000 + 3600  # 2.5 days ago, plus an hour inside the window
    runs = tmp / "runs"
    alpha = Ledger("alpha", 16)
    saved = alpha.incarnation(t0, t0 + 1000, host="n1", resume=0)  # Xid 79 on n1 at t0+1000
    alpha.lines.append(encode(Alive(t=round((t0 + 1010) * US)), fence=alpha.tag))  # a 10 s tail
    saved = alpha.incarnation(t0 + 1500, t0 + 50_010, host="n2", resume=saved)  # IB down on n2 at +50000
    saved = alpha.incarnation(t0 + 50_400, t0 + 70_000, host="n1", resume=saved)  # its own bug at +70000
    saved = alpha.incarnation(t0 + 70_100, t0 + 90_010, host="n1", resume=saved)  # ECC on n1 at +90000
    alpha.incarnation(t0 + 90_300, t0 + 100_000, host="n2", resume=saved)
    alpha.end(t0 + 100_000)
    alpha.write(runs / "alpha")
    beta = Ledger("beta", 8)
    saved = beta.incarnation(t0 + 100, t0 + 20_030, host="m1", resume=0)  # Xid 48 on m1 at +20000
    beta.incarnation(t0 + 20_500, t0 + 40_000, host="m1", resume=saved)
    beta.end(t0 + 40_000)
    beta.write(runs / "beta")
    note = {
        "v": 1,
        "t": t0 + 20_400,
        "run": "beta",
        "action": "requeue",
        "job": "42",
        "host": "m1",
        "drained": "m1",
        "alert": "GpuXidCritical",
        "cause": "remediated: drained host m1 after Xid 48, requeued job 42",
        "alert_start": t0 + 20_000,
    }
    (runs / "beta" / "remediations.jsonl").write_text(json.dumps(note) + "\n")
    # The remediator's bundle of the Xid 79 page, in alpha's run directory.
    page = {"name": "GpuXidCritical", "labels": {"alertname": "GpuXidCritical", "instance": "n1:9400"}}
    [bundle] = Gatherer(Limits(wait=0.5)).gather(
        [Target(runs / "alpha", "alpha")],
        incident=incident_id(t0 + 1000, "00000000000000e5"),
        alert={**page, "starts_at": t0 + 1000},
    )
    episodes = [
        (
            _alert("GpuXidCritical", "c1", "n1", "gpu", gpu="1", xid="79", action="reboot"),
            t0 + 1000,
            t0 + 1300,
        ),
        (_alert("GpuDown", "c1", "n1", "gpu", gpu="1"), t0 + 1030, t0 + 1400),
        (
            _alert("InfinibandLinkDowned", "c1", "n2", "fabric", device="mlx5_0", port="1"),
            t0 + 50_000,
            t0 + 50_200,
        ),
        (_alert("TrainingStalled", "c1", "n3", "training", run="alpha"), t0 + 60_000, t0 + 60_300),
        (
            _alert("GpuXidCritical", "c2", "m1", "gpu", gpu="3", xid="48", action="reboot"),
            t0 + 20_000,
            t0 + 20_100,
        ),
        (_alert("GpuEccUncorrectable", "c1", "n1", "gpu", gpu="5"), t0 + 90_000, t0 + 90_400),
    ]
    source = tmp / "campaign.om"
    source.write_text(_openmetrics(t0, episodes, t0 + 100_000))
    data = tmp / "prom-data"
    done = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with PrometheusServer(tmp) as prom:
        yield {"prom": prom, "runs": runs, "t0": t0, "end": end, "bundle": bundle}


def _report(campaign: Any, fmt: str) -> str:
    args = [sys.executable, "-m", "babysitter", "incidents", "--prometheus", campaign["prom"].url]
    args += ["--window", "2d12h", "--end", str(campaign["end"]), "--run-dirs", str(campaign["runs"] / "*")]
    args += ["--price", "c1=2.5", "--price", "c2=3", "--format", fmt]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _ledger_badput(run_dir: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "babysitter", "report", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)["badput_seconds"]


def test_the_right_nodes_the_right_counts_and_costs_that_add_up(campaign: Any) -> None:
    report = json.loads(_report(campaign, "json"))
    t0 = campaign["t0"]
    incidents = report["incidents"]
    by_node = {}
    for item in incidents:
        by_node.setdefault((item["cluster"], item["node"]), []).append(item)
    assert {k: len(v) for k, v in by_node.items()} == {
        ("c1", "n1:9400"): 2,
        ("c1", "n2:9400"): 1,
        ("c2", "m1:9400"): 1,
    }
    assert report["lemon_nodes"] == [{"cluster": "c1", "node": "n1:9400"}]
    xid = by_node[("c1", "n1:9400")][0]
    assert xid["kinds"] == ["GpuXidCritical", "GpuDown"] and abs(xid["start"] - (t0 + 1000)) <= 30
    assert "GpuXidCritical (gpu=1, xid=79, action=reboot)" in xid["evidence"]
    assert xid["bundles"] == [str(campaign["bundle"].path)]
    # The known answer: 490 s down + 410 s recomputed, 16 GPUs.
    [restart] = xid["restarts"]
    assert restart["run"] == "alpha" and restart["index"] == 1
    assert restart["downtime_seconds"] == pytest.approx(490) and restart[
        "lost_progress_seconds"
    ] == pytest.approx(410)
    assert xid["gpu_hours"] == pytest.approx(4.0) and xid["cost"] == pytest.approx(10.0)
    beta = by_node[("c2", "m1:9400")][0]
    assert [r["run"] for r in beta["restarts"]] == ["beta"] and beta["price_per_gpu_hour"] == 3
    # alpha's own bug is not billed to the provider.
    assert [(r["run"], r["index"]) for r in report["restarts_without_hardware_incident"]] == [("alpha", 3)]
    # Per run, what the incidents cost plus what nothing explains is the ledger's downtime + lost progress.
    for run in ("alpha", "beta"):
        badput = _ledger_badput(campaign["runs"] / run)
        billed = [r for i in incidents for r in i["restarts"] if r["run"] == run]
        billed += [r for r in report["restarts_without_hardware_incident"] if r["run"] == run]
        total = sum(r["downtime_seconds"] + r["lost_progress_seconds"] for r in billed)
        assert total == pytest.approx(badput["downtime"] + badput["lost_progress"], abs=1e-3), run
    clusters = report["clusters"]
    assert clusters["c1"]["incidents"] == 3 and clusters["c2"]["incidents"] == 1
    c1_hours = sum(i["gpu_hours"] for i in incidents if i["cluster"] == "c1")
    assert clusters["c1"]["gpu_hours"] == pytest.approx(c1_hours)
    assert clusters["c1"]["cost"] == pytest.approx(2.5 * c1_hours)


def test_markdown_and_csv_say_the_same(campaign: Any) -> None:
    rows = list(csv.DictReader(io.StringIO(_report(campaign, "csv"))))
    assert sorted((r["cluster"], r["node"], r["lemon"]) for r in rows) == [
        ("c1", "n1:9400", "yes"),
        ("c1", "n1:9400", "yes"),
        ("c1", "n2:9400", "no"),
        ("c2", "m1:9400", "no"),
    ]
    first = next(r for r in rows if r["kinds"] == "GpuXidCritical GpuDown")
    assert float(first["gpu_hours"]) == pytest.approx(4.0) and first["cost"] == "10.00"
    markdown = _report(campaign, "md")
    assert "## n1:9400 (c1) — **lemon node**" in markdown and "## n3:9400" not in markdown
    assert "| c1 | 3 | 2 |" in markdown and "| alpha | 3 |" in markdown
