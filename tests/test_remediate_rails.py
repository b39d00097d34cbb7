"""The safety rails under alert storms: hundreds of alerts, duplicates, flapping, restarts.

The scheduler here is an in-memory recording backend (the rails are the remediator's own logic; the
real Slurm and Kubernetes backends have their own tests): every property is about which commands the
remediator issues, when, and what it writes in its audit log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.policy import parse_policy
from remediate_helpers import RecordingBackend, alert, payload

T0 = 1_700_000_000.0
NODES = [f"n{i}" for i in range(40)]


class Clock:
    """A settable clock."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def policy(tmp: Path, **rails: Any) -> Any:
    rate = rails.get("rate", {"actions": 1000, "window": "10m"})
    cap = rails.get("cap", {"fraction": 0.1, "window": "1h"})
    return parse_policy(
        {
            "backend": "slurm",
            "audit_log": str(tmp / "audit.jsonl"),
            "rails": {"rate_limit": rate, "drain_cap": cap},
            "allow": rails.get("allow", {}),
            "rules": [
                {
                    "name": "down",
                    "match": {"alertname": "GpuDown"},
                    "actions": ["drain", "requeue"],
                    "reason": "GPU {gpu} down",
                    "undrain_on_resolve": True,
                },
                {"name": "xid", "match": {"alertname": "GpuXidCritical"}, "actions": ["drain"]},
                {
                    "name": "stalled",
                    "match": {"alertname": "TrainingStalled"},
                    "actions": ["requeue"],
                    "firing_for": "10m",
                },
                {"name": "hot", "match": {"alertname": "GpuThrottled"}, "actions": ["annotate"]},
            ],
        }
    )


def make(tmp: Path, backend: RecordingBackend, clock: Clock, **rails: Any) -> Remediator:
    return Remediator(policy(tmp, **rails), backend, AuditLog(tmp / "audit.jsonl"), clock=clock)


def audit(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]


def send(rem: Remediator, *alerts: dict[str, Any]) -> None:
    rem.handle(parse_notification(payload(*alerts)))


def down(host: str, gpu: str = "0", starts: float = T0, status: str = "firing") -> dict[str, Any]:
    return alert("GpuDown", status=status, starts=starts, instance=f"{host}:9400", gpu=gpu, cluster="c1")


# ------------------------------------------------------------------------------------------ storms


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    hosts=st.lists(st.sampled_from(NODES), min_size=50, max_size=300),
    step=st.floats(min_value=0.0, max_value=120.0),
)
def test_storm_never_drains_more_than_the_cap(tmp_path_factory: Any, hosts: list[str], step: float) -> None:
    """Hundreds of GpuDown alerts over many hosts: distinct hosts drained within any window stay within the cap."""
    tmp = tmp_path_factory.mktemp("storm")
    clock = Clock()
    backend = RecordingBackend(NODES)
    rem = make(tmp, backend, clock, cap={"fraction": 0.1, "window": "1h"})
    for i, host in enumerate(hosts):
        clock.t = T0 + i * step
        send(rem, down(host, gpu=str(i % 8), starts=clock.t))
    drains = [
        (t, target)
        for (what, target, _), t in zip(backend.calls, _times(tmp), strict=True)
        if what == "drain"
    ]
    for t, _ in drains:
        inside = {target for u, target in drains if t - 3600 < u <= t}
        assert len(inside) <= 4, (t, inside)  # 10% of 40 nodes
    refused = [r for r in audit(tmp) if r["event"] == "refused" and r["reason"] == "drain_cap"]
    distinct = set(hosts)
    if step == 0 and len(distinct) > 4:
        assert refused, "a storm over more hosts than the cap allows must hit the cap"
        assert rem.refusals[("drain", "drain_cap")] == len(refused)


def _times(tmp: Path) -> list[float]:
    """Time of each backend call, from the audit log (one action record per call)."""
    return [r["t"] for r in audit(tmp) if r["event"] == "action" and r["result"] != "refused"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(min_value=30, max_value=200), limit=st.integers(min_value=1, max_value=10))
def test_rate_limit_holds_in_every_window(tmp_path_factory: Any, n: int, limit: int) -> None:
    """Alerts arriving every 7 s: at most ``limit`` disruptive commands within any 60 s window."""
    tmp = tmp_path_factory.mktemp("rate")
    clock = Clock()
    backend = RecordingBackend(NODES, jobs={h: [str(100 + i)] for i, h in enumerate(NODES)})
    rem = make(
        tmp, backend, clock, rate={"actions": limit, "window": "60s"}, cap={"fraction": 0.9, "window": "1h"}
    )
    for i in range(n):
        clock.t = T0 + 7 * i
        send(rem, down(NODES[i % len(NODES)], starts=clock.t))
    acted = [r["t"] for r in audit(tmp) if r["event"] == "action"]
    for t in acted:
        assert sum(1 for u in acted if t - 60 < u <= t) <= limit
    assert rem.refusals[("drain", "rate_limit")] + rem.refusals[("requeue", "rate_limit")] > 0


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    repeats=st.integers(min_value=2, max_value=50),
    hosts=st.lists(st.sampled_from(NODES[:4]), min_size=1, max_size=4, unique=True),
)
def test_the_same_group_twice_drains_once(tmp_path_factory: Any, repeats: int, hosts: list[str]) -> None:
    """Alertmanager re-sends a group's alerts in every notification: each host is drained and requeued once."""
    tmp = tmp_path_factory.mktemp("dupes")
    clock = Clock()
    backend = RecordingBackend(NODES, jobs={h: [f"{i + 1}"] for i, h in enumerate(NODES)})
    rem = make(tmp, backend, clock, cap={"fraction": 0.5, "window": "1h"})
    group = [down(h) for h in hosts]
    for i in range(repeats):
        clock.t = T0 + 30 * i
        send(rem, *group)
    assert sorted(t for w, t, _ in backend.calls if w == "drain") == sorted(hosts)
    assert len([c for c in backend.calls if c[0] == "requeue"]) == len(hosts)


def test_two_alerts_for_one_job_requeue_it_once(tmp_path: Path) -> None:
    """GpuDown on two GPUs of one host: the host's job is requeued for the first only (cooldown)."""
    clock = Clock()
    backend = RecordingBackend(NODES, jobs={"n1": ["77"]})
    rem = make(tmp_path, backend, clock)
    send(rem, down("n1", gpu="0"), down("n1", gpu="1"))
    assert [c for c in backend.calls if c[0] == "requeue"] == [("requeue", "77", False)]
    assert any(r["event"] == "skipped" and r["job"] == "77" for r in audit(tmp_path))


# ------------------------------------------------------------------------------------------ flapping


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flips=st.lists(
        st.tuples(st.sampled_from(["down0", "down1", "xid"]), st.booleans()), min_size=1, max_size=60
    )
)
def test_flapping_undrains_only_what_no_alert_holds(
    tmp_path_factory: Any, flips: list[tuple[str, bool]]
) -> None:
    """Alerts on one host flap; an undrain happens only when every alert that drained it resolved and
    none of them was an alert whose rule never undrains (Xid)."""
    tmp = tmp_path_factory.mktemp("flap")
    clock = Clock()
    backend = RecordingBackend(NODES)
    rem = make(tmp, backend, clock, cap={"fraction": 0.5, "window": "1h"})
    episode = {"down0": 0, "down1": 0, "xid": 0}
    firing: dict[str, bool] = dict.fromkeys(episode, False)
    pinned = False
    for i, (name, fire) in enumerate(flips):
        clock.t = T0 + 10 * i
        if fire and not firing[name]:
            episode[name] += 1  # a new firing episode starts now
        starts = T0 + 1000 * episode[name] + {"down0": 0, "down1": 1, "xid": 2}[name]
        status = "firing" if fire else "resolved"
        if name == "xid":
            item = alert(
                "GpuXidCritical", status=status, starts=starts, instance="n1:9400", gpu="0", xid="79"
            )
        else:
            item = down("n1", gpu=name[-1], starts=starts, status=status)
        if fire or firing[name]:
            if fire and name == "xid":
                pinned = True
            firing[name] = fire
            before = len(backend.calls)
            send(rem, item)
            undrained = [c for c in backend.calls[before:] if c[0] == "undrain"]
            if undrained:
                assert not pinned, "a host an Xid drained must stay drained"
                assert not any(firing.values()), f"undrained while {firing} still fire"


# ------------------------------------------------------------------------------------------ other rails


def test_restart_remembers_actions_and_rails(tmp_path: Path) -> None:
    """A restarted remediator reads its audit log: the same alerts are not acted on again, the cap holds."""
    clock = Clock()
    backend = RecordingBackend(NODES)
    rem = make(tmp_path, backend, clock, cap={"fraction": 0.05, "window": "1h"})  # 2 of 40
    send(rem, down("n1"), down("n2"))
    assert len([c for c in backend.calls if c[0] == "drain"]) == 2
    rem.audit.close()
    clock.t += 60
    again = make(tmp_path, backend, clock, cap={"fraction": 0.05, "window": "1h"})
    send(again, down("n1"), down("n2"), down("n3"))
    assert len([c for c in backend.calls if c[0] == "drain"]) == 2
    assert again.refusals[("drain", "drain_cap")] == 1
    clock.t += 3600
    send(again, down("n3", starts=clock.t))
    assert backend.calls[-1] == ("drain", "n3", False)


def test_missing_labels_and_allow_list_refuse(tmp_path: Path) -> None:
    """No host label: refused as missing_labels; a host off the allow-list: not_allowed; nothing runs."""
    clock = Clock()
    backend = RecordingBackend(NODES)
    rem = make(tmp_path, backend, clock, allow={"hosts": ["n1[0-9]"]})
    send(rem, alert("GpuDown", gpu="1"), down("n2"))
    assert backend.calls == []
    reasons = sorted((r["action"], r["reason"]) for r in audit(tmp_path) if r["event"] == "refused")
    assert reasons == [
        ("drain", "missing_labels"),
        ("drain", "not_allowed"),
        ("requeue", "missing_labels"),
        ("requeue", "no_target"),
    ]
    send(rem, down("n12"))
    assert ("drain", "n12", False) in backend.calls


def test_firing_for_defers_until_the_alert_is_old_enough(tmp_path: Path) -> None:
    """TrainingStalled acts only once it has fired for 10 minutes; a resolve before that cancels it."""
    clock = Clock()
    backend = RecordingBackend(NODES, jobs={"n3": ["55"]})
    rem = make(tmp_path, backend, clock)
    stalled = alert("TrainingStalled", starts=T0, run="r1", cluster="c1", slurm_job="55", instance="n3:9400")
    send(rem, stalled)
    rem.tick()
    assert backend.calls == [] and rem.pending == 1
    clock.t = T0 + 599
    rem.tick()
    assert backend.calls == []
    clock.t = T0 + 600
    rem.tick()
    assert backend.calls == [("requeue", "55", False)]
    other = alert("TrainingStalled", starts=T0 + 700, run="r2", cluster="c1", slurm_job="55")
    clock.t = T0 + 710
    send(rem, other)
    send(rem, {**other, "status": "resolved"})
    clock.t = T0 + 2000
    rem.tick()
    assert backend.calls == [("requeue", "55", False)]


def test_dry_run_plans_rehearses_rails_and_runs_nothing(tmp_path: Path) -> None:
    """A dry run audits the plan (result dry_run), counts toward the rails, and never changes the cluster."""
    clock = Clock()
    backend = RecordingBackend(NODES, jobs={"n1": ["9"]})
    rem = Remediator(
        policy(tmp_path), backend, AuditLog(tmp_path / "audit.jsonl"), clock=clock, force_dry_run=True
    )
    send(rem, down("n1"))
    assert backend.calls == [("drain", "n1", True), ("requeue", "9", True)]
    assert backend.drained == {}
    results = [(r["action"], r["result"]) for r in audit(tmp_path) if r["event"] == "action"]
    assert results == [("drain", "dry_run"), ("requeue", "dry_run")]
    assert rem.actions[("drain", "dry_run")] == 1


def test_failed_action_is_audited_counted_and_retried_later(tmp_path: Path) -> None:
    """A failing scheduler command is a failed action (metric + audit) and a later notification retries."""
    clock = Clock()
    backend = RecordingBackend(NODES)
    backend.fail.add("drain")
    rem = make(tmp_path, backend, clock)
    send(rem, down("n5"))
    assert rem.actions[("drain", "failed")] == 1
    backend.fail.clear()
    clock.t += 300
    send(rem, down("n5"))
    assert rem.actions[("drain", "ok")] == 1
    assert [r["result"] for r in audit(tmp_path) if r.get("action") == "drain"] == ["failed", "ok"]


def test_audit_log_is_private_and_append_only(tmp_path: Path) -> None:
    """The audit log is created 0600 and only ever grows."""
    clock = Clock()
    rem = make(tmp_path, RecordingBackend(NODES), clock)
    send(rem, down("n1"))
    path = tmp_path / "audit.jsonl"
    assert path.stat().st_mode & 0o777 == 0o600
    size = path.stat().st_size
    send(rem, down("n2"))
    assert path.read_bytes()[:size] == path.read_bytes()[:size] and path.stat().st_size > size
