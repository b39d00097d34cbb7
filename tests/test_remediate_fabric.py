"""``babysitter remediate`` drains on the fabric's and the host's critical alerts through the existing rails:
the shipped example policy has a rule for each, and a remediator over it drains the alert's host, with a
reason naming the port or the PCI address. The hard GPU faults' alerts have a drain rule too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from babysitter.generate.alerts import alerts
from babysitter.generate.alerts.gpu import FATAL
from babysitter.generate.config import GenerateConfig
from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.policy import Jobs, load_policy
from remediate_helpers import RecordingBackend, alert, payload

REPO = Path(__file__).resolve().parents[1]
#: The critical alerts of the fabric and host groups, with the labels their promtool test fires with.
CRITICAL = [
    a for a in alerts(GenerateConfig()) if a.component in ("fabric", "host") and a.severity == "critical"
]


def test_every_critical_fabric_and_host_alert_has_a_drain_rule() -> None:
    policy = load_policy(REPO / "exporters/remediate-policy.example.yaml")
    assert {a.name for a in CRITICAL} == {
        "InfinibandPortDown",
        "InfinibandLinkDowned",
        "FabricPortFlapping",
        "InfinibandLinkIntegrityErrors",
        "PcieAerFatal",
        "HostMemoryUncorrectableError",
    }
    for a in CRITICAL:
        assert a.test is not None
        rule = policy.rule_for({"alertname": a.name, **a.test.fire_labels[0]})
        assert rule is not None and "drain" in rule.actions, a.name
    # Warnings never drain.
    assert policy.rule_for({"alertname": "PcieLinkDowntrained", "instance": "n1:9400"}) is None


def test_every_hard_gpu_fault_alert_has_a_drain_rule() -> None:
    """Xid 79 and the other critical Xids, Xid 48's double-bit ECC error, a failed row remap: the GPU
    needs a reset (or an RMA) before new work, so the example policy takes its host out. Before, the
    campaign's Xid 48 got no drain (benchmarks/results/campaign-check-seed3.md: "partial")."""
    policy = load_policy(REPO / "exporters/remediate-policy.example.yaml")
    hard = [a for a in alerts(GenerateConfig()) if a.name in FATAL]
    assert {a.name for a in hard} == set(FATAL)
    for a in hard:
        assert a.test is not None
        for labels in a.test.fire_labels:
            rule = policy.rule_for({"alertname": a.name, **labels})
            assert rule is not None and "drain" in rule.actions, (a.name, labels)
    assert policy.rule_for(
        {"alertname": "GpuEccUncorrectable", "instance": "n1:9400", "gpu": "0"}
    ).actions == (  # type: ignore[union-attr]
        "drain",
        "requeue",
    )


@pytest.mark.parametrize("fired", CRITICAL, ids=lambda a: a.name)
def test_the_remediator_drains_the_alerts_host(tmp_path: Path, fired: object) -> None:
    policy = load_policy(REPO / "exporters/remediate-policy.example.yaml")
    # Acting (not the example's dry run) for the test's cluster, jobs from the scheduler alone (no
    # Prometheus here); the rails (rate limit, drain cap, allowed partitions) are the example's.
    policy = dataclasses.replace(
        policy, dry_run=False, cluster="c1", jobs=Jobs(), audit_log=tmp_path / "audit.jsonl"
    )
    backend = RecordingBackend([f"n{i}" for i in range(1, 41)], jobs={"n1": ["4242"]})
    rem = Remediator(policy, backend, AuditLog(tmp_path / "audit.jsonl"), clock=lambda: 1_700_000_100.0)
    labels = fired.test.fire_labels[0]  # type: ignore[attr-defined]
    rem.handle(parse_notification(payload(alert(fired.name, **labels))))  # type: ignore[attr-defined]
    assert ("drain", "n1", False) in backend.calls
    assert ("requeue", "4242", False) in backend.calls
    reason = backend.drained["n1"]
    assert any(labels[key] in reason for key in ("device", "pci_address", "controller") if key in labels), (
        reason
    )
