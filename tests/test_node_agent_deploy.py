"""The deployment examples in exporters/ agree with the agent: config keys, port, mounts, directories."""

from __future__ import annotations

import argparse
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from babysitter import registration
from babysitter.node.config import DEFAULT_PORT, add_arguments, load_config

EXPORTERS = Path(__file__).resolve().parent.parent / "exporters"


def test_example_config_file_loads() -> None:
    """The example config file passes the agent's own validation."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = load_config(parser.parse_args(["--config", str(EXPORTERS / "node-agent.example.json")]), {})
    assert config.bind_port == DEFAULT_PORT
    assert config.enabled("storage")


def test_systemd_unit_sets_what_the_agent_reads() -> None:
    """The unit's environment variables are ones the agent and trackers read."""
    unit = (EXPORTERS / "babysitter-node-agent.service").read_text()
    assert f"BABYSITTER_NODE_LISTEN_ADDRESS=0.0.0.0:{DEFAULT_PORT}" in unit
    assert f"{registration.ENV_DIR}=/tmp/babysitter" in unit
    assert "KillSignal=SIGTERM" in unit
    assert "CAP_SYSLOG" in unit


def test_registration_directory_is_root_owned_and_sticky_everywhere(tmp_path: Path) -> None:
    """systemd-tmpfiles creates the directory 1777 root before any user; the DynamicUser unit (whose
    /tmp is private) binds it read-only; the DaemonSet's init container makes kubelet's 0755 dir 1777."""
    tmpfiles = [
        line.split()
        for line in (EXPORTERS / "babysitter-tmpfiles.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert tmpfiles == [["d", "/tmp/babysitter", "1777", "root", "root", "-"]]
    unit = (EXPORTERS / "babysitter-node-agent.service").read_text()
    assert "BindReadOnlyPaths=/tmp/babysitter" in unit
    assert "ReadWritePaths=/tmp/babysitter" not in unit
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((EXPORTERS / "node-agent-daemonset.yaml").read_text())["spec"]["template"]["spec"]
    init = spec["initContainers"][0]
    assert "0o1777" in init["command"][-1]
    assert init["volumeMounts"] == [{"name": "registry", "mountPath": "/tmp/babysitter"}]
    registry = tmp_path / "registry"
    registry.mkdir(mode=0o755)
    script = init["command"][-1].replace("/tmp/babysitter", str(registry))
    subprocess.run([sys.executable, "-c", script], check=True)
    if registry.stat().st_uid == 0:
        assert stat.S_IMODE(registry.stat().st_mode) == 0o1777
    agent_mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert agent_mounts["/tmp/babysitter"]["readOnly"] is True


def test_daemonset_mounts_kmsg_registry_and_checkpoints() -> None:
    """The DaemonSet mounts /dev/kmsg read-only and the registration dir the trackers use."""
    yaml = pytest.importorskip("yaml")
    ds = yaml.safe_load((EXPORTERS / "node-agent-daemonset.yaml").read_text())
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert spec["hostPID"] is True
    container = spec["containers"][0]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/dev/kmsg"]["readOnly"] is True
    assert "/tmp/babysitter" in mounts
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[registration.ENV_DIR] == "/tmp/babysitter"
    assert env["BABYSITTER_NODE_LISTEN_ADDRESS"] == f"$(NODE_IP):{DEFAULT_PORT}"
    assert container["ports"][0]["containerPort"] == DEFAULT_PORT
    assert "SYSLOG" in container["securityContext"]["capabilities"]["add"]


def test_scrape_config_targets_the_agent_port() -> None:
    """The Prometheus example scrapes the agent's default port, without honor_labels (issue 21)."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((EXPORTERS / "prometheus-scrape.yml").read_text())
    static = config["scrape_configs"][0]
    assert all(t.endswith(f":{DEFAULT_PORT}") for t in static["static_configs"][0]["targets"])
    assert "honor_labels" not in static
    assert json.dumps(config)  # plain data
