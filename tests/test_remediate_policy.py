"""The policy file: every mistake is an error at start that names its place; the examples load."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from babysitter.remediate.alerts import PayloadError, parse_notification, parse_time
from babysitter.remediate.policy import PolicyError, load_policy, parse_policy
from babysitter.remediate.targets import host_of, render_reason, valid_host, valid_job
from remediate_helpers import alert, payload

REPO = Path(__file__).resolve().parents[1]


def minimal(**over: Any) -> dict[str, Any]:
    """A valid policy dict with overrides."""
    data: dict[str, Any] = {
        "backend": "slurm",
        "audit_log": "/tmp/audit.jsonl",
        "rails": {
            "rate_limit": {"actions": 5, "window": "10m"},
            "drain_cap": {"fraction": 0.1, "window": "1h"},
        },
        "rules": [{"match": {"alertname": "GpuDown"}, "actions": ["drain"]}],
    }
    data.update(over)
    return data


def test_example_policy_loads_and_check_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped example is valid, and --check describes every rule."""
    from babysitter.cli import main

    policy = load_policy(REPO / "exporters/remediate-policy.example.yaml")
    assert policy.backend == "slurm" and policy.dry_run
    assert [r.name for r in policy.rules][:2] == ["xid-drain-requeue", "gpu-down"]
    assert (
        main(["remediate", "--policy", str(REPO / "exporters/remediate-policy.example.yaml"), "--check"]) == 0
    )
    out = capsys.readouterr().out
    assert (
        "rule stalled: alertname=~TrainingStalled -> drain + requeue, after 120 s firing, dry run, "
        "on the culprit's host (at most 1; never a waiting rank's)" in out
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"backend": "pbs"}, "backend: 'pbs' is not one of slurm, kubernetes, script"),
        ({"rails": {"drain_cap": {"fraction": 0.1, "window": "1h"}}}, "rails.rate_limit: required"),
        ({"rails": {"rate_limit": {"actions": 5, "window": "10m"}}}, "rails.drain_cap: required"),
        (
            {
                "rails": {
                    "rate_limit": {"actions": 5, "window": "10m"},
                    "drain_cap": {"fraction": 1.5, "window": "1h"},
                }
            },
            "rails.drain_cap.fraction: expected a number strictly between 0 and 1",
        ),
        (
            {
                "rails": {
                    "rate_limit": {"actions": 0, "window": "10m"},
                    "drain_cap": {"fraction": 0.1, "window": "1h"},
                }
            },
            "rails.rate_limit.actions: expected an integer >= 1",
        ),
        (
            {
                "rails": {
                    "rate_limit": {"actions": 5, "window": "soon"},
                    "drain_cap": {"fraction": 0.1, "window": "1h"},
                }
            },
            "rails.rate_limit.window: not a duration",
        ),
        (
            {"rules": [{"match": {"alertname": "X"}, "actions": ["drian"]}]},
            "rules[0].actions[0]: unknown action 'drian'",
        ),
        (
            {"rules": [{"match": {"severity": "critical"}, "actions": ["drain"]}]},
            "rules[0].match: must match alertname",
        ),
        (
            {"rules": [{"match": {"alertname": "(("}, "actions": ["drain"]}]},
            "rules[0].match.alertname: bad regular",
        ),
        (
            {"rules": [{"match": {"alertname": "X"}, "actions": ["requeue"], "undrain_on_resolve": True}]},
            "rules[0].undrain_on_resolve: the rule does not drain",
        ),
        (
            {"rules": [{"match": {"alertname": "X"}, "actions": ["drain"], "reason": "{bad-field}"}]},
            "rules[0].reason: {bad-field} is not a label name",
        ),
        (
            {"rules": [{"match": {"alertname": "X"}, "actions": ["drain"], "colour": "red"}]},
            "rules[0]: unknown key(s) colour",
        ),
        ({"rules": []}, "rules: required"),
        ({"hosts": {"pattern": "[^:]+"}}, "hosts.pattern: needs exactly one group"),
        (
            {"jobs": {"prometheus_url": "file:///etc/passwd"}},
            "jobs.prometheus_url: 'file:///etc/passwd' is not an http",
        ),
        ({"jobs": {"prometheus_url": "http://"}}, "jobs.prometheus_url: 'http://' is not an http"),
        ({"allow": {"namespaces": ["ml"]}}, "allow.namespaces: only the kubernetes backend has namespaces"),
        ({"backend": "script"}, "script: required when backend is script"),
        (
            {"backend": "script", "script": {"path": "hook.sh"}},
            "script.path: 'hook.sh' must be an absolute path",
        ),
        ({"run_dirs": "/ckpt"}, "run_dirs: '/ckpt' must contain {run}"),
        ({"slurm": {"requeue": "again"}}, "slurm.requeue: 'again' is not requeue or resubmit"),
        ({"dry_rum": True}, "unknown key(s) dry_rum"),
    ],
)
def test_policy_errors_name_the_place(change: dict[str, Any], message: str) -> None:
    """Each mistake is refused with a message that says where and what."""
    with pytest.raises(PolicyError) as err:
        parse_policy(minimal(**change))
    assert message in str(err.value)


def test_policy_formats(tmp_path: Path) -> None:
    """YAML, TOML and JSON give the same policy; a relative audit log lies next to the policy file."""
    data = minimal(audit_log="audit.jsonl")
    (tmp_path / "p.json").write_text(json.dumps(data))
    (tmp_path / "p.toml").write_text(
        'backend = "slurm"\naudit_log = "audit.jsonl"\n'
        '[rails.rate_limit]\nactions = 5\nwindow = "10m"\n[rails.drain_cap]\nfraction = 0.1\nwindow = "1h"\n'
        '[[rules]]\nmatch = {alertname = "GpuDown"}\nactions = ["drain"]\n'
    )
    import yaml

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    policies = [load_policy(tmp_path / f"p.{ext}") for ext in ("json", "toml", "yaml")]
    assert {p.audit_log for p in policies} == {tmp_path / "audit.jsonl"}
    assert {p.rules[0].actions for p in policies} == {("drain",)}
    (tmp_path / "bad.yaml").write_text("rules: [\n")
    with pytest.raises(PolicyError, match=r"bad.yaml: not valid YAML"):
        load_policy(tmp_path / "bad.yaml")
    with pytest.raises(PolicyError, match="unknown policy format"):
        load_policy(tmp_path / "p.ini") if (tmp_path / "p.ini").write_text("x") else None


def test_host_and_job_syntax_refuses_host_lists() -> None:
    """A label value that Slurm would read as several hosts (or as options) never becomes a target."""
    from babysitter.remediate.policy import Hosts

    hosts = Hosts()
    assert host_of({"instance": "gpu-017:9946"}, hosts) == "gpu-017"
    assert host_of({"instance": "gpu-017.example.org"}, hosts) == "gpu-017.example.org"
    for bad in ("n[1-512]:9946", "n1,n2:9946", "n1 State=DOWN", "-n1", "", "n1;reboot"):
        assert host_of({"instance": bad}, hosts) is None, bad
    assert host_of({}, hosts) is None
    assert not valid_host("a" * 300)
    assert valid_job("1234") and valid_job("1234_7") and valid_job("ml/trainer-0")
    assert not valid_job("1234,1235") and not valid_job("12 34") and not valid_job("../x")


def test_reason_is_filled_and_sanitized() -> None:
    """Label values fill the reason; quotes, newlines and shell characters are dropped; length bounded."""
    text = render_reason("Xid {xid} on GPU {gpu} {missing}", {"xid": "79", "gpu": "3\n$(reboot)`x`\"'"})
    assert text == "babysitter: Xid 79 on GPU 3(reboot)x unknown"
    assert "\n" not in text and "$" not in text and "`" not in text and '"' not in text
    assert len(render_reason("{a}" * 20, {"a": "x" * 500})) <= 200


def test_payload_parsing_bounds_and_errors() -> None:
    """A real payload parses; malformed ones are refused with a reason."""
    note = parse_notification(payload(alert("GpuDown", instance="n1:9400", gpu="3", starts=1_700_000_000.25)))
    (a,) = note.alerts
    assert a.name == "GpuDown" and a.labels["gpu"] == "3" and a.starts_at == pytest.approx(1_700_000_000.25)
    assert parse_time("0001-01-01T00:00:00Z") is None
    assert parse_time("2024-01-02T03:04:05.123456789+02:00") == pytest.approx(1704157445.123456789)
    for bad, why in [
        ([], "not a JSON object"),
        ({"version": "3", "alerts": []}, "version"),
        ({"alerts": [{"status": "firing", "labels": {}}]}, "no alertname"),
        ({"alerts": [{"status": "burning", "labels": {"alertname": "x"}}]}, "neither firing nor resolved"),
        (
            {
                "alerts": [
                    {"status": "firing", "labels": {"alertname": "x", "bad-name": "1"}, "startsAt": "x"}
                ]
            },
            "bad label name",
        ),
        (
            {"alerts": [{"status": "firing", "labels": {"alertname": "x"}, "startsAt": "yesterday"}]},
            "RFC 3339",
        ),
        ({"alerts": [alert("x")] * 1001}, "at most 1000"),
    ]:
        with pytest.raises(PayloadError, match=why):
            parse_notification(bad)


def test_the_shipped_remediate_routes_send_every_alert_the_example_policy_acts_on() -> None:
    """The commented route in exporters/alertmanager.yml and the one docs/remediate.md shows must send
    the remediator exactly the alerts the example policy has rules for: a rule whose alert is not
    routed never acts (GpuEccUncorrectable and the fabric's alerts were missing from the first)."""
    policy = load_policy(REPO / "exporters/remediate-policy.example.yaml")
    wanted: set[str] = set()
    for rule in policy.rules:
        wanted.update(rule.match["alertname"].pattern.split("|"))
    for path in (REPO / "exporters/alertmanager.yml", REPO / "docs/remediate.md"):
        routes = re.findall(
            r"receiver: remediate\n\s*#?\s*matchers: \['alertname=~\"([^\"]+)\"'\]", path.read_text()
        )
        assert len(routes) == 1, path
        assert set(routes[0].split("|")) == wanted, (path, set(routes[0].split("|")) ^ wanted)
