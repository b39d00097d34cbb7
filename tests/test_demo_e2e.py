"""Acceptance: ``babysitter demo`` with a short scenario, the real stack (Prometheus, Alertmanager, node
agent, CPU training, ``babysitter remediate --dry-run``), every scripted fault paged, the Xid 79's
drain and requeue planned on screen with their audit lines, the report's goodput equal to the
ledger's, ``babysitter top`` rendered against the live demo; Ctrl-C and a missing Prometheus."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from babysitter.ledger import summarize
from babysitter.views.top import Frame, MetricsSource, PrometheusSource, render
from promkit import ALERTMANAGER, PROMETHEUS, require_binary

# Faults well after startup (the first checkpoints must exist before the slow one), a hang and then a
# freeze (SIGSTOP: the process answers nothing), each long enough for the fast profile's 15 s stall
# threshold plus the ~4 s of scrape, evaluation and group wait, the hang 11 s after the restart (its
# first steps must be done, or the watchdog is still in its startup allowance), the freeze once the
# hang's page has resolved; 106 s in all (the test passes --duration 106). The training's GPU (1: the
# demo's CPU training claims the first throttled GPU) throttles 4 s after the hang, so that the
# hang's badput lies before the 14 s the demo explains; the freeze at 80 s overlaps them, which
# costs steps but no cause explain times.
SCENARIO = {
    "duration": 600,  # cut to 106 s by --duration
    "gpus": 8,
    "events": [
        {"at": 22, "event": "slow_checkpoint", "seconds": 5},
        {"at": 30, "event": "xid79", "gpu": 5},
        {"at": 36, "event": "kill", "restart_after": 3},
        {"at": 50, "event": "hang", "seconds": 22},
        {"at": 76, "event": "throttle", "gpu": 1, "reasons": ["hw_slowdown"]},
        {"at": 80, "event": "freeze", "seconds": 22},
    ],
}
# Under the shipped routing (exporters/alertmanager.yml) criticals page (and go to chat), warnings go
# to chat only.
# GpuDown of the Xid 79's GPU is inhibited by its GpuXidCritical: one page per GPU fault.
PAGED = ["GpuXidCritical", "TrainingStalled"]
CHAT_ONLY = ["CheckpointSaveSlow", "TrainingProcessExited"]


def _start(
    tmp_path: Path, *extra: str, scenario: dict[str, Any] = SCENARIO
) -> tuple[subprocess.Popen[str], Path]:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "babysitter",
            "demo",
            "--scenario",
            str(path),
            "--workdir",
            str(workdir),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, workdir


def _stack(workdir: Path, proc: subprocess.Popen[str], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    path = workdir / "stack.json"
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"demo exited early: {proc.communicate()[0]}")
        assert time.monotonic() < deadline, "demo never came up"
        time.sleep(0.2)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _text(frame: Frame) -> str:
    console = Console(record=True, width=220, color_system=None)
    console.print(render(frame))
    return console.export_text()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _assert_all_gone(pids: dict[str, int]) -> None:
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {n: p for n, p in pids.items() if _alive(p)} == {}, "processes left behind"


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.prometheus
def test_demo_pages_every_fault_and_reports_the_ledgers_goodput(tmp_path: Path) -> None:
    require_binary(PROMETHEUS, "prometheus")
    require_binary(ALERTMANAGER, "alertmanager")
    proc, workdir = _start(tmp_path, "--strict", "--duration", "106")
    try:
        stack = _stack(workdir, proc)
        t0 = float(stack["t0"])
        # babysitter top against the live demo, once the Xid 79 has paged (fault at +30 s).
        prom = PrometheusSource(stack["prometheus"], window="20s", timeout=2.0)
        direct = MetricsSource([stack["node_agent"]], timeout=2.0)
        deadline = t0 + 50
        while True:
            frame = prom.frame()
            firing = {a.name for a in frame.alerts or () if a.state == "firing"}
            node = frame.nodes[0] if frame.nodes else None
            if node is not None and node.lost == ("5",) and "GpuXidCritical" in firing and frame.runs:
                break
            assert time.time() < deadline, f"top never showed the lost GPU and its alert: {frame}"
            time.sleep(1)
        text = _text(frame)
        run_line = next(line for line in text.splitlines() if line.startswith("│ demo "))
        assert re.search(r"\d+\.\d%", run_line), "MFU and goodput shown"
        node_line = next(line for line in text.splitlines() if line.startswith(f"│ {node.instance}"))
        assert "7/8" in node_line and "79x1" in node_line and "GpuXidCritical" in node_line
        assert "GpuXidCritical" in text.split("Alerts", 1)[1]
        direct_text = _text(direct.frame())
        assert "demo" in direct_text and "79x1" in direct_text
        # Killed at +36 s, restarted at +39 s plus its startup: meanwhile top keeps the run, marked.
        deadline = t0 + 50
        while True:
            frame = prom.frame()
            if any(r.run == "demo" and not r.reporting for r in frame.runs):
                break
            assert time.time() < deadline, f"top never showed the killed run: {frame}"
            time.sleep(0.5)
        assert "demo (not reporting)" in _text(frame)
        out, _ = proc.communicate(timeout=200)
    finally:
        _kill(proc)
    assert proc.returncode == 0, out  # --strict: 3 when a scripted fault's alert did not arrive
    # Every scripted fault's alert arrived through Alertmanager, after the fault, at the receivers the
    # shipped routing names: criticals at the pager and in chat, warnings in chat only.
    fault_at = {}
    for line in out.splitlines():
        if m := re.match(r"\[\+\s*([\d.]+)s\] FAULT (.*)", line):
            fault_at[m.group(2)] = float(m.group(1))
    assert len(fault_at) == 6, out
    # The throttle fault is explained on screen (explain in-process, the demo's fast profile), its GPU
    # joined to the training's rank through train_info, throttling ranked first; and again at the end.
    # Not the time it costs: here the 20 s explained run into the freeze and the 30 s before them hold
    # the hang's stuck step, so the step-time ratio (and with it the charge) depends on where the
    # rate windows fall (0.8x, no time, in one clean-clone CI run; time charged in an earlier run). test_explain and
    # benchmarks/results/explain_live.md time the throttle on a clean baseline.
    shown = re.search(
        r"\[\+\s*([\d.]+)s\] explained GPU 1 throttles \(hw_slowdown\): gpu throttling "
        r"\(infra, [^)]*\): "
        r"rank 0 \(host [^,]+, GPU 1\) .*that GPU reports hw_slowdown",
        out,
    )
    assert "GPU 1 throttles (hw_slowdown)" in fault_at, out
    assert shown and float(shown.group(1)) >= 76 + 20, out  # 20 s after the fault's scripted time
    assert re.search(r"^explained GPU 1 throttles \(hw_slowdown\): gpu throttling \(infra", out, re.M), out
    for name in PAGED:
        assert re.search(rf"\] PAGE critical {name} ", out), f"{name} not paged:\n{out}"
        assert re.search(rf"\] CHAT critical {name} ", out), f"{name} not in chat:\n{out}"
    for name in CHAT_ONLY:
        assert re.search(rf"\] CHAT warning {name} ", out), f"{name} not in chat:\n{out}"
    assert "PAGE warning" not in out, "a warning paged: the shipped routing sends warnings to chat"
    assert "not sent" not in out
    # The freeze (SIGSTOP) pages TrainingStalled on its own, after the hang's page.
    stalled = [float(t) for t in re.findall(r"\[\+\s*([\d.]+)s\] PAGE critical TrainingStalled ", out)]
    freeze_at = fault_at["training process frozen (SIGSTOP) for 22 s"]
    assert any(t >= freeze_at for t in stalled), out
    assert any(fault_at["training hangs for 22 s (stuck collective)"] <= t < freeze_at for t in stalled), out
    xid_page = re.search(r"\[\+\s*([\d.]+)s\] PAGE critical GpuXidCritical .*gpu=5 xid=79", out)
    assert xid_page and float(xid_page.group(1)) >= fault_at["Xid 79 on GPU 5: fallen off the bus"]
    # babysitter remediate --dry-run got the Xid 79 from Alertmanager and printed what it would have
    # done: drain the host, requeue its job (from the node agent's job map), each with its audit line.
    node = stack["node_agent"].split("//")[1].split(":")[0]
    drain = re.search(
        rf"\[\+\s*([\d.]+)s\] REMEDIATE \(dry run\) drain host {re.escape(node)} for GpuXidCritical: "
        rf'would run scontrol update NodeName={re.escape(node)} State=DRAIN "Reason=babysitter: Xid 79 on GPU 5"\n'
        r"\s+audit: (\{.*\})\n",
        out,
    )
    requeue = re.search(
        rf"\[\+\s*([\d.]+)s\] REMEDIATE \(dry run\) requeue host {re.escape(node)} job 4242 for "
        r"GpuXidCritical: would run scontrol requeue 4242\n\s+audit: (\{.*\})\n",
        out,
    )
    assert drain and requeue, out
    assert float(drain.group(1)) >= float(xid_page.group(1)) - 1.0  # after the page (same notification)
    for match, action in ((drain, "drain"), (requeue, "requeue")):
        shown = json.loads(match.group(2))
        assert (shown["action"], shown["result"], shown["dry_run"]) == (action, "dry_run", True)
    assert "babysitter remediate --dry-run planned 2 action(s), ran none" in out
    audit = [json.loads(line) for line in (workdir / "remediate" / "audit.jsonl").read_text().splitlines()]
    acted = [(r["action"], r["result"]) for r in audit if r["event"] == "action"]
    assert acted == [("drain", "dry_run"), ("requeue", "dry_run")], audit
    # The report ends with the checkpoint advice: one interruption is too few, and it says so.
    flat = " ".join(out.split())
    assert "checkpoint advice: save every" in flat and "INSUFFICIENT DATA" in flat, out
    assert "by Daly's model (saves, restarts and lost work only) expected goodput" in flat, out
    # Nothing after the final report: pages that arrive as the stack stops (a RESOLVED) are held.
    last = f"same table any time: babysitter report {workdir / 'run'}"  # rich may wrap it: compare unspaced
    assert re.sub(r"\s+", "", out).endswith(re.sub(r"\s+", "", last)), out
    # The final report's goodput is the ledger's, to the one decimal every goodput is printed with.
    m = re.search(r"^goodput ([\d.]+)% \(productive", out, re.M)
    assert m, out
    summary = summarize(workdir / "run")
    assert summary.state == "ended"
    assert float(m.group(1)) == pytest.approx(round(summary.totals.goodput * 100, 1), abs=1e-9)
    report = subprocess.run(
        [sys.executable, "-m", "babysitter", "report", str(workdir / "run"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["goodput"] == pytest.approx(summary.totals.goodput, abs=1e-12)
    # The scripted faults are where the ledger says the time went.
    bad = summary.totals.badput_seconds
    assert summary.totals.restarts == 1
    assert bad["lost_progress"] > 1.0, "the kill lost the steps since the last checkpoint"
    assert bad["hang"] > 15.0
    assert bad["checkpoint_save"] > 5.0
    assert bad["downtime"] > 3.0
    assert (workdir / "goodput-report.png").stat().st_size > 10_000
    _assert_all_gone(stack["pids"])


@pytest.mark.slow
@pytest.mark.prometheus
def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    require_binary(PROMETHEUS, "prometheus")
    require_binary(ALERTMANAGER, "alertmanager")
    proc, workdir = _start(tmp_path, "--duration", "80")
    try:
        stack = _stack(workdir, proc)
        assert stack["duration"] == 80
        assert set(stack["pids"]) == {"alertmanager", "prometheus", "remediate", "node-agent", "trainer"}
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=40)
    finally:
        _kill(proc)
    assert proc.returncode == 130, out
    assert "interrupted, stopping everything it started" in out
    _assert_all_gone(stack["pids"])


@pytest.mark.slow
def test_without_prometheus_the_rest_runs_and_says_what_to_install(tmp_path: Path) -> None:
    scenario = {"duration": 15, "gpus": 2, "events": [{"at": 3, "event": "xid79", "gpu": 1}]}
    proc, workdir = _start(tmp_path, "--prometheus-bin", str(tmp_path / "no-prometheus"), scenario=scenario)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        _kill(proc)
    assert proc.returncode == 0, out
    assert "Missing: prometheus" in out
    assert out.count("sudo apt-get install prometheus prometheus-alertmanager") == 2, (
        "at the start and the end"
    )
    assert "Xid 79 on GPU 1" in out
    assert re.search(r"^goodput [\d.]+% \(productive", out, re.M), out
    assert "PAGE" not in out
    assert not (workdir / "prometheus").exists()
    assert os.path.exists(workdir / "run" / "babysitter-ledger.jsonl")
