"""What a person reads at 3 a.m.: colours that mean something, a unit per table column, and the events
of a run (restarts, checkpoint saves, Xids, hangs) drawn on its time series."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from babysitter.generate import GenerateConfig
from babysitter.generate.dashboards._builder import Column, Panel, Steps, Target
from gen_helpers import REPO

CFG = GenerateConfig()
FILES = sorted((REPO / "dashboards").glob("*.json"))


def _model(name: str) -> dict[str, Any]:
    return json.loads((REPO / "dashboards" / name).read_text())


def _panel(board: str, title: str) -> dict[str, Any]:
    return next(p for p in _model(board)["panels"] if p["title"] == title)


def _steps(panel: dict[str, Any]) -> list[tuple[float | None, str]]:
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [(step["value"], step["color"]) for step in steps]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_stat_is_green_whatever_its_value(path: Path) -> None:
    """A stat or bar gauge coloured by thresholds has either real steps or the neutral text colour."""
    for panel in json.loads(path.read_text())["panels"]:
        if panel["type"] in ("stat", "bargauge"):
            steps = _steps(panel)
            assert len(steps) > 1 or steps == [(None, "text")], (panel["title"], steps)


@pytest.mark.parametrize(
    ("board", "title", "expected"),
    [
        ("babysitter-run-overview.json", "MFU", [(None, "red"), (0.2, "orange"), (0.35, "green")]),
        ("babysitter-run-overview.json", "MFU and HFU", [(None, "red"), (0.2, "orange"), (0.35, "green")]),
        ("babysitter-run-overview.json", "Goodput", [(None, "red"), (0.75, "orange"), (0.9, "green")]),
        (
            "babysitter-run-overview.json",
            "Last checkpoint age",
            [(None, "green"), (3600, "orange"), (CFG.checkpoint_overdue_max_seconds, "red")],
        ),
        ("babysitter-node-health.json", "GPU temperature", [(None, "green"), (80, "orange"), (87, "red")]),
        ("babysitter-cluster-scorecard.json", "Goodput", [(None, "red"), (0.75, "orange"), (0.9, "green")]),
    ],
)
def test_thresholds_mean_something(board: str, title: str, expected: list[tuple[float | None, str]]) -> None:
    """MFU, goodput, checkpoint age and temperature change colour where the config says they should
    (every panel of that title: the run overview has a stat and a time series of each)."""
    panels = [p for p in _model(board)["panels"] if p["title"] == title]
    assert panels
    for panel in panels:
        assert _steps(panel) == expected, (title, panel["type"])


def test_the_goodput_amber_band_ends_at_the_alert_threshold() -> None:
    """Green starts where TrainingGoodputLow stops firing: the dashboard and the alert agree."""
    assert _steps(_panel("babysitter-run-overview.json", "Goodput"))[-1] == (CFG.goodput_target, "green")


def test_temperature_colours_only_the_die() -> None:
    """HBM has other limits: the coloured panel reads the GPU sensor only."""
    coloured = _panel("babysitter-node-health.json", "GPU temperature")
    assert all('sensor="gpu"' in t["expr"] for t in coloured["targets"])
    assert _steps(_panel("babysitter-node-health.json", "Memory temperature")) == [(None, "text")]


def test_scorecard_table_has_a_unit_per_column() -> None:
    """Ratios as percent, bytes/s, seconds: one unit for the whole table fits none of them."""
    table = _panel("babysitter-cluster-scorecard.json", "Scorecard")
    renames = table["transformations"][1]["options"]["renameByName"]
    units = {}
    for override in table["fieldConfig"]["overrides"]:
        assert override["matcher"]["id"] == "byName"
        props = {prop["id"]: prop["value"] for prop in override["properties"]}
        units[override["matcher"]["options"]] = props["unit"]
    assert units == {
        "MFU p50 of runs": "percentunit",
        "MFU p10 of runs": "percentunit",
        "goodput": "percentunit",
        "interruptions / 1000 rank-h": "short",
        "ckpt save B/s per rank": "Bps",
        "storage probe p99": "s",
        "GPU time lost to slow steps": "percentunit",
        "GPU time lost to failures": "percentunit",
    }
    assert set(units) == set(renames.values()) - {"cluster"}


def test_run_overview_annotates_restarts_saves_xids_and_hangs() -> None:
    """Four Prometheus annotation queries on the run's own data source, each templated by run."""
    annotations = _model("babysitter-run-overview.json")["annotations"]["list"]
    by_name = {item["name"]: item for item in annotations}
    assert set(by_name) == {"Restarts", "Checkpoint saves", "Xid errors", "Hangs"}
    for item in annotations:
        assert item["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert item["enable"] and item["titleFormat"] and item["step"] == "1m"
        assert "$cluster" in item["expr"]
    assert "gpu_xid_errors_total" in by_name["Xid errors"]["expr"]
    assert "train_steps_total" in by_name["Xid errors"]["expr"]  # only the hosts the run uses
    assert "train_hangs_total" in by_name["Hangs"]["expr"]
    assert "train_checkpoint_last_success_timestamp_seconds" in by_name["Checkpoint saves"]["expr"]


class TestBuilder:
    def test_steps_must_ascend(self) -> None:
        with pytest.raises(ValueError, match="ascend"):
            Steps("red", ((0.5, "green"), (0.2, "orange")))

    def test_red_above_or_thresholds_not_both(self) -> None:
        with pytest.raises(ValueError, match="not both"):
            Panel("x", (Target("up"),), red_above=1, thresholds=Steps("green", ((2, "red"),)))

    def test_a_column_format_must_name_a_shown_column(self) -> None:
        with pytest.raises(ValueError, match="does not show"):
            Panel(
                "t",
                (Target("up"),),
                kind="table",
                columns=(("Value", "v"),),
                column_formats=(Column("w", "s"),),
            )

    def test_a_config_with_colours_out_of_order_is_refused(self) -> None:
        with pytest.raises(ValueError, match="mfu_poor < mfu_good"):
            GenerateConfig(mfu_poor=0.4, mfu_good=0.3)
        with pytest.raises(ValueError, match="gpu_temperature_warm"):
            GenerateConfig(gpu_temperature_warm=90)

    def test_a_short_overdue_cap_still_colours_in_order(self) -> None:
        """A team that caps CheckpointOverdue at 30 min gets amber at 15 min, not a refused config."""
        from babysitter.generate.dashboards._common import checkpoint_age_steps

        steps = checkpoint_age_steps(GenerateConfig(checkpoint_overdue_max_seconds=1800))
        assert steps.steps == ((900, "orange"), (1800, "red"))
