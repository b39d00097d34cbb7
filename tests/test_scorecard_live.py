"""The scorecard's live path: a real Prometheus scraping two simulated clusters for a few seconds.

Each cluster is a node agent with a simulated GPU serving one real tracker (through the
registration directory); Prometheus gives each agent target its ``cluster`` label. Cluster "fast"
steps 2.5x as often as cluster "slow" with the same model, and only "slow" sees Xid errors. The
scorecard, over a one-minute window, must see the MFU gap and the Xid errors and rank "fast" first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.cli import build_parser
from babysitter.generate import fast as fast_profile
from babysitter.generate.writer import render, write
from node_helpers import read_port_file
from promkit import PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

TRACKER = textwrap.dedent(
    """
    import sys, time
    import babysitter
    t = babysitter.watch(run="run-" + sys.argv[3], tokens_per_step=1000, flops_per_token=6e6, peak_flops=1e12,
                         port=0, registry_dir=sys.argv[1], run_dir=sys.argv[2], labels={"cluster": sys.argv[3]},
                         flush_interval=0.2)
    pause = float(sys.argv[4])
    while True:
        time.sleep(pause)
        t.step()
    """
)


def _start(
    tmp_path: Path, name: str, pause: float, scenario: list[dict[str, object]]
) -> list[subprocess.Popen[bytes]]:
    reg, run_dir = tmp_path / f"reg-{name}", tmp_path / f"run-{name}"
    run_dir.mkdir()
    (tmp_path / f"scenario-{name}.json").write_text(json.dumps({"events": scenario}))
    agent = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "1", "--registry-dir", str(reg)]
    agent += ["--scenario", str(tmp_path / f"scenario-{name}.json"), "--kmsg-path", ""]
    agent += ["--port", "0", "--port-file", str(tmp_path / f"addr-{name}")]
    log = (tmp_path / f"agent-{name}.log").open("wb")
    return [
        subprocess.Popen(agent, stdout=log, stderr=subprocess.STDOUT),
        subprocess.Popen(
            [sys.executable, "-c", TRACKER, str(reg), str(run_dir), name, str(pause)],
            stdout=subprocess.DEVNULL,
            stderr=log,
        ),
    ]


def test_live_clusters_ranked(tmp_path: Path) -> None:
    """Two live clusters: the faster, Xid-free one ranks first; Xid errors counted for the other."""
    xids = [{"at": at, "gpu": 0, "event": "xid", "xid": 13} for at in (1, 2, 3)]
    procs = _start(tmp_path, "fast", 0.02, []) + _start(tmp_path, "slow", 0.05, xids)
    try:
        jobs = [
            {
                "job_name": f"agent-{name}",
                "scrape_interval": "1s",
                "static_configs": [
                    {
                        "targets": [read_port_file(tmp_path / f"addr-{name}", timeout=30)],
                        "labels": {"cluster": name},
                    }
                ],
            }
            for name in ("fast", "slow")
        ]
        # The scorecard reads the recording rules, generated with its rate window.
        generated = tmp_path / "gen"
        write(generated, render(replace(fast_profile(), rate_window="10s")))
        rules = [generated / "alerts/babysitter-rules.yaml"]
        with PrometheusServer(tmp_path, extra_scrape_configs=jobs, rule_files=rules) as prom:
            prom.wait_for(f"count by (cluster) ({T.STEPS.name}) and on (cluster) {N.GPU_UP.name}", timeout=40)
            prom.wait_for(f"count(count by (cluster) ({T.STEPS.name})) == 2", timeout=40)
            prom.wait_for(f'{N.GPU_XID_ERRORS.name}{{cluster="slow"}} >= 3', timeout=30)
            time.sleep(12)  # enough samples for 10 s rates
            out = tmp_path / "card.json"
            argv = ["scorecard", "--prometheus", prom.url, "--window", "1m", "--rate-window", "10s"]
            argv += ["--step", "1s", "--json", str(out)]
            args = build_parser().parse_args(argv)
            assert args.func(args) == 0, prom.log_tail()
            card = json.loads(out.read_text())
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    by_name = {c["cluster"]: c for c in card["clusters"]}
    assert set(by_name) == {"fast", "slow"}
    fast, slow = by_name["fast"], by_name["slow"]
    assert fast["mfu"] > 1.5 * slow["mfu"] > 0
    assert sum(slow["xid_by_action"].values()) >= 3
    assert sum(fast["xid_by_action"].values()) == 0
    assert fast["gpu_hours"] > 0 and slow["gpu_hours"] > 0
    assert fast["xid_per_1000_gpu_hours"] == 0 < slow["xid_per_1000_gpu_hours"]
    assert card["clusters"][0]["cluster"] == "fast"
