"""End to end on a real Slurm cluster: an Xid 79 on the node a tracked training runs on is detected by
the real rules in a real Prometheus, routed by a real Alertmanager to ``babysitter remediate``, which
drains the node (sinfo shows DRAIN with the reason) and requeues the job; Slurm runs it again on the
other node, where it resumes from its last checkpoint, and the remediation is written next to its ledger,
where ``babysitter report`` reads it: the restart's cause, its time to detect and its time to recover.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from babysitter.generate import fast
from babysitter.generate.writer import render, write
from gen_helpers import AlertmanagerServer
from node_helpers import read_port_file
from promkit import PrometheusServer, free_port
from remediate_helpers import SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.prometheus]

TESTS = Path(__file__).resolve().parent
XID_AT = 12  # seconds after the node agent starts

TRAIN = """
import os, sys, time, glob
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import babysitter
from tinygpt import TinyConfig, TinyGPT, batches, palm_flops_per_token, train_step
run_dir, reg = sys.argv[2], sys.argv[3]
saved = sorted(glob.glob(os.path.join(run_dir, "ckpt-*.pt")), key=lambda p: int(p.split("-")[-1][:-3]))
start = int(saved[-1].split("-")[-1][:-3]) if saved else 0
print("resume", start, "on", os.environ.get("SLURMD_NODENAME"), flush=True)
cfg = TinyConfig(); model = TinyGPT(cfg); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
t = babysitter.watch(model, run="e2e", tokens_per_step=4 * 32, flops_per_token=palm_flops_per_token(model, 32),
                     peak_flops=2e10, port=0, registry_dir=reg, run_dir=run_dir, labels={"cluster": "c1"},
                     flush_interval=0.2)
if start:
    with t.checkpoint_load(step=start):
        pass
step = start
for x, y in t.data(batches(cfg, 4, 32, seed=0)):
    step += 1
    t.step(loss=train_step(model, opt, x, y), step=step)
    if step % 20 == 0:
        path = os.path.join(run_dir, f"ckpt-{step}.pt")
        with t.checkpoint_save(step=step, nbytes=16, path=path):
            open(path, "wb").write(bytes(16))
    time.sleep(0.05)
"""


def test_xid79_drains_the_node_and_the_job_resumes_elsewhere(tmp_path: Path) -> None:
    jobs_dir = tmp_path / "gpu-jobs"
    jobs_dir.mkdir()
    prolog = tmp_path / "prolog.sh"
    # The node agent's job map, as a Slurm prolog writes it (exporters/slurm.md): only n1 has the agent.
    prolog.write_text(
        f'#!/bin/sh\n[ "$SLURMD_NODENAME" = n1 ] && for g in 0 1; do echo "$SLURM_JOB_ID" > {jobs_dir}/$g; done\nexit 0\n'
    )
    epilog = tmp_path / "epilog.sh"
    epilog.write_text(f'#!/bin/sh\n[ "$SLURMD_NODENAME" = n1 ] && rm -f {jobs_dir}/0 {jobs_dir}/1\nexit 0\n')
    for script in (prolog, epilog):
        script.chmod(0o755)
    run_dir, reg = tmp_path / "e2e", tmp_path / "reg"  # run_dirs: {run} is the run name, e2e
    run_dir.mkdir()
    reg.mkdir()
    cfg = fast()
    write(tmp_path / "gen", render(cfg))
    rules = [tmp_path / "gen/alerts/babysitter-rules.yaml", tmp_path / "gen/alerts/babysitter-alerts.yaml"]
    procs: list[subprocess.Popen[bytes]] = []
    with SlurmCluster(
        tmp_path / "slurm", ("n1", "n2"), weights={"n1": 1, "n2": 2}, prolog=str(prolog), epilog=str(epilog)
    ) as slurm:
        try:
            train = tmp_path / "train.py"
            train.write_text(TRAIN)
            job_script = tmp_path / "job.sh"
            job_script.write_text(f"#!/bin/sh\nexec {sys.executable} {train} {TESTS} {run_dir} {reg}\n")
            job = slurm.run(
                "sbatch",
                "--parsable",
                "--requeue",
                "-J",
                "e2e",
                "-o",
                str(tmp_path / "job-%j.out"),
                "--open-mode=append",
                str(job_script),
            ).stdout.strip()
            deadline = time.monotonic() + 60
            while slurm.job(job).get("JobState") != "RUNNING" or not (jobs_dir / "0").exists():
                assert time.monotonic() < deadline, slurm.log_tail()
                time.sleep(0.5)
            assert slurm.job(job)["NodeList"] == "n1"

            scenario = tmp_path / "scenario.json"
            scenario.write_text(json.dumps({"events": [{"at": XID_AT, "gpu": 1, "event": "xid", "xid": 79}]}))
            agent_argv = [
                sys.executable,
                "-m",
                "babysitter",
                "node-agent",
                "--simulate",
                "2",
                "--scenario",
                str(scenario),
                "--port",
                "0",
                "--port-file",
                str(tmp_path / "agent.addr"),
                "--registry-dir",
                str(reg),
                "--gpu-job-dir",
                str(jobs_dir),
                "--trainer-timeout",
                "0.5",
            ]
            agent_started = time.time()
            procs.append(
                subprocess.Popen(
                    agent_argv, stdout=(tmp_path / "agent.log").open("wb"), stderr=subprocess.STDOUT
                )
            )
            agent = read_port_file(tmp_path / "agent.addr", timeout=60)

            # Alertmanager needs the receiver's address, Prometheus Alertmanager's, the policy Prometheus'.
            remediate = f"127.0.0.1:{free_port()}"
            token = tmp_path / "remediate.token"  # Alertmanager authenticates, as exporters/alertmanager.yml
            token.write_text("e2e-remediate-token-0123456789\n")
            token.chmod(0o600)
            am_config = {
                "route": {
                    "receiver": "remediate",
                    "group_by": ["alertname", "instance"],
                    "group_wait": "1s",
                    "group_interval": "2s",
                    "repeat_interval": "1h",
                },
                "receivers": [
                    {
                        "name": "remediate",
                        "webhook_configs": [
                            {
                                "url": f"http://{remediate}/alerts",
                                "send_resolved": True,
                                "http_config": {
                                    "authorization": {"type": "Bearer", "credentials_file": str(token)}
                                },
                            }
                        ],
                    }
                ],
            }
            node_job = {
                "job_name": "babysitter-node",
                "honor_labels": True,
                "static_configs": [{"targets": [agent], "labels": {"cluster": "c1", "instance": "n1:9400"}}],
            }
            with (
                AlertmanagerServer(tmp_path, yaml.safe_dump(am_config)) as am,
                PrometheusServer(
                    tmp_path, rule_files=rules, extra_scrape_configs=[node_job], alertmanager=am.address
                ) as prom,
            ):
                policy = tmp_path / "policy.yaml"
                policy.write_text(
                    yaml.safe_dump(
                        {
                            "backend": "slurm",
                            "audit_log": str(tmp_path / "audit.jsonl"),
                            "run_dirs": str(tmp_path / "{run}"),
                            "jobs": {"prometheus_url": prom.url},
                            "rails": {
                                "rate_limit": {"actions": 5, "window": "10m"},
                                "drain_cap": {"fraction": 0.5, "window": "1h"},
                            },
                            "rules": [
                                {
                                    "name": "xid",
                                    "match": {"alertname": "GpuXidCritical"},
                                    "actions": ["drain", "requeue"],
                                    "reason": "Xid {xid} on GPU {gpu}",
                                }
                            ],
                        }
                    )
                )
                rem_argv = [
                    sys.executable,
                    "-m",
                    "babysitter",
                    "remediate",
                    "--policy",
                    str(policy),
                    "--listen-address",
                    remediate,
                    "--token-file",
                    str(token),
                ]
                procs.append(
                    subprocess.Popen(
                        rem_argv,
                        env=slurm.env,
                        stdout=(tmp_path / "remediate.log").open("wb"),
                        stderr=subprocess.STDOUT,
                    )
                )
                deadline = time.monotonic() + 90
                while not slurm.states().get("n1", "").startswith("drain"):
                    assert time.monotonic() < deadline, (
                        slurm.states(),
                        (tmp_path / "remediate.log").read_text()[-3000:],
                    )
                    time.sleep(1)
                assert slurm.reason("n1") == "babysitter: Xid 79 on GPU 1"
                deadline = time.monotonic() + 90
                while not (
                    slurm.job(job).get("Restarts") == "1" and slurm.job(job).get("JobState") == "RUNNING"
                ):
                    assert time.monotonic() < deadline, (slurm.job(job), slurm.log_tail())
                    time.sleep(1)
                assert slurm.job(job)["NodeList"] == "n2"
                out = tmp_path / f"job-{job}.out"
                deadline = time.monotonic() + 60
                while "on n2" not in out.read_text():
                    assert time.monotonic() < deadline, out.read_text()[-2000:]
                    time.sleep(1)
                resumed_seen = time.time()
                resumed = [line for line in out.read_text().splitlines() if line.startswith("resume")]
                assert resumed[0] == "resume 0 on n1"
                assert int(resumed[1].split()[1]) >= 20 and resumed[1].endswith("on n2")
                notes = [
                    json.loads(line) for line in (run_dir / "remediations.jsonl").read_text().splitlines()
                ]
                cause = f"remediated: drained host n1 after Xid 79, requeued job {job}"
                assert notes[0]["cause"] == cause
                assert notes[0]["resume_step"] >= 20
                # The report ties the note to the restart: cause, time to detect, time to recover.
                deadline = time.monotonic() + 30
                while True:
                    report = json.loads(
                        subprocess.run(
                            [sys.executable, "-m", "babysitter", "report", str(run_dir), "--json"],
                            capture_output=True,
                            check=True,
                            timeout=60,
                        ).stdout
                    )
                    restarts = report["restart_list"]
                    if restarts and restarts[0]["time_to_recover_seconds"] is not None:
                        break
                    assert time.monotonic() < deadline, report
                    time.sleep(1)
                assert report["restarts"] == 1 and len(restarts) == 1
                restart = restarts[0]
                assert restart["cause"] == cause and restart["remediated"] is True
                assert restart["remediation"]["alert"] == "GpuXidCritical"
                # The alert started after the Xid was injected and before the remediator acted.
                alert_start = restart["remediation"]["alert_start"]
                assert agent_started + XID_AT - 1 <= alert_start <= notes[0]["t"]
                assert restart["time_to_detect_seconds"] == pytest.approx(notes[0]["t"] - alert_start)
                assert 0 < restart["time_to_detect_seconds"] < 60
                # Recovered when the requeued job's first step on n2 ended: after the action (which
                # came before the job said it resumed there), and before now.
                first_step = notes[0]["t"] + restart["time_to_recover_seconds"]
                assert notes[0]["t"] < resumed_seen and notes[0]["t"] < first_step < time.time()
                assert restart["downtime_seconds"] > 0
                assert report["badput_seconds"]["downtime"] == pytest.approx(restart["downtime_seconds"])
                assert report["remediations"][0]["restart"] == 1
                table = subprocess.run(
                    [sys.executable, "-m", "babysitter", "report", str(run_dir)],
                    capture_output=True,
                    check=True,
                    timeout=60,
                    env={**os.environ, "COLUMNS": "250"},
                ).stdout.decode()
                assert "Restarts" in table and cause in table
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
