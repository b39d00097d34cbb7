"""The demo's dry-run remediator: its policy passes the real checker, its routing sends GPU alerts to it
and still pages, and its audit records become the lines the demo prints."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from babysitter.cli import main
from babysitter.demo.remediation import DEMO_JOB, AuditTail, describe, remediate_policy, write_job_map
from babysitter.demo.routing import demo_alertmanager_config, load_routing, shipped_routing
from babysitter.demo.stack import write_json
from babysitter.remediate.policy import parse_policy
from promkit import require_binary

AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"


def test_the_policy_is_a_valid_dry_run_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The policy the demo writes passes ``babysitter remediate --check``: a dry run that drains and
    requeues on a critical Xid, the job from the job map only, a cap of the demo's one node."""
    policy = remediate_policy(
        audit_log=tmp_path / "audit.jsonl", prometheus_url="http://127.0.0.1:9", cluster="demo"
    )
    path = write_json(tmp_path / "policy.json", policy)
    assert main(["remediate", "--policy", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "dry run True" in out
    assert "rule xid-drain-requeue: alertname=~GpuXidCritical" in out and "-> drain + requeue" in out
    parsed = parse_policy(policy)
    assert parsed.jobs.ask_scheduler is False and parsed.drain_cap.cluster_nodes == 1


def test_the_job_map_is_what_a_prolog_writes(tmp_path: Path) -> None:
    """One file per GPU holding the demo's job id."""
    write_job_map(tmp_path / "jobs", 3)
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir()) == ["0", "1", "2"]
    assert (tmp_path / "jobs" / "2").read_text() == DEMO_JOB + "\n"


def test_gpu_alerts_go_to_the_remediator_and_still_page(tmp_path: Path) -> None:
    """amtool on the demo's Alertmanager config (the shipped routing): a critical GPU alert reaches
    remediate, the pager and chat, a critical training alert the pager and chat only."""
    require_binary(AMTOOL, "amtool")
    amtool = AMTOOL
    routing = load_routing(shipped_routing() or tmp_path / "missing")
    config = write_json(
        tmp_path / "am.yml",
        demo_alertmanager_config(
            routing, lambda name: f"http://127.0.0.1:5/{name}", "http://127.0.0.1:6/alerts"
        ),
    )
    check = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    def receivers(*labels: str) -> str:
        out = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={config}", *labels],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout.strip()

    gpu = ("severity=critical", "component=gpu", "gpu=3")
    assert receivers("alertname=GpuXidCritical", *gpu) == "demo-remediate,pager,chat"
    assert receivers("alertname=TrainingStalled", "severity=critical", "component=training") == "pager,chat"


def test_audit_records_become_lines_with_the_commands(tmp_path: Path) -> None:
    """A planned drain prints the scontrol command it would run; a refusal its reason; other records
    nothing; a line still being written waits for its end."""
    audit = tmp_path / "audit.jsonl"
    tail = AuditTail(audit)
    assert tail.new_records() == []  # no file yet
    drain = {
        "event": "action",
        "action": "drain",
        "result": "dry_run",
        "host": "n1",
        "reason": "babysitter: Xid 79 on GPU 3",
        "dry_run": True,
        "alert": {"name": "GpuXidCritical", "labels": {"xid": "79"}},
        "commands": [
            {
                "what": "drain",
                "argv": [
                    "/usr/bin/scontrol",
                    "update",
                    "NodeName=n1",
                    "State=DRAIN",
                    "Reason=babysitter: Xid 79 on GPU 3",
                ],
            }
        ],
    }
    refused = {
        "event": "refused",
        "action": "drain",
        "reason": "drain_cap",
        "host": "n2",
        "detail": "1 of 1 nodes drained",
        "alert": {"name": "GpuXidCritical"},
    }
    line = json.dumps(drain) + "\n" + json.dumps({"event": "deferred"}) + "\n" + json.dumps(refused)
    audit.write_text(line[:-5])
    records = tail.new_records()
    assert [r["event"] for r in records] == ["action", "deferred"]
    with audit.open("a") as fh:
        fh.write(line[-5:] + "\n")
    records += tail.new_records()
    head, shown = describe(records[0]) or ("", "")
    assert head == (
        "REMEDIATE (dry run) drain host n1 for GpuXidCritical: would run scontrol update NodeName=n1 "
        'State=DRAIN "Reason=babysitter: Xid 79 on GPU 3"'
    )
    assert json.loads(shown)["result"] == "dry_run" and "alert" not in json.loads(shown)
    assert describe(records[1]) is None
    head, _ = describe(records[2]) or ("", "")
    assert head == "REMEDIATE refused drain host n2 for GpuXidCritical: drain_cap (1 of 1 nodes drained)"
