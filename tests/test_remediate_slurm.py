"""The Slurm backend against a real Slurm cluster on loopback (munged, slurmctld, four slurmd).

Every command is the one a Slurm admin types; the assertions read Slurm's own answers (sinfo,
scontrol show job). One cluster serves the module; each test cleans its nodes and jobs up.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.remediate.audit import AuditLog
from babysitter.remediate.backends.slurm import SlurmBackend
from babysitter.remediate.engine import REASON_PREFIX, Remediator
from babysitter.remediate.policy import SlurmOptions, parse_policy
from babysitter.remediate.server import WebhookServer
from proc_helpers import find
from remediate_helpers import SlurmCluster, alert, payload

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

NODES = ("n1", "n2", "n3", "n4")
TOKEN = "s3cret-token-0123456789"  # noqa: S105 - a test token


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with SlurmCluster(
        tmp_path_factory.mktemp("slurm"), NODES, weights={"n1": 1, "n2": 2, "n3": 3, "n4": 4}
    ) as c:
        yield c


@pytest.fixture
def cluster(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The module's cluster, every node back in service and no job left after the test."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    yield slurm
    slurm.run("scancel", "--full", "-u", "root", check=False)
    for node in NODES:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        slurm.run("scontrol", "update", f"NodeName={node}", "Comment=", check=False)
    slurm.wait_idle()


def submit(cluster: SlurmCluster, tmp: Path, *extra: str, name: str = "train") -> str:
    script = tmp / f"{name}.sh"
    script.write_text(
        f"#!/bin/sh\necho start $SLURM_JOB_ID $SLURMD_NODENAME >> {tmp}/{name}.log\nsleep 300\n"
    )
    out = cluster.run("sbatch", "--parsable", "-J", name, "-o", str(tmp / "out-%j.txt"), *extra, str(script))
    return out.stdout.strip().split(";")[0]


def wait_for(what: str, check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout} s")
        time.sleep(0.3)


def test_drain_undrain_only_ours(cluster: SlurmCluster) -> None:
    """drain shows in sinfo with its reason; undrain resumes our drain and refuses an operator's."""
    backend = SlurmBackend(SlurmOptions())
    assert backend.node_count() == 4
    assert backend.partitions_of("n2") == ["gpu"]
    out = backend.drain("n2", REASON_PREFIX + "Xid 79 on GPU 3", dry_run=False)
    assert out.ok, out.detail
    assert out.steps[0].argv[1:] == (
        "update",
        "NodeName=n2",
        "State=DRAIN",
        "Reason=babysitter: Xid 79 on GPU 3",
    )
    assert cluster.states()["n2"].startswith("drain")
    assert cluster.reason("n2") == "babysitter: Xid 79 on GPU 3"
    assert backend.undrain("n2", REASON_PREFIX, dry_run=False).ok
    wait_for("n2 idle", lambda: cluster.states()["n2"] == "idle")

    cluster.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=fan replaced, burn-in")
    refused = backend.undrain("n3", REASON_PREFIX, dry_run=False)
    assert refused.refused == "not_ours" and not refused.steps
    assert cluster.states()["n3"].startswith("drain")

    planned = backend.drain("n4", REASON_PREFIX + "dry", dry_run=True)
    assert planned.ok and planned.steps[0].ok is None
    assert cluster.states()["n4"] == "idle"

    failed = backend.drain("nope", REASON_PREFIX + "x", dry_run=False)
    assert not failed.ok and "Invalid node name" in failed.detail


def test_requeue_runs_the_job_again_elsewhere(cluster: SlurmCluster, tmp_path: Path) -> None:
    """A job on a drained node, requeued, keeps its id and starts again on another node."""
    backend = SlurmBackend(SlurmOptions())
    job = submit(cluster, tmp_path, "--requeue")
    wait_for("job running", lambda: cluster.job(job).get("JobState") == "RUNNING")
    assert cluster.job(job)["NodeList"] == "n1"
    assert backend.jobs_on("n1") == [job]
    assert backend.running([job, "999999"], "n1") == [job]
    assert backend.running([job], "n2") == []
    assert backend.drain("n1", REASON_PREFIX + "test", dry_run=False).ok
    out = backend.requeue(job, "x", dry_run=False)
    assert out.ok, out.detail
    assert out.steps[0].argv[1:] == ("requeue", job)
    wait_for(
        "job restarted",
        lambda: cluster.job(job).get("JobState") == "RUNNING" and cluster.job(job).get("Restarts") == "1",
    )
    assert cluster.job(job)["NodeList"] == "n2"
    log = tmp_path / "train.log"

    def starts() -> list[str]:
        return [line.split()[-1] for line in log.read_text().splitlines() if line]

    # slurmctld says RUNNING when it hands the job to n2's slurmd, before the script has run there
    # (a CI run read the log in between).
    wait_for("the script started again", lambda: len(starts()) >= 2)
    assert starts() == ["n1", "n2"]


def test_resubmit_for_jobs_that_cannot_be_requeued(cluster: SlurmCluster, tmp_path: Path) -> None:
    """--no-requeue jobs: scancel + sbatch of the job's own script, name and partition kept."""
    backend = SlurmBackend(SlurmOptions(requeue="resubmit"))
    job = submit(cluster, tmp_path, "--no-requeue", name="norequeue")
    wait_for("job running", lambda: cluster.job(job).get("JobState") == "RUNNING")
    plain = SlurmBackend(SlurmOptions()).requeue(job, "x", dry_run=False)
    assert not plain.ok  # Slurm refuses to requeue it
    out = backend.requeue(job, "x", dry_run=False)
    assert out.ok, out.detail
    assert [s.what for s in out.steps] == ["save batch script", "cancel", "resubmit"]
    new = out.steps[-1].output.strip().split(";")[0]
    assert new != job
    wait_for("resubmitted job running", lambda: cluster.job(new).get("JobState") == "RUNNING")
    assert cluster.job(new)["JobName"] == "norequeue" and cluster.job(new)["Partition"] == "gpu"
    wait_for("old job cancelled", lambda: cluster.job(job).get("JobState") in ("CANCELLED", None))
    wait_for("script ran again", lambda: len((tmp_path / "norequeue.log").read_text().splitlines()) == 2)


def test_annotate_sets_the_node_comment(cluster: SlurmCluster) -> None:
    """annotate: the node's Comment, nothing else changes."""
    backend = SlurmBackend(SlurmOptions())
    assert backend.annotate_host("n4", REASON_PREFIX + "GPU 2 throttled", dry_run=False).ok
    out = cluster.run("scontrol", "-o", "show", "node", "n4").stdout
    assert "Comment=babysitter: GPU 2 throttled" in out
    assert cluster.states()["n4"] == "idle"


def test_webhook_storm_drains_within_the_cap(cluster: SlurmCluster, tmp_path: Path) -> None:
    """200 alerts about the four nodes, POSTed to the webhook with the token: one node is drained (cap 25%),
    its job requeued once; the rest is refused and audited; a bad token changes nothing."""
    policy = parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(tmp_path / "audit.jsonl"),
            "rails": {
                "rate_limit": {"actions": 20, "window": "10m"},
                "drain_cap": {"fraction": 0.25, "window": "1h"},
            },
            "rules": [
                {
                    "match": {"alertname": "GpuDown"},
                    "actions": ["drain", "requeue"],
                    "reason": "GPU {gpu} down",
                }
            ],
        }
    )
    job = submit(cluster, tmp_path, "--requeue")
    wait_for("job running", lambda: cluster.job(job).get("JobState") == "RUNNING")
    remediator = Remediator(policy, SlurmBackend(policy.slurm), AuditLog(policy.audit_log))
    server = WebhookServer(remediator, "127.0.0.1", 0, token=TOKEN).start()
    try:

        def post(body: object, token: str) -> int:
            request = urllib.request.Request(  # noqa: S310
                server.url,
                data=json.dumps(body).encode(),
                method="POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        assert post(payload(alert("GpuDown", instance="n2:9400", gpu="0")), "wrong-token") == 401
        for i in range(50):
            group = [alert("GpuDown", instance=f"{n}:9400", gpu=str(i % 8), starts=1.7e9 + i) for n in NODES]
            assert post(payload(*group), TOKEN) == 200
            if i == 0:
                assert server.wait_idle(60)
        assert server.wait_idle(120)
    finally:
        server.close()
    states = cluster.states()
    assert [n for n, s in states.items() if s.startswith("drain")] == ["n1"], states
    assert cluster.reason("n1").startswith("babysitter: GPU 0 down")
    wait_for("job requeued", lambda: cluster.job(job).get("Restarts") == "1")
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    acted = [(r["action"], r["result"]) for r in records if r["event"] == "action"]
    assert acted == [("drain", "ok"), ("requeue", "ok")]
    refused = {r["reason"] for r in records if r["event"] == "refused"}
    assert refused <= {"drain_cap", "no_target"} and "drain_cap" in refused
    assert remediator.refusals[("drain", "drain_cap")] >= 3
    assert server.notifications["unauthorized"] == 1 and server.notifications["accepted"] == 50


def test_a_stopped_cluster_leaves_no_process_behind(tmp_path: Path) -> None:
    """Issue 32: a job still running when the cluster stops left its slurmstepd behind (retrying
    its job-complete message to daemons that were gone, deaf to SIGTERM, 13 minutes after the
    suite). Once the cluster is stopped, nothing that carries its SLURM_CONF is left: no daemon,
    job step or job process."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import time; time.sleep(300)'\n")
    with SlurmCluster(tmp_path / "slurm", ("n1",)) as slurm:
        job = slurm.run("sbatch", "--parsable", "-o", str(tmp_path / "out-%j"), str(script)).stdout.strip()
        wait_for("job running", lambda: slurm.job(job).get("JobState") == "RUNNING")
        conf = {"SLURM_CONF": str(slurm.conf)}

        def step_and_job() -> bool:
            names = [p.name for p in find(conf)]
            return "slurmstepd" in names and any(n.startswith("python") for n in names)

        wait_for("its job step and job process", step_and_job)
    assert find(conf) == []
