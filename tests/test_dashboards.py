"""Dashboard models: valid Grafana JSON, templated by data source, cluster and run; PromQL that parses."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from babysitter.generate import GenerateConfig
from babysitter.generate.dashboards import dashboards
from babysitter.generate.dashboards._builder import Panel, Target
from babysitter.generate.yamlout import dump
from gen_helpers import (
    REPO,
    dashboard_exprs,
    known_series_names,
    promtool,
    referenced_names,
    require_promtool,
    substitute_grafana,
)

FILES = sorted((REPO / "dashboards").glob("*.json"))
RUN_DASHBOARDS = {"babysitter-run-overview.json", "babysitter-stragglers.json"}


def _model(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _datasources(value: object) -> Iterator[object]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "datasource":
                yield item
            else:
                yield from _datasources(item)
    elif isinstance(value, list):
        for item in value:
            yield from _datasources(item)


def test_the_four_dashboards_are_committed() -> None:
    """Run overview, stragglers, node health and the cluster scorecard."""
    assert [path.name for path in FILES] == sorted(board.file_name for board in dashboards(GenerateConfig()))
    assert len(FILES) == 4


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
class TestModel:
    def test_schema_uid_and_title(self, path: Path) -> None:
        """schemaVersion is set and the uid is the md5 of the file name (stable across regenerations)."""
        model = _model(path)
        assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
        assert model["uid"] == hashlib.md5(path.name.encode(), usedforsecurity=False).hexdigest()
        assert len(model["uid"]) <= 40  # Grafana's limit
        assert model["title"].startswith("babysitter / ")

    def test_panel_ids_unique_and_layout_fits(self, path: Path) -> None:
        """Every panel has a unique id and a grid position inside 24 columns, with no two overlapping."""
        panels = _model(path)["panels"]
        ids = [panel["id"] for panel in panels]
        assert len(ids) == len(set(ids))
        cells: set[tuple[int, int]] = set()
        for panel in panels:
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0
            area = {
                (x, y)
                for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])
            }
            assert not area & cells, panel["title"]
            cells |= area

    def test_datasource_is_a_variable_never_a_uid(self, path: Path) -> None:
        """A datasource variable exists and every datasource reference points at it."""
        model = _model(path)
        variables = {v["name"]: v for v in model["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        refs = list(_datasources(model["panels"])) + list(_datasources(model["templating"]["list"]))
        assert refs
        assert all(ref == {"type": "prometheus", "uid": "${datasource}"} for ref in refs)

    def test_cluster_and_run_variables(self, path: Path) -> None:
        """Every dashboard filters by cluster; run dashboards also by run; the filters are used."""
        model = _model(path)
        names = {v["name"] for v in model["templating"]["list"]}
        exprs = " ".join(expr for _, expr in dashboard_exprs(model))
        assert "cluster" in names and "$cluster" in exprs
        if path.name in RUN_DASHBOARDS:
            assert "run" in names and "$run" in exprs

    def test_targets(self, path: Path) -> None:
        """Every panel (except rows) has queries with unique refIds and non-empty PromQL."""
        for panel in _model(path)["panels"]:
            if panel["type"] == "row":
                continue
            refs = [target["refId"] for target in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), panel["title"]
            assert all(target["expr"].strip() for target in panel["targets"])

    def test_queries_name_only_existing_series(self, path: Path) -> None:
        """Every series a query names is in the catalog or the recording rules."""
        known = known_series_names()
        for title, expr in dashboard_exprs(_model(path)):
            assert referenced_names(substitute_grafana(expr)) <= known, (title, expr)


@pytest.mark.prometheus
def test_every_query_parses(tmp_path: Path) -> None:
    """promtool parses every panel and variable query (Grafana variables substituted)."""
    require_promtool()
    rules = []
    for path in FILES:
        for index, (_title, expr) in enumerate(dashboard_exprs(_model(path))):
            rules.append(
                {
                    "record": f"dashboard_check:{path.stem.replace('-', '_')}:q{index}",
                    "expr": substitute_grafana(expr),
                }
            )
    (tmp_path / "rules.yaml").write_text(dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = promtool(["check", "rules", "rules.yaml"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout


@pytest.mark.prometheus
def test_promtool_parse_check_catches_a_bad_query(tmp_path: Path) -> None:
    """The parse check above can fail: a query with an unbalanced bracket is rejected."""
    require_promtool()
    rules = [{"record": "dashboard_check:bad", "expr": "sum(rate(x[5m])"}]
    (tmp_path / "rules.yaml").write_text(dump({"groups": [{"name": "d", "rules": rules}]}))
    assert promtool(["check", "rules", "rules.yaml"], tmp_path).returncode != 0


class TestBuilder:
    def test_panel_needs_a_query_and_a_sane_width(self) -> None:
        """Mistakes in a dashboard definition fail when it is built."""
        with pytest.raises(ValueError, match="no query"):
            Panel("empty", ())
        with pytest.raises(ValueError, match="width"):
            Panel("wide", (Target("up"),), width=25)

    def test_cluster_label_reaches_variables(self) -> None:
        """With cluster_label='provider', the cluster variable reads that label."""
        board = dashboards(GenerateConfig(cluster_label="provider"))[0].model()
        cluster = next(v for v in board["templating"]["list"] if v["name"] == "cluster")
        assert cluster["query"]["query"].endswith(", provider)")
