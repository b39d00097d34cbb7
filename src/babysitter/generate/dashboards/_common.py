"""What the dashboards share: template variables and the matchers that apply them."""

from __future__ import annotations

from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.dashboards._builder import Steps, Variable
from babysitter.generate.promql import join_matchers, select

__all__ = [
    "checkpoint_age_steps",
    "goodput_steps",
    "gpu_matchers",
    "host_matchers",
    "mfu_steps",
    "node_variables",
    "rec",
    "run_filter",
    "run_matchers",
    "run_variables",
    "temperature_steps",
    "var_matcher",
]


def var_matcher(label: str, variable: str) -> str:
    """``label=~"$variable"`` (multi-value variables expand to a regex alternation)."""
    return f'{label}=~"${variable}"'


def run_variables(cfg: GenerateConfig) -> tuple[Variable, ...]:
    """``cluster`` and ``run`` of training runs."""
    c, ts = cfg.cluster_label, cfg.tracker_selector
    return (
        Variable("cluster", f"label_values({select(T.STEPS, ts)}, {c})", "Cluster"),
        Variable("run", f"label_values({select(T.STEPS, ts, var_matcher(c, 'cluster'))}, run)", "Run"),
    )


def run_matchers(cfg: GenerateConfig) -> str:
    """Tracker series of the selected clusters and runs."""
    return join_matchers(
        cfg.tracker_selector, var_matcher(cfg.cluster_label, "cluster"), var_matcher("run", "run")
    )


def node_variables(cfg: GenerateConfig) -> tuple[Variable, ...]:
    """``cluster``, ``instance`` (host) and ``gpu`` of node agent series."""
    c, ns = cfg.cluster_label, cfg.node_selector
    in_cluster = var_matcher(c, "cluster")
    on_host = var_matcher("instance", "instance")
    return (
        Variable("cluster", f"label_values({select(N.GPU_UP, ns)}, {c})", "Cluster"),
        Variable("instance", f"label_values({select(N.GPU_UP, ns, in_cluster)}, instance)", "Host"),
        Variable("gpu", f"label_values({select(N.GPU_UP, ns, in_cluster, on_host)}, gpu)", "GPU"),
    )


def host_matchers(cfg: GenerateConfig) -> str:
    """Node agent series of the selected clusters and hosts (storage, collectors)."""
    return join_matchers(
        cfg.node_selector, var_matcher(cfg.cluster_label, "cluster"), var_matcher("instance", "instance")
    )


def gpu_matchers(cfg: GenerateConfig) -> str:
    """Per-GPU series of the selected clusters, hosts and GPUs."""
    return join_matchers(host_matchers(cfg), var_matcher("gpu", "gpu"))


def run_filter(cfg: GenerateConfig) -> str:
    """Cluster and run matchers alone, for recording rule series (they carry no job or instance)."""
    return join_matchers(var_matcher(cfg.cluster_label, "cluster"), var_matcher("run", "run"))


def rec(name: str, matchers: str) -> str:
    """A recording rule's series with matchers."""
    return f"{name}{{{matchers}}}" if matchers else name


# --- colours that mean something: each from the config, next to the alert threshold it echoes ---------


def mfu_steps(cfg: GenerateConfig) -> Steps:
    """Red below ``mfu_poor``, amber below ``mfu_good``, green from there."""
    return Steps("red", ((cfg.mfu_poor, "orange"), (cfg.mfu_good, "green")))


def goodput_steps(cfg: GenerateConfig) -> Steps:
    """Red below ``goodput_poor``, amber below ``goodput_target`` (TrainingGoodputLow), green above."""
    return Steps("red", ((cfg.goodput_poor, "orange"), (cfg.goodput_target, "green")))


def checkpoint_age_steps(cfg: GenerateConfig) -> Steps:
    """Green, amber from ``checkpoint_age_warn_seconds`` (at most half the overdue cap, so a config
    with a short cap still colours in order), red from the overdue cap."""
    cap = cfg.checkpoint_overdue_max_seconds
    return Steps("green", ((min(cfg.checkpoint_age_warn_seconds, cap // 2), "orange"), (cap, "red")))


def temperature_steps(cfg: GenerateConfig) -> Steps:
    """Green, amber from ``gpu_temperature_warm``, red from ``gpu_temperature_hot`` (Celsius)."""
    return Steps("green", ((cfg.gpu_temperature_warm, "orange"), (cfg.gpu_temperature_hot, "red")))
