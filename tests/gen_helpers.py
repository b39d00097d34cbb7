"""Helpers for the tests of generated monitoring (dashboards, rules, promtool tests)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.catalog import ALL
from babysitter.generate.rules import recording_rules

__all__ = [
    "GRAFANA_VARIABLES",
    "REPO",
    "dashboard_exprs",
    "known_series_names",
    "load_yaml",
    "promtool",
    "referenced_names",
    "require_promtool",
    "substitute_grafana",
]

REPO = Path(__file__).resolve().parents[1]
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

#: What Grafana substitutes for its built-in and our template variables, for running panel queries
#: outside Grafana: every selection matches everything, ranges are short enough for a short test run.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__range_s": "600",
    "$__range": "10m",
    "$__interval": "15s",
    "$cluster": ".*",
    "$run": ".*",
    "$instance": ".*",
    "$gpu": ".*",
}

_NAME = re.compile(r"(?<![A-Za-z0-9_:\"'$.])([a-z_][a-z0-9_]*(?::[a-z0-9_]+)*)(?=\s*(?:\{|\[|\)|$|\s|,))")
_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "quantile",
    "topk",
    "bottomk",
    "stddev",
    "stdvar",
    "count_values",
    "rate",
    "increase",
    "irate",
    "delta",
    "changes",
    "time",
    "vector",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "abs",
    "label_replace",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "quantile_over_time",
    "sum_over_time",
    "count_over_time",
    "label_values",
    "le",
    "inf",
    "nan",
}


def require_promtool() -> None:
    """Skip when promtool is missing (CI installs Debian's prometheus package)."""
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool not installed (apt-get install prometheus)")


def promtool(args: Sequence[str], cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run promtool with an argv list; never a shell."""
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def substitute_grafana(expr: str) -> str:
    """``expr`` with Grafana's variables replaced as :data:`GRAFANA_VARIABLES` says (longest first)."""
    for key in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(key, GRAFANA_VARIABLES[key])
    return expr


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels", []))


def dashboard_exprs(model: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of a dashboard model, variables' queries included."""
    found = [
        (panel["title"], target["expr"])
        for panel in _walk_panels(model["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in model["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(
                r"label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)", variable["query"]["query"]
            )
            if match is None:
                raise ValueError(f"variable {variable['name']}: not a label_values(selector, label) query")
            found.append((f"variable {variable['name']}", match.group(1)))
    return found


def known_series_names() -> set[str]:
    """Every series name the catalog and the recording rules define (histograms with their suffixes)."""
    names = {"up"}
    for spec in ALL:
        names.add(spec.name)
        if spec.kind == "histogram":
            names.update(f"{spec.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    from babysitter.generate.config import GenerateConfig

    names.update(record for record, _ in recording_rules(GenerateConfig()))
    return names


def referenced_names(expr: str) -> set[str]:
    """Identifiers in ``expr`` that look like series names (PromQL keywords and labels filtered out)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_matchers = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_by = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_matchers
    )
    names = {match.group(1) for match in _NAME.finditer(without_by)}
    return {
        name for name in names if name not in _PROMQL_WORDS and not re.fullmatch(r"[0-9a-z]*[0-9][hms]", name)
    }


def load_yaml(path: Path) -> Any:
    """Parse a YAML file."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))
