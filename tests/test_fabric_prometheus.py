"""A real Prometheus with the generated rules over a real node agent reading a fake host's sysfs: a
link_downed step, a NIC trained at x8 of x16 and an uncorrectable memory error each fire their alert,
naming the port, the PCI address or the memory controller, and the host. One Prometheus run for the three
(with windows shortened so that it takes seconds, not the default's minutes); the healthy ports, links
and controllers of the same host stay quiet."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from babysitter.catalog import fabric as F
from babysitter.generate.config import fast
from babysitter.generate.rules import Records
from babysitter.generate.writer import render, write
from babysitter.node.fabric.fake import FakeSysfs
from node_helpers import read_port_file
from promkit import PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

#: The fast profile with the fabric windows short enough for a test: history before a step is 10 s.
CFG = replace(
    fast(),
    fabric_link_downed_window="10s",
    fabric_flap_window="10s",
    pcie_degraded_for="5s",
    host_memory_ue_window="10s",
)


def _firing(prom: PrometheusServer) -> list[dict[str, Any]]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{prom.url}/api/v1/alerts", timeout=5) as response:  # noqa: S310 - loopback
        alerts: list[dict[str, Any]] = json.loads(response.read())["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


def _wait_firing(prom: PrometheusServer, name: str, timeout: float) -> list[dict[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [a["labels"] for a in _firing(prom) if a["labels"]["alertname"] == name]
        if found:
            return found
        if time.monotonic() > deadline:
            names = sorted({a["labels"]["alertname"] for a in _firing(prom)})
            raise AssertionError(f"{name} did not fire within {timeout} s; firing: {names}")
        time.sleep(0.5)


def test_link_downed_downtrained_nic_and_memory_error_fire_naming_the_device(tmp_path: Path) -> None:
    write(tmp_path / "gen", render(CFG))
    rules = [tmp_path / "gen/alerts/babysitter-rules.yaml", tmp_path / "gen/alerts/babysitter-alerts.yaml"]
    fs = FakeSysfs(tmp_path / "sys", tmp_path / "proc")
    host = fs.dgx(2, memory_controllers=2, packages=1, cores=1)
    fs.link(host.nics[1], width=8)  # the x8-of-x16 NIC, from the start
    argv = [sys.executable, "-m", "babysitter", "node-agent", "--gpu-backend", "none", "--kmsg-path", ""]
    argv += ["--path.sysfs", str(fs.root), "--path.procfs", str(fs.proc), "--fabric-rescan-interval", "5"]
    argv += ["--port", "0", "--port-file", str(tmp_path / "addr"), "--registry-dir", str(tmp_path / "reg")]
    with (tmp_path / "agent.log").open("wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        address = read_port_file(tmp_path / "addr", timeout=30)
        job = {
            "job_name": "babysitter-node",
            "static_configs": [{"targets": [address], "labels": {"cluster": "c1"}}],
        }
        with PrometheusServer(tmp_path, rule_files=rules, extra_scrape_configs=[job]) as prom:
            prom.wait_for(f'{F.IB_PORT_STATE.name}{{device="{host.rdma[0]}"}} == 4', timeout=30)
            started = time.monotonic()

            # The NIC at x8 of x16 fires once for: has passed (5 s), naming its PCI address and host.
            (narrow,) = _wait_firing(prom, "PcieLinkDowntrained", 30)
            assert (narrow["pci_address"], narrow["kind"], narrow["instance"]) == (
                host.nics[1],
                "nic",
                address,
            )

            # History first (the window's worth of samples), then the port downs and a DIMM fails.
            time.sleep(max(0.0, 12 - (time.monotonic() - started)))
            assert not [a for a in _firing(prom) if a["labels"]["alertname"] == "InfinibandLinkDowned"]
            fs.counter(host.rdma[0], "link_downed", 1)
            fs.edac(1, ue=1)
            (downed,) = _wait_firing(prom, "InfinibandLinkDowned", 20)
            assert (downed["device"], downed["port"], downed["instance"]) == (host.rdma[0], "1", address)
            assert downed["severity"] == "critical" and downed["component"] == "fabric"
            (memory,) = _wait_firing(prom, "HostMemoryUncorrectableError", 20)
            assert (memory["controller"], memory["instance"]) == ("1", address)

            # The rest of the host is quiet: one port downed, one link narrow, one controller failed.
            # (Watchdog is the dead man's switch heartbeat: it always fires, by design.)
            firing = {a["labels"]["alertname"] for a in _firing(prom)} - {"Watchdog"}
            assert firing <= {"PcieLinkDowntrained", "InfinibandLinkDowned", "HostMemoryUncorrectableError"}
            # The rules' host roll-up has a series for the host (its value is the promtool test's concern).
            assert prom.query_value(f'{Records(CFG).host_fabric_errors}{{instance="{address}"}}') is not None
    finally:
        agent.terminate()
        agent.wait(timeout=20)
