"""Which generated rules a Prometheus has loaded, so ``explain`` reads them under their names.

explain reads recording rules whose names carry the rate window they were generated with
(``run_rank:train_step_duration_seconds:mean5m`` in the default profile, ``...:mean20s`` in the fast
one the demo loads). Asking the user for ``--rate-window`` made a newcomer guess; Prometheus says what
it evaluates (its rules API, through :meth:`PromClient.recording_rules`), so the config is read
from there: a named profile whose rule names are all loaded, else the default profile with the rate
window found in the loaded names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from babysitter.generate.config import PROFILES, GenerateConfig
from babysitter.generate.rules import Records
from babysitter.prom import PromClient, PromError

__all__ = ["LoadedRules", "config_from_rules", "detect_rules"]

_WINDOW = "7777777s"  # a placeholder no real config uses


@dataclass(frozen=True)
class LoadedRules:
    """The config explain reads the rules with, and how it was found (one line for the output)."""

    cfg: GenerateConfig
    how: str
    found: bool = True


def _names(cfg: GenerateConfig) -> set[str]:
    r = Records(cfg)
    return {r.rank_gpu, r.rank_step_mean, r.rank_step_ratio, r.rank_gpu_throttle}


def config_from_rules(
    loaded: set[str], *, cluster_label: str = "cluster", source: str = "loaded"
) -> LoadedRules:
    """The config whose rule names ``loaded`` (recording rule names Prometheus evaluates) holds."""
    for name, make in PROFILES.items():
        cfg = replace(make(), cluster_label=cluster_label)
        if _names(cfg) <= loaded:
            return LoadedRules(
                cfg, f"the {name} profile's rules (rate window {cfg.rate_window}), as {source}"
            )
    pattern = re.escape(Records(replace(GenerateConfig(), rate_window=_WINDOW)).rank_step_mean)
    pattern = pattern.replace(_WINDOW, r"(\d+[smhdwy])")
    for rule in sorted(loaded):
        match = re.fullmatch(pattern, rule)
        if match:
            cfg = replace(GenerateConfig(), rate_window=match.group(1), cluster_label=cluster_label)
            return LoadedRules(cfg, f"rate window {cfg.rate_window}, read from the {source} rule {rule}")
    cfg = replace(GenerateConfig(), cluster_label=cluster_label)
    return LoadedRules(
        cfg,
        f"no babysitter recording rules loaded or recorded: per-rank and per-GPU checks read nothing "
        f"(load alerts/babysitter-rules.yaml); assumed rate window {cfg.rate_window}",
        found=False,
    )


def detect_rules(client: PromClient, at: float, *, cluster_label: str = "cluster") -> LoadedRules:
    """The rules' config from what ``client`` evaluates, else from the rule series it holds (a query
    tier that stores what a separate ruler records lists no rules)."""
    try:
        loaded = client.recording_rules()
    except PromError:
        loaded = set()
    found = config_from_rules(loaded, cluster_label=cluster_label)
    if found.found:
        return found
    names = set().union(*(_names(replace(make(), cluster_label=cluster_label)) for make in PROFILES.values()))
    mean = Records(replace(GenerateConfig(), rate_window=_WINDOW)).rank_step_mean.replace(_WINDOW, "")
    # Rule names are [a-zA-Z0-9_:]: nothing to escape in the regex.
    selector = f'{{__name__=~"{mean}.+|{"|".join(sorted(names))}"}}'
    recorded = {x.labels.get("__name__", "") for x in client.query(f"count by (__name__) ({selector})", at)}
    return config_from_rules(recorded - {""}, cluster_label=cluster_label, source="recorded")
