"""``hosts_from: culprit`` drains a host only when it holds the stalled run's ranks (issue 31, point 2).

A user on another host who serves a rank of someone else's run made the shipped TrainingStalled name
their own host in ``culprit_hosts`` (the rules no longer do: ``generate/ranks.py``,
``alerts/tests/TrainingStalled.yaml``). The remediator checks each culprit host on its own as well:
it must serve a rank that speaks for the run (the job map in Prometheus) and, where the run's jobs are
known and the scheduler can tell their nodes, be one of them (Slurm's node list of the job, the
pods' nodes on Kubernetes); otherwise the drain is refused (``not_in_run``) with an audit line.
Before this check, each alert below was drained as it named its host.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.backends.slurm import SlurmBackend
from babysitter.remediate.engine import Remediator
from babysitter.remediate.policy import PolicyError, SlurmOptions, parse_policy
from remediate_helpers import FakeJobMap, RecordingBackend, SlurmCluster, alert, payload

NODES = ["n1", "n7", "n8", "n9"]
#: Run r7's ranks report from n1, n7 and n8; n9 is a stranger's host that served a rank of it.
HOLDERS = {"r7": ["n1:9400", "n7:9400", "n8:9400"]}


def _policy(tmp: Path, *, url: bool = True, **rule: Any) -> Any:
    return parse_policy(_policy_doc(tmp, url=url, **rule))


def _policy_doc(tmp: Path, *, url: bool = True, **rule: Any) -> dict[str, Any]:
    return {
        "backend": "slurm",
        "audit_log": str(tmp / "audit.jsonl"),
        **({"jobs": {"prometheus_url": "http://127.0.0.1:9"}} if url else {}),
        "rails": {
            "rate_limit": {"actions": 10, "window": "10m"},
            "drain_cap": {"fraction": 0.5, "window": "1h"},
        },
        "rules": [
            {
                "name": "stalled",
                "match": {"alertname": "TrainingStalled"},
                "actions": ["drain"],
                "hosts_from": "culprit",
                **rule,
            }
        ],
    }


def _stall(hosts: str, **labels: str) -> dict[str, Any]:
    item = alert("TrainingStalled", cluster="c1", run="r7", **labels)
    item["annotations"] = {"summary": "Run r7 has not finished a step for 7m 0s.", "culprit_hosts": hosts}
    return item


def _handle(
    tmp: Path, item: dict[str, Any], backend: Any, jobmap: Any, *, dry: bool = True, **rule: Any
) -> tuple[Remediator, list[dict[str, Any]]]:
    remediator = Remediator(
        _policy(tmp, **rule), backend, AuditLog(tmp / "audit.jsonl"), jobmap=jobmap, force_dry_run=dry
    )
    remediator.handle(parse_notification(payload(item)))
    records = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]
    return remediator, records


def _refused(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["host"], r["reason"], r["detail"]) for r in records if r.get("event") == "refused"]


def test_a_culprit_host_that_holds_none_of_the_runs_ranks_is_not_drained(tmp_path: Path) -> None:
    """culprit_hosts naming n9 (the stranger's host): refused, the audit line says whose ranks are where."""
    backend, jobmap = RecordingBackend(NODES), FakeJobMap(HOLDERS)
    remediator, records = _handle(tmp_path, _stall("n9:9400"), backend, jobmap)
    assert backend.calls == []
    assert _refused(records) == [
        ("n9", "not_in_run", "n9 holds none of run r7's ranks: its ranks report from n1, n7, n8")
    ]
    assert remediator.refusals[("drain", "not_in_run")] == 1
    assert ("instances_of", "r7", ("cluster", "c1")) in jobmap.asked


def test_of_two_culprits_only_the_one_holding_ranks_is_drained(tmp_path: Path) -> None:
    backend = RecordingBackend(NODES)
    _, records = _handle(
        tmp_path, _stall("n7:9400,n9:9400"), backend, FakeJobMap(HOLDERS), max_culprit_hosts=2
    )
    assert backend.calls == [("drain", "n7", True)]
    (done,) = [r for r in records if r.get("event") == "action"]
    assert done["checked"] == "its ranks report from n1, n7, n8"
    assert [(host, reason) for host, reason, _ in _refused(records)] == [("n9", "not_in_run")]


def test_the_schedulers_view_of_the_runs_jobs_must_hold_the_host_too(tmp_path: Path) -> None:
    """The job map gives job 12 for the run's GPUs; the scheduler says job 12 holds n1 and n7. n9, which
    Prometheus counted (stale rules, a race), runs another job: refused. n7 is drained."""
    backend = RecordingBackend(NODES, jobs={"n1": ["12"], "n7": ["12"], "n9": ["99"]})
    jobmap = FakeJobMap({"r7": ["n1:9400", "n7:9400", "n9:9400"]}, jobs={"r7": ["12"]})
    _, records = _handle(tmp_path, _stall("n7:9400,n9:9400"), backend, jobmap, max_culprit_hosts=2)
    assert backend.calls == [("drain", "n7", True)]
    assert _refused(records) == [
        (
            "n9",
            "not_in_run",
            "n9 holds none of run r7's ranks: its ranks report from n1, n7, n9; its jobs 12 (job map) "
            "hold n1, n7",
        )
    ]


def test_a_policy_that_says_not_to_ask_the_scheduler_checks_the_job_map_alone(tmp_path: Path) -> None:
    """``jobs.ask_scheduler: false`` (the campaign's and the demo's dry runs, which have no scheduler
    commands): the job map's hosts decide, the scheduler is never asked; a stranger's host is still
    refused. With the scheduler asked and unable to answer, the drain is refused."""
    backend = RecordingBackend(NODES, jobs={"n1": ["12"]})  # the scheduler would say n7 is not job 12's
    jobmap = FakeJobMap(HOLDERS, jobs={"r7": ["12"]})
    remediator = Remediator(
        parse_policy(
            {
                **_policy_doc(tmp_path),
                "jobs": {"prometheus_url": "http://127.0.0.1:9", "ask_scheduler": False},
            }
        ),
        backend,
        AuditLog(tmp_path / "audit.jsonl"),
        jobmap=jobmap,
        force_dry_run=True,
    )
    remediator.handle(parse_notification(payload(_stall("n7:9400"))))
    remediator.handle(parse_notification(payload(_stall("n9:9400", fingerprint="b"))))
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert backend.calls == [("drain", "n7", True)]
    (done,) = [r for r in records if r.get("event") == "action"]
    assert done["checked"] == (
        "its ranks report from n1, n7, n8 (the scheduler not asked: jobs.ask_scheduler is false)"
    )
    assert [(host, reason) for host, reason, _ in _refused(records)] == [("n9", "not_in_run")]
    # Asked (the default), the same scheduler says job 12 holds n1 only: n7 is refused.
    (tmp_path / "audit.jsonl").unlink()
    _, records = _handle(
        tmp_path, _stall("n7:9400", fingerprint="c"), RecordingBackend(NODES, jobs={"n1": ["12"]}), jobmap
    )
    assert [(host, reason) for host, reason, _ in _refused(records)] == [("n7", "not_in_run")]


def test_a_job_label_on_the_alert_names_the_job_to_check(tmp_path: Path) -> None:
    backend = RecordingBackend(NODES, jobs={"n1": ["12"], "n8": ["12"]})
    _, records = _handle(tmp_path, _stall("n7:9400", hpc_job="12"), backend, FakeJobMap(HOLDERS))
    assert backend.calls == []
    assert _refused(records)[0][2].endswith("its jobs 12 (alert label) hold n1, n8")


@pytest.mark.parametrize(
    ("jobmap", "labels", "why"),
    [
        (None, {}, "no job map (jobs.prometheus_url) to tell which hosts hold run r7's ranks"),
        (FakeJobMap(error="timed out"), {}, "cannot tell which hosts hold run r7's ranks: timed out"),
        (FakeJobMap(HOLDERS), {"run": ""}, "the alert has no run label"),
    ],
)
def test_what_cannot_be_checked_is_not_drained(
    tmp_path: Path, jobmap: Any, labels: dict[str, str], why: str
) -> None:
    backend = RecordingBackend(NODES)
    item = _stall("n7:9400")
    item["labels"].update(labels)
    item["labels"] = {k: v for k, v in item["labels"].items() if v}
    _, records = _handle(tmp_path, item, backend, jobmap)
    assert backend.calls == []
    ((host, reason, detail),) = _refused(records)
    assert (host, reason) == ("n7", "not_in_run") and why in detail, detail


def test_hosts_from_culprit_needs_a_job_map_at_load(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"rules\[0\].hosts_from: culprit needs jobs.prometheus_url"):
        _policy(tmp_path, url=False)


@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_drains_a_node_of_the_job_and_refuses_one_outside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Slurm cluster: the run's job holds n1 and n2 (``squeue -j``, ``scontrol show hostnames``).
    The job map is fooled into counting n3 too; a stall naming n3 is refused and n3 stays in service,
    one naming n2 drains it for real."""
    nodes = ("n1", "n2", "n3", "n4")
    with SlurmCluster(tmp_path / "slurm", nodes, weights={"n1": 1, "n2": 2, "n3": 3, "n4": 4}) as cluster:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        script = tmp_path / "train.sh"
        script.write_text("#!/bin/sh\nsleep 300\n")
        out = cluster.run("sbatch", "--parsable", "-N", "2", "-o", str(tmp_path / "out-%j.txt"), str(script))
        job = out.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 60
        while cluster.job(job).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline, cluster.job(job)
            time.sleep(0.3)
        backend = SlurmBackend(SlurmOptions())
        assert backend.nodes_of([job]) == ["n1", "n2"]
        jobmap = FakeJobMap({"r7": ["n1:9400", "n2:9400", "n3:9400"]}, jobs={"r7": [job]})
        _, records = _handle(tmp_path, _stall("n3:9400"), backend, jobmap, dry=False)
        assert _refused(records) == [
            (
                "n3",
                "not_in_run",
                f"n3 holds none of run r7's ranks: its ranks report from n1, n2, n3; its jobs {job} "
                "(job map) hold n1, n2",
            )
        ]
        assert cluster.states()["n3"] == "idle"
        (tmp_path / "audit.jsonl").unlink()
        _, records = _handle(tmp_path, _stall("n2:9400", fingerprint="b"), backend, jobmap, dry=False)
        (done,) = [r for r in records if r.get("event") == "action"]
        assert (done["host"], done["result"]) == ("n2", "ok"), done
        assert cluster.states()["n2"] in ("drng", "drain")  # draining while the job runs on
        assert cluster.reason("n2").startswith("babysitter: ")
