"""``hosts_from: culprit``: a stall page's culprit host is drained, never a waiting rank's; off by default.

The alerts here carry what the generated TrainingStalled renders (``culprit_hosts`` and the summary
naming the culprit; ``alerts/tests/TrainingStalled.yaml`` checks that rendering against the rules, and
``tests/test_collectives_e2e.py`` receives it from a real Alertmanager).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.policy import PolicyError, parse_policy
from remediate_helpers import FakeJobMap, RecordingBackend, alert, payload

NODES = ["n1", "n7", "n8", "n9"]
SUMMARY = "Run r7 has not finished a step for 7m 0s; culprit rank 2 on host n7:9400."


def _policy(tmp: Path, **rule: Any) -> Any:
    return parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(tmp / "audit.jsonl"),
            "jobs": {"prometheus_url": "http://127.0.0.1:9"},
            "rails": {
                "rate_limit": {"actions": 10, "window": "10m"},
                "drain_cap": {"fraction": 0.5, "window": "1h"},
            },
            "rules": [
                {"name": "stalled", "match": {"alertname": "TrainingStalled"}, "actions": ["drain"], **rule}
            ],
        }
    )


def _stall(hosts: str, **labels: str) -> dict[str, Any]:
    # The alert also carries a host label of a waiting rank's host: hosts_from culprit must ignore it.
    item = alert("TrainingStalled", cluster="c1", run="r7", instance="n1:9400", **labels)
    item["annotations"] = {"summary": SUMMARY, "culprit_hosts": hosts}
    return item


def _run(
    tmp: Path, item: dict[str, Any], *, dry: bool = True, **rule: Any
) -> tuple[RecordingBackend, list[Any]]:
    backend = RecordingBackend(NODES)
    # Run r7's ranks report from n1, n7 and n8 (ranks that speak for it: generate/ranks.py).
    jobmap = FakeJobMap({"r7": ["n1:9400", "n7:9400", "n8:9400"]})
    remediator = Remediator(
        _policy(tmp, **rule), backend, AuditLog(tmp / "audit.jsonl"), jobmap=jobmap, force_dry_run=dry
    )
    remediator.handle(parse_notification(payload(item)))
    records = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]
    return backend, records


def test_drains_the_culprits_host_and_says_why_in_a_dry_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        backend, records = _run(tmp_path, _stall("n7:9400"), hosts_from="culprit")
    assert backend.calls == [("drain", "n7", True)]  # not n1, the waiting rank's host on the label
    (done,) = [r for r in records if r.get("event") == "action"]
    assert done["action"] == "drain" and done["host"] == "n7" and done["result"] == "dry_run"
    assert done["why"] == f"culprit of the stall: {SUMMARY}"
    lines = [r.getMessage() for r in caplog.records if "drain host=n7" in r.getMessage()]
    assert len(lines) == 1 and "dry_run for TrainingStalled" in lines[0]
    assert "culprit rank 2 on host n7:9400" in lines[0], lines


def test_off_by_default_the_stall_drains_nothing(tmp_path: Path) -> None:
    """Without hosts_from the rule acts on the alert's host label, which a stall page (a run-level
    alert) does not carry: refused (missing_labels), nothing drained, as before this option existed."""
    item = _stall("n7:9400")
    del item["labels"]["instance"]
    backend, records = _run(tmp_path, item)
    assert backend.calls == []
    assert [r["reason"] for r in records if r.get("event") == "refused"] == ["missing_labels"]


@pytest.mark.parametrize(
    ("hosts", "why"),
    [
        ("", "names no culprit host"),
        ("n7:9400,n8:9400", "names 2 culprit hosts (n7, n8), more than 1"),
        ("n[1-9]:9400", "not a valid node name"),
    ],
)
def test_no_single_valid_culprit_means_no_drain(tmp_path: Path, hosts: str, why: str) -> None:
    backend, records = _run(tmp_path, _stall(hosts), hosts_from="culprit")
    assert backend.calls == []
    (refused,) = [r for r in records if r.get("event") == "refused"]
    assert refused["reason"] == "no_target" and why in refused["detail"], refused


def test_two_culprits_when_the_rule_allows_two(tmp_path: Path) -> None:
    backend, _ = _run(tmp_path, _stall("n8:9400, n7:9400,n7:9400"), hosts_from="culprit", max_culprit_hosts=2)
    assert backend.calls == [("drain", "n8", True), ("drain", "n7", True)]  # each once


@pytest.mark.parametrize(
    ("rule", "match"),
    [({"hosts_from": "waiting"}, "hosts_from"), ({"max_culprit_hosts": 2}, "only with hosts_from: culprit")],
)
def test_bad_options_fail_at_load(tmp_path: Path, rule: dict[str, Any], match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        _policy(tmp_path, **rule)
