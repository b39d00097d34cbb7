"""A real Prometheus scrapes a real node agent (simulated GPUs, storage probe, a registered real tracker).

Every agent family of the catalog must reach Prometheus, and two faults must each give a clear
metric and one log line while the agent keeps serving: a GPU lost mid-run (Xid 79 in the scenario)
and a registered tracker that dies (SIGKILL).
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from babysitter.catalog import node as N
from babysitter.catalog import selfmon as S
from babysitter.catalog import storage as ST
from babysitter.catalog import train as T
from node_helpers import read_port_file
from promkit import PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

LOST_AT = 20.0  # seconds after agent start: late enough to see GPU 1 healthy first

TRACKER = textwrap.dedent(
    """
    import sys, time
    import babysitter
    t = babysitter.watch(run="node-itest", tokens_per_step=4096, flops_per_token=6e6, peak_flops=1e12,
                         port=0, registry_dir=sys.argv[1], run_dir=sys.argv[2], flush_interval=0.2)
    t.step()
    ckpt = sys.argv[2] + "/ckpt-1.pt"
    with t.checkpoint_save(step=1, nbytes=1000, path=ckpt):
        with open(ckpt, "wb") as f:
            f.write(bytes(1000))
    print(t.metrics_url, flush=True)
    while True:
        time.sleep(0.02)
        t.step()
    """
)

#: Families the agent exports in this setup. Retired pages are absent on purpose: an H100 remaps rows
#: and NVML answers NotSupported for page retirement (test_node_sim covers both kinds of GPU); so are
#: the trainer error, skipped-registration and dropped-series counters, which appear once something
#: fails (covered by test_node_trainers_hostile and test_node_trainers_bound).
_ABSENT = (
    N.GPU_RETIRED_PAGES,
    N.GPU_RETIRED_PAGES_PENDING,
    N.TRAINER_SCRAPE_ERRORS,
    N.TRAINER_REGISTRATIONS_SKIPPED,
    N.TRAINER_SERIES_DROPPED,
)
EXPECTED_NODE = {spec.name for spec in N.METRICS if spec not in _ABSENT}
EXPECTED_STORAGE = {ST.STORAGE_PROBE_WRITE.name, ST.STORAGE_PROBE_FSYNC.name, ST.STORAGE_FREE.name}
EXPECTED_SENTINEL = {ST.CHECKPOINT_MISSING.name}


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_prometheus_scrapes_agent_and_faults_are_visible(tmp_path: Path) -> None:
    """Every agent family reaches Prometheus; a lost GPU and a dead tracker each give a metric and a log line."""
    reg, ckpt, klog, run_dir = tmp_path / "reg", tmp_path / "ckpt", tmp_path / "kern.log", tmp_path / "run"
    ckpt.mkdir()
    run_dir.mkdir()
    scenario = tmp_path / "scenario.json"
    scenario.write_text(
        json.dumps(
            {
                "events": [
                    {"at": 2, "gpu": 0, "event": "xid", "xid": 13},
                    {
                        "at": 2,
                        "gpu": 0,
                        "event": "error",
                        "query": "nvmlDeviceGetPcieReplayCounter",
                        "code": 999,
                    },
                    {"at": 3, "gpu": 1, "event": "throttle", "reasons": ["sw_power_cap"]},
                    {"at": LOST_AT, "gpu": 1, "event": "xid79"},
                ]
            }
        )
    )
    argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "2", "--scenario", str(scenario)]
    argv += ["--port", "0", "--port-file", str(tmp_path / "addr"), "--registry-dir", str(reg)]
    argv += ["--simulate-kernel-log", str(klog), "--collector-timeout", "5"]
    (tmp_path / "gpu-jobs").mkdir()
    (tmp_path / "gpu-jobs" / "0").write_text("4242\n")
    argv += ["--gpu-job-dir", str(tmp_path / "gpu-jobs")]
    storage = _has("babysitter.node.storage.probe")
    if storage:
        argv += ["--storage-path", str(ckpt), "--storage-interval", "1", "--storage-size", "4096"]
    sentinel = _has("babysitter.node.storage.sentinel")
    if sentinel:
        argv += ["--checkpoint-run-dir", str(run_dir), "--checkpoint-interval", "1"]
    agent_log = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen(argv, stdout=agent_log, stderr=subprocess.STDOUT)
    tracker = subprocess.Popen(
        [sys.executable, "-c", TRACKER, str(reg), str(run_dir)], stdout=subprocess.PIPE
    )
    try:
        address = read_port_file(tmp_path / "addr", timeout=30)
        with PrometheusServer(tmp_path, targets=[address], scrape_interval="1s") as prom:
            prom.wait_for("up == 1")
            expected = EXPECTED_NODE | (EXPECTED_STORAGE if storage else set())
            expected |= EXPECTED_SENTINEL if sentinel else set()
            expected |= {T.STEPS.name, T.MFU.name, S.BUILD_INFO.name}

            def missing() -> set[str]:
                names = {r["metric"]["__name__"] for r in prom.query('{__name__=~".+", job="test"}')}
                return expected - names

            deadline = time.monotonic() + 30
            while missing() and time.monotonic() < deadline:
                time.sleep(1)
            assert missing() == set(), prom.log_tail()
            assert prom.query_value(f'{N.COLLECTOR_SUCCESS.name}{{collector="gpu"}}') == 1
            assert prom.query_value(f'{N.TRAINER_SCRAPE_SUCCESS.name}{{run="node-itest"}}') == 1
            assert prom.query_value(f'{N.GPU_XID_ERRORS.name}{{gpu="0",xid="13"}}') == 1  # NVML + kmsg: once
            assert prom.query_value(f'{N.GPU_CLOCK_EVENT_ACTIVE.name}{{gpu="1",reason="sw_power_cap"}}') == 1
            assert prom.query_value(f'{T.STEPS.name}{{run="node-itest"}}') > 0
            assert prom.query_value(f'{N.GPU_JOB.name}{{gpu="0",hpc_job="4242"}}') == 1

            # Fault 1: GPU 1 falls off the bus (Xid 79); the agent keeps serving the rest.
            prom.wait_for(f'{N.GPU_UP.name}{{gpu="1"}} == 0', timeout=LOST_AT + 20)
            assert prom.query_value(f'max_over_time({N.GPU_UP.name}{{gpu="1"}}[2m])') == 1  # was up before
            assert prom.query_value(f'{N.GPU_UP.name}{{gpu="0"}}') == 1
            prom.wait_for(f'{N.GPU_XID_ERRORS.name}{{gpu="1",xid="79"}} == 1', timeout=15)

            if sentinel:  # a checkpoint the ledger lists disappears
                prom.wait_for(f'{ST.CHECKPOINT_MISSING.name}{{run="node-itest"}} == 0', timeout=15)
                (run_dir / "ckpt-1.pt").unlink()
                prom.wait_for(f'{ST.CHECKPOINT_MISSING.name}{{run="node-itest"}} == 1', timeout=15)
                assert prom.query_value(f'{ST.CHECKPOINT_MISSING_STEP.name}{{run="node-itest"}}') == 1

            # Fault 2: the tracker dies without unregistering.
            tracker.send_signal(signal.SIGKILL)
            tracker.wait(timeout=10)
            prom.wait_for(f"{N.TRAINER_REGISTRATIONS_DROPPED.name} == 1", timeout=20)
            prom.wait_for(f"{N.TRAINERS.name} == 0", timeout=10)
            time.sleep(2)
            assert prom.query_value('up{job="test"}') == 1
            assert prom.query_value(f'{N.GPU_UP.name}{{gpu="0"}}') == 1
    finally:
        for proc in (tracker, agent):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=20)
        finally:
            for proc in (tracker, agent):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            agent_log.close()
    log = (tmp_path / "agent.log").read_text()
    assert agent.returncode == 0, log[-3000:]
    assert log.count("GPU 1 (GPU-") == 1, log[-3000:]
    assert log.count("is lost: GpuIsLost") == 1, log[-3000:]
    assert log.count("exited; dropped its registration") == 1, log[-3000:]
