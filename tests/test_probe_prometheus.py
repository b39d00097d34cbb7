"""Probe results reach a real Prometheus through the node agent's HTTP server, and lint clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from babysitter.catalog import node as N
from babysitter.catalog import probe as P
from babysitter.node.agent import Agent, Server
from babysitter.node.workloads.probe_results import ProbeResultsCollector
from babysitter.probe import host_file_name, write_report
from promkit import PROMTOOL, PrometheusServer, require_binary
from test_probe import _report

pytestmark = pytest.mark.prometheus


def test_probe_series_in_prometheus(tmp_path: Path) -> None:
    """An agent serving a probe results file: Prometheus stores the lemon flag and bandwidths."""
    results = tmp_path / "results"
    write_report(_report().for_host("n0"), results / host_file_name("n0"))
    agent = Agent([ProbeResultsCollector(results)])
    server = Server.start(agent, "127.0.0.1", 0)
    try:
        with PrometheusServer(tmp_path, targets=[server.address]) as prom:
            prom.wait_for(f"{P.PROBE_DEVICE_LEMON.name} == 1", timeout=30)
            assert prom.query_value(f'{P.PROBE_DEVICE_LEMON.name}{{gpu="1",check="matmul"}}') == 1
            assert prom.query_value(f'{P.PROBE_NODE_LEMON.name}{{check="matmul"}}') == 1
            assert prom.query_value(f'{P.PROBE_STORAGE_WRITE_BANDWIDTH.name}{{path="/ckpt"}}') == 100.0
            assert prom.query_value(f'{N.COLLECTOR_SUCCESS.name}{{collector="probe"}}') == 1
    finally:
        server.stop()
        agent.close()


def test_exposition_passes_promtool_lint(tmp_path: Path) -> None:
    """`promtool check metrics` finds nothing to complain about in the probe families."""
    require_binary(PROMTOOL, "promtool")
    results = tmp_path / "results"
    write_report(_report().for_host("n0"), results / host_file_name("n0"))
    body = Agent([ProbeResultsCollector(results)]).render()
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=30)
    problems = [
        line
        for line in proc.stdout.decode().splitlines() + proc.stderr.decode().splitlines()
        if "probe_" in line
    ]
    assert problems == []


def test_node_agent_cli_serves_probe_results(tmp_path: Path) -> None:
    """`babysitter node-agent --probe-results-dir DIR` serves the probe families (once the agent wires
    the collector in; skipped before)."""
    import sys
    import urllib.request

    from babysitter.node.config import COLLECTORS
    from node_helpers import parse_exposition, read_port_file

    if "probe" not in COLLECTORS:
        pytest.skip("the node agent does not register the probe collector yet")
    results = tmp_path / "results"
    write_report(_report().for_host("n0"), results / host_file_name("n0"))
    argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "1", "--kmsg-path", ""]
    argv += ["--port", "0", "--port-file", str(tmp_path / "addr"), "--registry-dir", str(tmp_path / "reg")]
    argv += ["--probe-results-dir", str(results)]
    with (tmp_path / "agent.log").open("wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            address = read_port_file(tmp_path / "addr", timeout=30)
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                scrape = parse_exposition(response.read().decode())
        finally:
            agent.terminate()
            agent.wait(timeout=10)
    assert scrape.value(P.PROBE_DEVICE_LEMON.name, gpu="1", check="matmul") == 1
    assert scrape.value(N.COLLECTOR_SUCCESS.name, collector="probe") == 1
