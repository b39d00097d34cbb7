"""The distributed tier's configurations: valid for the real binaries, and never dropping what is read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from babysitter import catalog
from babysitter.catalog.budget import BUDGET, per_node
from babysitter.generate import GenerateConfig
from babysitter.generate.distributed import (
    AgentSettings,
    central_expressions,
    central_metrics,
    dropped_metrics,
    exposed_names,
)
from gen_helpers import REPO
from promkit import PROMTOOL, require_binary

AGENT = REPO / "exporters/prometheus-agent.yml"
CENTRAL = REPO / "exporters/central"


def _promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    require_binary(PROMTOOL, "promtool")
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.prometheus
def test_agent_config_is_valid_for_prometheus_in_agent_mode() -> None:
    """promtool accepts the generated per-rack config in agent mode (and it has no rules to run)."""
    result = _promtool("check", "config", "--agent", str(AGENT))
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(AGENT.read_text())
    assert "rule_files" not in config and config["remote_write"]


@pytest.mark.prometheus
def test_central_prometheus_config_and_its_rule_files_are_valid() -> None:
    """The central Prometheus example loads the generated rule files by their relative paths."""
    result = _promtool("check", "config", "prometheus-central.yml", cwd=CENTRAL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "rule files found" in result.stdout


@pytest.mark.prometheus
def test_mimir_namespace_file_holds_every_generated_rule(tmp_path: Path) -> None:
    """mimirtool's namespace file is the rule groups of alerts/ under one namespace, valid for promtool."""
    mimir = yaml.safe_load((CENTRAL / "mimir-rules.yaml").read_text())
    assert mimir["namespace"] == "babysitter"
    groups = tmp_path / "groups.yaml"
    groups.write_text(yaml.safe_dump({"groups": mimir["groups"]}))
    result = _promtool("check", "rules", str(groups))
    assert result.returncode == 0, result.stdout + result.stderr
    committed = [
        group
        for name in ("babysitter-rules.yaml", "babysitter-alerts.yaml")
        for group in yaml.safe_load((REPO / "alerts" / name).read_text())["groups"]
    ]
    assert mimir["groups"] == committed


def test_the_drop_list_spares_every_series_a_rule_dashboard_or_query_reads() -> None:
    """The agent's drop regex, applied as Prometheus does (anchored), matches no name that is read."""
    cfg = GenerateConfig()
    config = yaml.safe_load(AGENT.read_text())
    drop, labels = config["scrape_configs"][0]["metric_relabel_configs"]
    assert drop["action"] == "drop"
    # ...and the labels only the scrape and the external labels may set are dropped from what is served.
    assert labels == {"action": "labeldrop", "regex": f"exported_.*|{cfg.cluster_label}|rack"}
    pattern = re.compile(drop["regex"])
    text = "\n".join(central_expressions(cfg))
    used = central_metrics(cfg)
    assert used, "no catalog metric found in the generated expressions"
    for spec in catalog.ALL:
        for name in exposed_names(spec):
            if spec.name in used:
                assert not pattern.fullmatch(name), f"{name} is read centrally but dropped"
    # Something is dropped, and each dropped name is really absent from every expression.
    assert dropped_metrics(cfg)
    for name in dropped_metrics(cfg):
        assert pattern.fullmatch(name)
        assert not re.search(rf"(?<![A-Za-z0-9_:]){name}(?![A-Za-z0-9_:])", text), name


def test_sample_limit_leaves_headroom_over_a_full_hosts_budget() -> None:
    """A host with 8 GPUs and 8 ranks at its full budget is far from the limit that would refuse it, and
    so is a host whose trainers serve all the node agent lets them (no user can push it over)."""
    config = yaml.safe_load(AGENT.read_text())
    limit = config["scrape_configs"][0]["sample_limit"]
    assert limit == AgentSettings().sample_limit
    full = per_node(8, 8)
    fabric = 8 * BUDGET.fabric_port + 16 * BUDGET.pcie_device + 8 * BUDGET.gpu_nic + BUDGET.host_hardware
    assert full == BUDGET.host + 8 * BUDGET.gpu + 7 * BUDGET.rank + BUDGET.rank0 + fabric
    assert limit >= 1.5 * full
    assert limit >= per_node(8, 0) + BUDGET.trainers


def test_kubernetes_podmonitors_match_the_daemonset_and_the_budget() -> None:
    """The node agent PodMonitor selects the DaemonSet's pods and port, with the generated sample limit;
    both PodMonitors give the jobs the rules select on."""
    daemonset = yaml.safe_load((REPO / "exporters/node-agent-daemonset.yaml").read_text())
    agent = yaml.safe_load((REPO / "exporters/node-agent-podmonitor.yaml").read_text())
    trainers = yaml.safe_load((REPO / "exporters/trainer-podmonitor.yaml").read_text())
    pod = daemonset["spec"]["template"]
    assert agent["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    (endpoint,) = agent["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and not endpoint.get("honorLabels", False)
    assert {"action": "labeldrop", "regex": "exported_.*"} in endpoint["metricRelabelings"]
    assert agent["spec"]["sampleLimit"] == AgentSettings().sample_limit
    cfg = GenerateConfig()
    for monitor, selector in ((agent, cfg.node_up_selector), (trainers, cfg.tracker_up_selector)):
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        (job,) = [r["replacement"] for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
        wanted = re.fullmatch(r'job=~"(.*)"', selector)
        assert wanted and re.fullmatch(wanted.group(1), job), (job, selector)


def test_label_limit_fits_the_widest_catalog_series() -> None:
    """train_info's label set (with run, rank, cluster, instance, job) stays under the agent's label_limit,
    which would otherwise refuse the whole host's scrape (it did, once train_info grew parallel labels)."""
    from babysitter.catalog.train import TRACKER_LABELS

    config = yaml.safe_load(AGENT.read_text())
    limit = config["scrape_configs"][0]["label_limit"]
    widest = max(len(spec.labels) for spec in catalog.ALL) + len(TRACKER_LABELS) + 3  # cluster, instance, job
    assert widest + 8 <= limit, (widest, limit)  # room for the user's constant labels
