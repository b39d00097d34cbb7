"""The committed dashboards against Grafana's own dashboard model (no Grafana server runs here).

The model is ``grafana-foundation-sdk`` pinned to its Grafana 11.6 build (the test extra): Grafana
Labs generates it from the same CUE schemas Grafana 11.6 validates dashboards with, with one class per
panel plugin's options and field config and per data source's query. Two checks, both strict:

- **Every key is known.** A dashboard is decoded into the model and encoded back; a key the model does
  not know (a typo, an option of another panel type, a field in the wrong place) is dropped on the
  way and reported, at any depth: dashboard, panels, each plugin's ``options`` and ``fieldConfig``,
  Prometheus queries, variables, annotations. Each panel type must be a registered plugin and each
  query must decode as a Prometheus query (else the SDK would pass it through unchecked).
- **Every value has the model's type**: strings, numbers, booleans, and enums by their allowed values
  (threshold modes, draw styles, legend modes, ...).

Chosen over Grafana's published JSON schema because the package installs from PyPI in about a second
(330 kB, no dependencies) and is versioned by Grafana release, where the schema would be a vendored copy.
The model omits a few fields that Grafana itself stores and reads (``ALLOWED_EXTRA``, each with why).
"""

from __future__ import annotations

import enum
import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from gen_helpers import REPO

sdk = pytest.importorskip("grafana_foundation_sdk", reason="the test extra pins grafana-foundation-sdk")

from grafana_foundation_sdk.cog import plugins  # noqa: E402
from grafana_foundation_sdk.cog import runtime as cogruntime  # noqa: E402
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models import prometheus  # noqa: E402
from grafana_foundation_sdk.models.dashboard import Dashboard, DataTransformerConfig  # noqa: E402

plugins.register_default_plugins()

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))

#: Keys Grafana stores and reads that the 11.6 model leaves out (its classes say "TODO" there).
ALLOWED_EXTRA: dict[str, str] = {
    # A Prometheus annotation keeps the data source's own fields next to the generic ones; the model's
    # AnnotationQuery has only `expr` ("TODO.. this should just be a normal query target").
    "annotations/step": "Prometheus annotation: query step",
    "annotations/tagKeys": "Prometheus annotation: labels that become tags",
    "annotations/textFormat": "Prometheus annotation: text template",
    "annotations/titleFormat": "Prometheus annotation: title template",
    "annotations/useValueForTime": "Prometheus annotation: value is the event time",
    # Query variables: the editor's display string of the query (QueryVariableModel.definition).
    "templating/definition": "query variable: the query as the editor shows it",
}


def _generic(path: str) -> str:
    """``/annotations/list[2]/step`` -> ``annotations/step`` (the key of ALLOWED_EXTRA)."""
    parts = [part.split("[")[0] for part in path.strip("/").split("/")]
    parts = [part for part in parts if part != "list"]
    return f"{parts[0]}/{parts[-1]}" if len(parts) > 1 else parts[0]


def lost_keys(original: Any, encoded: Any, path: str = "") -> list[str]:
    """Paths of keys of ``original`` missing from ``encoded`` (the model did not know them)."""
    lost: list[str] = []
    if isinstance(original, dict) and isinstance(encoded, dict):
        for key, value in original.items():
            where = f"{path}/{key}"
            if key not in encoded:
                lost.append(where)
            else:
                lost += lost_keys(value, encoded[key], where)
    elif isinstance(original, list) and isinstance(encoded, list):
        if len(original) != len(encoded):
            return [f"{path} (length {len(original)} -> {len(encoded)})"]
        for index, (a, b) in enumerate(zip(original, encoded, strict=True)):
            lost += lost_keys(a, b, f"{path}[{index}]")
    return lost


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return value in {member.value for member in hint}
    if hint is bool:
        return isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type) and isinstance(value, dict) and hasattr(hint, "from_json"):
        return True  # left undecoded by the SDK (transformations): check() decodes and checks it
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a construct the check does not model (runtime variants): not judged


def wrong_types(obj: Any, path: str = "") -> list[str]:
    """Attributes of decoded model objects whose value does not have the model's type, recursively."""
    if isinstance(obj, list):
        return [found for i, item in enumerate(obj) for found in wrong_types(item, f"{path}[{i}]")]
    if not type(obj).__module__.startswith("grafana_foundation_sdk.models"):
        return []
    if isinstance(obj, enum.Enum):
        return []
    wrong: list[str] = []
    hints = typing.get_type_hints(type(obj))
    for name, hint in hints.items():
        value = getattr(obj, name, None)
        if not _matches(value, hint):
            wrong.append(f"{path}/{name}: {value!r} is not {hint}")
        wrong += wrong_types(value, f"{path}/{name}")
    return wrong


def check(model: dict[str, Any]) -> list[str]:
    """Everything Grafana's model finds wrong with a dashboard JSON model, as readable lines."""
    problems: list[str] = []
    decoded = Dashboard.from_json(model)
    encoded = json.loads(json.dumps(decoded, cls=JSONEncoder))
    for where in lost_keys(model, encoded):
        if _generic(where) not in ALLOWED_EXTRA:
            problems.append(f"unknown to Grafana's model: {where}")
    for index, panel in enumerate(decoded.panels or []):
        kind = getattr(panel, "type_val", None)
        if kind != "row" and cogruntime.panelcfg_config(kind or "") is None:
            problems.append(f"panels[{index}]: panel type {kind!r} is not a Grafana panel plugin")
        for number, raw in enumerate(getattr(panel, "transformations", None) or []):
            step = DataTransformerConfig.from_json(raw)
            where = f"/panels[{index}]/transformations[{number}]"
            again = json.loads(json.dumps(step, cls=JSONEncoder))
            problems += [f"unknown to Grafana's model: {lost}" for lost in lost_keys(raw, again, where)]
            problems += wrong_types(step, where)
        for target in getattr(panel, "targets", None) or []:
            if not isinstance(target, prometheus.Dataquery):
                problems.append(f"panels[{index}]: a query that is not a Prometheus query: {target!r}")
    problems += wrong_types(decoded)
    return problems


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_matches_grafana_model(path: Path) -> None:
    assert check(json.loads(path.read_text())) == []


def test_the_check_finds_what_it_is_for() -> None:
    """Not vacuous: a misplaced key, an unknown option, a wrong enum value, a wrong type, a panel type
    nobody ships and a misspelt transformation field are each reported."""
    model = json.loads((REPO / "dashboards/babysitter-cluster-scorecard.json").read_text())
    stat = next(p for p in model["panels"] if p["type"] == "bargauge")
    timeseries = next(p for p in model["panels"] if p["type"] == "timeseries")
    table = next(p for p in model["panels"] if p["type"] == "table")
    stat["fieldConfig"]["defaults"]["thresholds"]["mode"] = "absolut"
    stat["options"]["colourMode"] = "value"
    stat["title"] = 42
    timeseries["fieldConfig"]["defaults"]["custom"]["drawstyle"] = "line"
    timeseries["gridPos"]["width"] = 12
    table["transformations"][0]["option"] = {}
    model["panels"].append({**timeseries, "id": 999, "type": "graph-legacy"})
    found = "\n".join(check(model))
    needles = (
        "absolut",
        "colourMode",
        "title: 42",
        "drawstyle",
        "gridPos/width",
        "'graph-legacy'",
        "]/option",
    )
    for needle in needles:
        assert needle in found, (needle, found)
