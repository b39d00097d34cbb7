"""The distributed tier: per-rack Prometheus agents that remote_write, and the central tier's rules.

At thousands of hosts one Prometheus no longer holds the fleet. Each rack (or row) runs Prometheus in
agent mode: it scrapes its node agents, drops what nothing central reads, and remote-writes the rest
to Mimir, Thanos Receive, VictoriaMetrics or a central Prometheus, whose ruler evaluates the
generated recording and alert rules. Everything here is derived from what the generated rules,
alerts and dashboards, the scorecard and ``babysitter top`` read, so the drop list cannot remove a
series an alert needs, and it follows the catalog when either changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from babysitter import catalog
from babysitter.catalog import MetricSpec
from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import selfmon as S
from babysitter.catalog.budget import BUDGET, per_node
from babysitter.generate.alerts import alert_groups
from babysitter.generate.config import GenerateConfig
from babysitter.generate.dashboards import dashboards
from babysitter.generate.rules import recording_groups

__all__ = [
    "AgentSettings",
    "agent_config",
    "budget_comment",
    "central_expressions",
    "central_metrics",
    "dropped_metrics",
    "exposed_names",
    "mimir_rules",
    "rack_label",
]

_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
#: Kept although no rule reads them: babysitter's own error counters, which exist only once something
#: went wrong (or stay at one series per process), are what an operator looks at first centrally.
_SELF_ERRORS = (
    S.INTERNAL_ERRORS,
    S.INPUT_REJECTED,
    G.LEDGER_WRITE_ERRORS,
    G.LEDGER_DROPPED_RECORDS,
    N.GPU_QUERY_ERRORS,
)


def rack_label() -> str:
    """The external label each rack's agent adds, telling the central tier which agent sent a series."""
    return "rack"


@dataclass(frozen=True)
class AgentSettings:
    """Knobs of the per-rack agent configuration, each with why it has its value."""

    #: 15 s: the rules' 5 m rate windows then hold 20 samples (at least 4 are needed).
    scrape_interval: str = "15s"
    #: Above the node agent's own collector deadline (10 s), below the interval.
    scrape_timeout: str = "12s"
    #: GPUs and InfiniBand/RoCE ports per host the sample limit is sized for (and a PCIe device per GPU
    #: and per port); the host's trainers have their own hard bound (BUDGET.trainers).
    gpus_per_node: int = 8
    ports_per_node: int = 8
    #: Headroom over the host's own series budget before a target's scrape is refused: a refused
    #: scrape loses every series of the host (and pages NodeAgentDown), so it only stops a runaway
    #: exporter. The trainers' share is the agent's own hard bound (BUDGET.trainers), added whole: a
    #: user's trainers, however many series they serve, must never push the host over the limit.
    sample_limit_factor: float = 2.0
    #: Where remote_write sends; the central tier's push endpoint (see exporters/README.md).
    remote_write_url: str = "https://metrics.example.internal/api/v1/push"

    @property
    def sample_limit(self) -> int:
        """Samples one host's node agent target may serve per scrape."""
        own = per_node(self.gpus_per_node, 0, ports=self.ports_per_node)
        return round(own * self.sample_limit_factor) + BUDGET.trainers


def exposed_names(spec: MetricSpec) -> tuple[str, ...]:
    """The sample names a catalog entry appears under in an exposition."""
    return (spec.name, *(spec.name + suffix for suffix in _SUFFIXES.get(spec.kind, ())))


def _dashboard_exprs(cfg: GenerateConfig) -> Iterable[str]:
    def walk(node: object) -> Iterable[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    yield value
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    for board in dashboards(cfg):
        yield from walk(board.model())


def _scorecard_exprs() -> Iterable[str]:
    from babysitter.scorecard.queries import QuerySet

    queries = QuerySet()
    for name in dir(queries):
        attr = getattr(queries, name)
        if not name.startswith("_") and callable(attr) and name not in ("step_seconds",):
            try:
                value = attr()
            except TypeError:
                continue
            if isinstance(value, str):
                yield value


def central_expressions(cfg: GenerateConfig) -> list[str]:
    """Every PromQL expression the central tier evaluates or serves: rules, alerts, dashboards,
    the scorecard's queries and what ``babysitter top`` asks for."""
    from babysitter.views.top import PROMETHEUS_METRICS

    exprs = [
        str(rule["expr"])
        for groups in (recording_groups(cfg), alert_groups(cfg))
        for group in groups
        for rule in group["rules"]  # type: ignore[attr-defined]
    ]
    exprs += list(_dashboard_exprs(cfg))
    exprs += list(_scorecard_exprs())
    exprs += [name for spec in PROMETHEUS_METRICS for name in exposed_names(spec)]
    return exprs


def _token(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9_:]){re.escape(name)}(?![A-Za-z0-9_:])")


def central_metrics(cfg: GenerateConfig) -> frozenset[str]:
    """Names of the catalog entries some central expression reads."""
    text = "\n".join(central_expressions(cfg))
    return frozenset(
        spec.name for spec in catalog.ALL if any(_token(n).search(text) for n in exposed_names(spec))
    )


def dropped_metrics(cfg: GenerateConfig) -> tuple[str, ...]:
    """Exposed sample names of the catalog entries nothing central reads (kept on the hosts' /metrics)."""
    used = central_metrics(cfg) | {spec.name for spec in _SELF_ERRORS}
    return tuple(
        sorted(name for spec in catalog.ALL if spec.name not in used for name in exposed_names(spec))
    )


def agent_config(cfg: GenerateConfig, settings: AgentSettings | None = None) -> dict[str, object]:
    """A per-rack Prometheus configuration for ``--enable-feature=agent`` (see exporters/README.md)."""
    s = settings or AgentSettings()
    drop = dropped_metrics(cfg)
    node_job: dict[str, object] = {
        "job_name": "babysitter-node",
        # No honor_labels: instance and job are the scrape's, never a trainer's (docs/security.md).
        "scrape_interval": s.scrape_interval,
        "scrape_timeout": s.scrape_timeout,
        "sample_limit": s.sample_limit,
        # Trackers and the agent bound label values to 128 characters; the widest label set is
        # train_info's (19 with the target's), so 32 refuses only a runaway exporter. A refused
        # scrape loses the whole host: tests/test_two_tier.py scrapes through this job.
        "label_limit": 32,
        "label_value_length_limit": 256,
        "body_size_limit": "8MB",
        "file_sd_configs": [{"files": ["/etc/prometheus/babysitter-nodes/*.json"], "refresh_interval": "1m"}],
        "metric_relabel_configs": [
            {
                "source_labels": ["__name__"],
                "regex": "|".join(re.escape(name) for name in drop),
                "action": "drop",
            },
            # The cluster and rack come from the external labels alone, which never override a
            # label a series already has: a trainer's own value would otherwise put its series in
            # another cluster centrally. A trainer's value of a target label is dropped too.
            {"action": "labeldrop", "regex": f"exported_.*|{cfg.cluster_label}|{rack_label()}"},
        ],
    }
    self_job: dict[str, object] = {
        # The agent's own remote-write health, so the central tier sees a rack falling behind.
        "job_name": "prometheus-agent",
        "scrape_interval": s.scrape_interval,
        "static_configs": [{"targets": ["localhost:9090"]}],
        "metric_relabel_configs": [
            {
                "source_labels": ["__name__"],
                "regex": "prometheus_remote_storage_("
                "samples_(pending|failed_total|dropped_total|retried_total)"
                "|highest_timestamp_in_seconds|queue_highest_sent_timestamp_seconds|shards)"
                "|prometheus_agent_active_series|prometheus_target_scrapes_exceeded_sample_limit_total"
                "|prometheus_sd_discovered_targets",
                "action": "keep",
            }
        ],
    }
    return {
        "global": {
            "scrape_interval": s.scrape_interval,
            "scrape_timeout": s.scrape_timeout,
            # ${...} needs --enable-feature=expand-external-labels (set per rack by the deployment).
            "external_labels": {cfg.cluster_label: "${CLUSTER}", rack_label(): "${RACK}"},
        },
        "scrape_configs": [node_job, self_job],
        "remote_write": [
            {
                "url": s.remote_write_url,
                "remote_timeout": "30s",
                # Per rack (16-32 hosts, ~1-2k samples/s) one shard keeps up; the cap covers a
                # catch-up after the central tier was unreachable.
                "queue_config": {
                    "capacity": 10000,
                    "max_shards": 8,
                    "min_shards": 1,
                    "max_samples_per_send": 2000,
                    "batch_send_deadline": "5s",
                    "min_backoff": "100ms",
                    "max_backoff": "10s",
                },
                "metadata_config": {"send": True, "send_interval": "1m"},
            }
        ],
    }


def mimir_rules(cfg: GenerateConfig) -> dict[str, object]:
    """The generated recording and alert rules as one ``mimirtool rules load`` namespace file."""
    return {"namespace": "babysitter", "groups": [*recording_groups(cfg), *alert_groups(cfg)]}


def budget_comment() -> tuple[str, ...]:
    """Comment lines that say where the sample limit comes from."""
    s = AgentSettings()
    devices = s.gpus_per_node + s.ports_per_node
    return (
        f"sample_limit {s.sample_limit} = {s.sample_limit_factor:g} x the own series budget of a host with "
        f"{s.gpus_per_node} GPUs and {s.ports_per_node} fabric ports",
        f"({BUDGET.host} host + {s.gpus_per_node} x {BUDGET.gpu} per GPU",
        f"+ {s.ports_per_node} x {BUDGET.fabric_port} per port + {devices} x {BUDGET.pcie_device} per PCIe "
        f"device + {s.gpus_per_node} x {BUDGET.gpu_nic} GPU-NIC + {BUDGET.host_hardware} host hardware)",
        f"+ {BUDGET.trainers} for all its trainers, the node agent's hard bound on them "
        "(src/babysitter/catalog/budget.py).",
    )
