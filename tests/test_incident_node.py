"""A node's Xid produces its bundle: a simulated node agent reports Xid 79 on the GPU a tracked rank
runs on; the real rules in a real Prometheus fire GpuXidCritical; ``babysitter remediate``'s engine finds
the run on that host through the job map, gathers the bundle into the run's directory (the rank's
answer, and the host's state from Prometheus: the Xid counter that grew, the GPU that is gone) before it
drains, and the audit record of the drain names it; ``babysitter incident show`` reads it back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from babysitter.generate import fast
from babysitter.generate.writer import render, write
from babysitter.prom import PromClient
from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.audit import AuditLog
from babysitter.remediate.engine import Remediator
from babysitter.remediate.incidents import hook_for
from babysitter.remediate.jobmap import PrometheusJobMap
from babysitter.remediate.policy import parse_policy
from babysitter.remediate.runs import RunNotes
from node_helpers import read_port_file, wait_for
from promkit import PrometheusServer
from remediate_helpers import RecordingBackend, payload

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

RANK = """
import sys, time, babysitter
t = babysitter.watch(run="xidrun", port=0, registry_dir=sys.argv[1], run_dir=sys.argv[2], labels={"cluster": "c1"},
                     tokens_per_step=64, flops_per_token=1e3, peak_flops=1e12, flush_interval=0.2, hang_timeout=None)
while True:
    t.step(); time.sleep(0.05)
"""


def _firing(prom: PromClient, name: str) -> list[dict[str, Any]]:
    return [a for a in prom.alerts() if a["labels"].get("alertname") == name and a.get("state") == "firing"]


def test_a_node_xid_bundle_holds_the_hosts_gpu_state_and_the_ranks_answer(tmp_path: Path) -> None:
    reg, run_dir = tmp_path / "reg", tmp_path / "xidrun"
    reg.mkdir()
    run_dir.mkdir()
    write(tmp_path / "gen", render(fast()))
    rules = [tmp_path / "gen/alerts/babysitter-rules.yaml", tmp_path / "gen/alerts/babysitter-alerts.yaml"]
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"events": [{"at": 6, "gpu": 1, "event": "xid", "xid": 79}]}))
    agent_argv = [
        sys.executable,
        "-m",
        "babysitter",
        "node-agent",
        "--simulate",
        "2",
        "--scenario",
        str(scenario),
    ]
    agent_argv += ["--port", "0", "--port-file", str(tmp_path / "addr"), "--registry-dir", str(reg)]
    agent_argv += ["--trainer-timeout", "0.5"]
    procs = [
        subprocess.Popen(agent_argv, stdout=(tmp_path / "agent.log").open("wb"), stderr=subprocess.STDOUT),
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(reg), str(run_dir)],
            stdout=(tmp_path / "rank.log").open("wb"),
            stderr=subprocess.STDOUT,
        ),
    ]
    try:
        address = read_port_file(tmp_path / "addr", timeout=60)
        job = {
            "job_name": "babysitter-node",
            "honor_labels": True,
            "static_configs": [{"targets": [address], "labels": {"cluster": "c1"}}],
        }
        with PrometheusServer(tmp_path, rule_files=rules, extra_scrape_configs=[job]) as prom:
            client = PromClient(prom.url, timeout=10)
            firing: Any = wait_for(lambda: _firing(client, "GpuXidCritical"), timeout=120, interval=0.5)
            alert = firing[0]
            page = {
                "status": "firing",
                "labels": alert["labels"],
                "annotations": alert["annotations"],
                "startsAt": alert["activeAt"],
                "fingerprint": "00000000000000d4",
            }
            policy = parse_policy(
                {
                    "backend": "slurm",
                    "audit_log": str(tmp_path / "audit.jsonl"),
                    "run_dirs": str(tmp_path / "{run}"),
                    "jobs": {"prometheus_url": prom.url},
                    "hosts": {"pattern": r"(127\.0\.0\.1):\d+"},
                    "rails": {
                        "rate_limit": {"actions": 5, "window": "10m"},
                        "drain_cap": {"fraction": 0.5, "window": "1h"},
                    },
                    "incidents": {"wait": "8s"},
                    "rules": [
                        {"name": "xid", "match": {"alertname": "GpuXidCritical"}, "actions": ["drain"]}
                    ],
                }
            )
            jobmap = PrometheusJobMap(prom.url, lookback=600, timeout=10)
            backend = RecordingBackend(["127.0.0.1", "n2"])
            remediator = Remediator(
                policy, backend, AuditLog(policy.audit_log), jobmap=jobmap, force_dry_run=True
            )
            remediator.incidents = hook_for(policy, jobmap, RunNotes(policy.run_dirs or "").run_dir)
            remediator.handle(parse_notification(payload(page)))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)
    assert backend.calls == [("drain", "127.0.0.1", True)]
    [identity] = [p.name for p in (run_dir / "incidents").iterdir() if not p.name.startswith(".")]
    folder = run_dir / "incidents" / identity
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    gathered = next(r for r in records if r["event"] == "incident")
    assert gathered["runs_from"] == "the runs the job map finds on the alert's host"
    action = next(r for r in records if r["event"] == "action")
    assert action["incident"] == [str(folder)]
    summary = json.loads((folder / "bundle.json").read_text())
    assert summary["answered"] == [0] and summary["missing"] == [] and summary["hosts"] == [address]
    host = json.loads((folder / "host.json").read_text())["hosts"][address]
    grew = [g["labels"] for g in host["grew"] if g["labels"]["metric"] == "gpu_xid_errors_total"]
    assert [(g["gpu"], g["xid"]) for g in grew] == [("1", "79")], host["grew"]
    names = {s["labels"]["__name__"] for s in host["series"]}
    assert {"gpu_up", "gpu_xid_errors_total", "gpu_temperature_celsius"} <= names
    shown = subprocess.run(
        [sys.executable, "-m", "babysitter", "incident", "show", str(run_dir), identity],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    print(shown)
    assert f"Host {address}:" in shown
    assert "gpu_xid_errors_total{action=reboot, gpu=1, pci_bus_id=0000:28:00, xid=79} grew by 1 in" in shown
    assert "gpu_energy_joules_total" not in shown  # it grows all the time: no evidence
    assert "Alert: GpuXidCritical" in shown
    assert time.time() - float(summary["created"]) < 600
