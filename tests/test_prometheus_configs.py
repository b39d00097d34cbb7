"""Every Prometheus and Alertmanager configuration shipped in exporters/ passes the real checkers.

The files are found by what they hold, not by a list, so a new example is checked without anyone
remembering to add it here; a YAML file that is neither must be named below with what checks it.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.generate import GenerateConfig
from gen_helpers import REPO
from promkit import PROMTOOL, require_binary

EXPORTERS = REPO / "exporters"
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"

# Top-level keys of a Prometheus configuration file (prometheus/config/config.go, 2.42).
_PROMETHEUS_KEYS = {
    "global",
    "scrape_configs",
    "scrape_config_files",
    "rule_files",
    "alerting",
    "remote_write",
    "remote_read",
    "storage",
    "tracing",
}
# YAML in exporters/ that is not a Prometheus or Alertmanager config, and what checks it instead.
_OTHER = {
    "central/mimir.yaml": "Grafana Mimir's own config (no Mimir binary here; exporters/README.md)",
    "central/mimir-rules.yaml": "mimirtool rules; promtool check rules in test_distributed_configs.py",
    "central/thanos/objstore.yml": "Thanos object storage; no Thanos binary here",
    "remediate-policy.example.yaml": "babysitter remediate policy; test_remediate_policy.py",
}
# promtool flags by file: the per-rack config runs Prometheus in agent mode.
_FLAGS = {"prometheus-agent.yml": ["--agent"]}


@functools.cache
def _parsed(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506


def _load(path: Path) -> Any:
    """A fresh copy (tests rewrite what they load)."""
    return copy.deepcopy(_parsed(path))


def _kind(path: Path) -> str:
    data = _load(path)
    rel = path.relative_to(EXPORTERS).as_posix()
    if rel in _OTHER:
        return "other"
    if isinstance(data, dict) and {"apiVersion", "kind"} <= data.keys():
        return "kubernetes"
    if isinstance(data, dict) and {"route", "receivers"} <= data.keys():
        return "alertmanager"
    if isinstance(data, dict) and data and data.keys() <= _PROMETHEUS_KEYS:
        return "prometheus"
    return "unknown"


def _yaml_files() -> list[Path]:
    return sorted(p for p in EXPORTERS.rglob("*") if p.suffix in {".yml", ".yaml"})


def _of_kind(kind: str) -> list[Path]:
    return [p for p in _yaml_files() if _kind(p) == kind]


def _id(path: Path) -> str:
    return path.relative_to(EXPORTERS).as_posix()


def test_every_shipped_yaml_is_classified() -> None:
    """No YAML in exporters/ escapes the checks below: each is a Prometheus, Alertmanager or
    Kubernetes file, or named in _OTHER with what checks it (and those names still exist)."""
    unknown = [_id(p) for p in _yaml_files() if _kind(p) == "unknown"]
    assert unknown == [], f"classify these in {__file__}: {unknown}"
    for rel in _OTHER:
        assert (EXPORTERS / rel).is_file(), rel
    names = {_id(p) for p in _of_kind("prometheus")}
    # The single-server examples, one per way of finding hosts, and both tiers.
    assert {
        "prometheus-scrape.yml",
        "prometheus-slurm.yml",
        "prometheus-kubernetes.yml",
        "prometheus-agent.yml",
        "central/prometheus-central.yml",
    } <= names
    assert {_id(p) for p in _of_kind("alertmanager")} == {"alertmanager.yml"}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    require_binary(PROMTOOL, "promtool")
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _promtool_has_kubernetes_sd(tmp_path: Path) -> bool:
    """Debian's prometheus package is built without Kubernetes (and Consul...) service discovery."""
    probe = tmp_path / "k8s-probe.yml"
    probe.write_text("scrape_configs:\n  - job_name: probe\n    kubernetes_sd_configs: [{role: pod}]\n")
    return _promtool("check", "config", str(probe), cwd=tmp_path).returncode == 0


# Roles and keys of kubernetes_sd_configs in Prometheus 2.42 (discovery/kubernetes/kubernetes.go).
_K8S_ROLES = {"node", "pod", "service", "endpoints", "endpointslice", "ingress"}
_K8S_KEYS = {
    "role",
    "namespaces",
    "selectors",
    "api_server",
    "kubeconfig_file",
    "attach_metadata",
    "follow_redirects",
    "enable_http2",
    "tls_config",
    "authorization",
    "basic_auth",
    "oauth2",
    "proxy_url",
    "bearer_token",
    "bearer_token_file",
}


def _without_kubernetes_sd(config: dict[str, Any], targets: Path) -> dict[str, Any]:
    """The same config with each kubernetes_sd_configs block checked by hand and replaced by a file_sd
    block, so that promtool still checks everything else (relabelling, intervals, limits)."""
    for job in config["scrape_configs"]:
        blocks = job.pop("kubernetes_sd_configs", None)
        if blocks is None:
            continue
        for block in blocks:
            assert block["role"] in _K8S_ROLES, block
            assert block.keys() <= _K8S_KEYS, block
            assert set(block.get("namespaces", {})) <= {"names", "own_namespace"}, block
        job["file_sd_configs"] = [{"files": [str(targets)]}]
    return config


@pytest.mark.prometheus
@pytest.mark.parametrize("path", _of_kind("prometheus"), ids=_id)
def test_prometheus_config_passes_promtool(path: Path, tmp_path: Path) -> None:
    """promtool check config accepts every shipped Prometheus config (rule files resolved from the
    file's own directory, as Prometheus does)."""
    flags = _FLAGS.get(_id(path), [])
    config = _load(path)
    k8s_jobs = ["kubernetes_sd_configs" in job for job in config.get("scrape_configs", [])]
    # A Prometheus built without Kubernetes discovery (Debian's) rejects the whole file: an example
    # for hosts outside Kubernetes must not carry a Kubernetes job along (the Kubernetes example's
    # static jobs, Prometheus and Alertmanager scraping themselves, are fine there).
    assert "kubernetes" in _id(path) or not any(k8s_jobs), f"{_id(path)} carries Kubernetes discovery"
    uses_k8s = any(k8s_jobs)
    if uses_k8s and not _promtool_has_kubernetes_sd(tmp_path):
        # The check runs on a rewritten copy next to the original, so relative rule files still resolve.
        targets = tmp_path / "targets.json"
        targets.write_text("[]")
        rewritten = path.with_name(f".{path.stem}.check{path.suffix}")
        rewritten.write_text(yaml.safe_dump(_without_kubernetes_sd(config, targets)))
        try:
            result = _promtool("check", "config", *flags, rewritten.name, cwd=path.parent)
        finally:
            rewritten.unlink()
    else:
        result = _promtool("check", "config", *flags, path.name, cwd=path.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.prometheus
@pytest.mark.parametrize("path", _of_kind("alertmanager"), ids=_id)
def test_alertmanager_config_passes_amtool(path: Path) -> None:
    """amtool check-config accepts every shipped Alertmanager config."""
    if not Path(AMTOOL).exists():
        pytest.skip("amtool not installed (apt-get install prometheus-alertmanager)")
    result = subprocess.run([AMTOOL, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "name", ["prometheus-scrape.yml", "prometheus-slurm.yml", "prometheus-kubernetes.yml"]
)
def test_node_jobs_are_the_ones_the_rules_watch(name: str) -> None:
    """Each single-server example's jobs match the rules' node agent selector (a job named otherwise
    would never page NodeAgentDown) and keep instance, job and their target labels their own: no
    honor_labels (a trainer on one host could write into another's series), a trainer's value of a
    target label dropped rather than kept as exported_*."""
    selector = GenerateConfig().node_up_selector
    match = re.fullmatch(r'job=~"(.+)"', selector)
    assert match, selector
    jobs = [
        job for job in _load(EXPORTERS / name)["scrape_configs"] if job["job_name"] not in _MONITORING_JOBS
    ]
    assert jobs
    for job in jobs:
        assert re.fullmatch(match.group(1), job["job_name"]), job["job_name"]
        assert not job.get("honor_labels", False)
        assert {"action": "labeldrop", "regex": "exported_.*"} in job["metric_relabel_configs"]


#: The jobs that scrape the monitoring itself (generate/alerts/monitoring.py reads their series).
_MONITORING_JOBS = {"prometheus", "prometheus-central", "alertmanager"}


@pytest.mark.parametrize(
    "name",
    [
        "prometheus-scrape.yml",
        "prometheus-slurm.yml",
        "prometheus-kubernetes.yml",
        "central/prometheus-central.yml",
    ],
)
def test_every_server_scrapes_itself_and_alertmanager(name: str) -> None:
    """The alerts on failing rule evaluations and notifications read Prometheus's and Alertmanager's own
    series: every example of a Prometheus that evaluates the rules scrapes both (before: only the
    central one scraped itself, and none Alertmanager, so those alerts could never fire)."""
    jobs = {job["job_name"]: job for job in _load(EXPORTERS / name)["scrape_configs"]}
    targets = {
        name: [t for group in job.get("static_configs", []) for t in group["targets"]]
        for name, job in jobs.items()
    }
    assert any(
        t.endswith(":9090") for job in ("prometheus", "prometheus-central") for t in targets.get(job, [])
    )
    assert [t for t in targets.get("alertmanager", []) if t.endswith(":9093")], targets


@pytest.mark.prometheus
def test_slurm_example_discovers_hosts_from_file_sd(tmp_path: Path) -> None:
    """A real Prometheus running the Slurm example's job reads the file_sd JSON that slurm.md's
    script writes and labels each target with its Slurm node name."""
    from promkit import PrometheusServer

    (job,) = [
        j for j in _load(EXPORTERS / "prometheus-slurm.yml")["scrape_configs"] if "file_sd_configs" in j
    ]
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    # What the script in slurm.md writes for two nodes (nobody listens there: discovery is the point).
    entries = [{"targets": ["127.0.0.1:9", "localhost:9"], "labels": {"cluster": "provider-a"}}]
    (nodes / "slurm.json").write_text(json.dumps(entries))
    job["file_sd_configs"][0]["files"] = [str(nodes / "*.json")]
    with PrometheusServer(tmp_path, extra_scrape_configs=[job]) as prom:
        deadline = time.monotonic() + 20
        found: dict[str, dict[str, str]] = {}
        while time.monotonic() < deadline and len(found) < 2:
            with urllib.request.urlopen(f"{prom.url}/api/v1/targets", timeout=5) as response:  # noqa: S310
                active = json.loads(response.read())["data"]["activeTargets"]
            found = {
                t["labels"]["node"]: t["labels"] for t in active if t["labels"]["job"] == job["job_name"]
            }
            time.sleep(0.2)
    assert set(found) == {"127.0.0.1", "localhost"}
    assert all(labels["cluster"] == "provider-a" for labels in found.values())
