"""A small typed builder of Grafana dashboard models as plain dicts.

Why not grafanalib: its last release (0.7.1) is from January 2024 and it still emits legacy ``graph``
panels by default; grafana-foundation-sdk ties the generator to one Grafana release's classes (the
tests use it to validate the output instead). The model is plain JSON, so a few dataclasses give
full control, no dependency, and byte-identical output.
Every panel's data source is the ``${datasource}`` variable: no data source uid is ever hard-coded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DATASOURCE",
    "SCHEMA_VERSION",
    "Annotation",
    "Column",
    "Dashboard",
    "Panel",
    "Row",
    "Steps",
    "Target",
    "Variable",
    "stable_uid",
]

#: Grafana's dashboard schema version these models follow (Grafana 10.4 / 11).
SCHEMA_VERSION = 39
#: Every panel and query variable reads the data source chosen in the ``datasource`` variable.
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}

PanelKind = Literal["timeseries", "stat", "heatmap", "table", "bargauge"]
_GRID_WIDTH = 24
#: Colour of a value nothing says is good or bad (Grafana's text colour): a stat without thresholds
#: must not be green whatever its value.
NEUTRAL = "text"


@dataclass(frozen=True)
class Steps:
    """Threshold colours: ``base`` below the first step, then ``(from value, colour)`` ascending."""

    base: str
    steps: tuple[tuple[float, str], ...] = ()

    def __post_init__(self) -> None:
        values = [value for value, _ in self.steps]
        if values != sorted(values) or len(set(values)) != len(values):
            raise ValueError(f"threshold steps must ascend: {values}")

    def model(self) -> dict[str, object]:
        """Grafana's ``thresholds`` object."""
        steps: list[dict[str, object]] = [{"color": self.base, "value": None}]
        steps += [{"color": color, "value": value} for value, color in self.steps]
        return {"mode": "absolute", "steps": steps}


@dataclass(frozen=True)
class Column:
    """Unit (and optionally colours) of one table column, by its displayed name."""

    name: str
    unit: str
    steps: Steps | None = None
    decimals: int | None = None

    def override(self) -> dict[str, object]:
        """A field override matching the column by name."""
        props: list[dict[str, object]] = [{"id": "unit", "value": self.unit}]
        if self.decimals is not None:
            props.append({"id": "decimals", "value": self.decimals})
        if self.steps is not None:
            props.append({"id": "thresholds", "value": self.steps.model()})
            props.append({"id": "custom.cellOptions", "value": {"type": "color-text"}})
        return {"matcher": {"id": "byName", "options": self.name}, "properties": props}


@dataclass(frozen=True)
class Annotation:
    """A Prometheus annotation query: every step where ``expr`` has a sample marks an event."""

    name: str
    expr: str
    color: str
    title: str
    text: str = ""
    tag_keys: tuple[str, ...] = ()
    step: str = "1m"

    def model(self) -> dict[str, object]:
        """The annotation as Grafana stores it (the Prometheus data source's own fields)."""
        return {
            "datasource": dict(DATASOURCE),
            "enable": True,
            "expr": self.expr,
            "hide": False,
            "iconColor": self.color,
            "name": self.name,
            "step": self.step,
            "tagKeys": ",".join(self.tag_keys),
            "textFormat": self.text,
            "titleFormat": self.title,
            "useValueForTime": False,
        }


def stable_uid(file_name: str) -> str:
    """A dashboard uid that never changes for a given file name (kubernetes-mixin: md5 of the name)."""
    return hashlib.md5(file_name.encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    #: ``instant`` for tables and stats of the current value; ``heatmap`` for ``le`` buckets.
    mode: Literal["range", "instant", "heatmap"] = "range"

    def model(self, ref_id: str) -> dict[str, object]:
        """The target as Grafana stores it."""
        target: dict[str, object] = {
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "refId": ref_id,
        }
        if self.mode == "instant":
            target.update(instant=True, range=False, format="table")
        else:
            target.update(instant=False, range=True)
            if self.mode == "heatmap":
                target["format"] = "heatmap"
        return target


@dataclass(frozen=True)
class Panel:
    """One visualization; ``width`` is in grid units of 24, panels flow left to right."""

    title: str
    targets: tuple[Target, ...]
    kind: PanelKind = "timeseries"
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    #: For timeseries: ``normal`` stacks series (badput by cause adds up to wall time).
    stack: bool = False
    bars: bool = False
    #: Value above which a stat or line turns red (alert thresholds drawn on the panel).
    red_above: float | None = None
    #: Colours by value (a stat's value, a line's bands); without them and ``red_above`` a stat is
    #: neutral, never green by default.
    thresholds: Steps | None = None
    #: Column renames of a table panel built from several instant queries (``Value #A`` -> name).
    columns: tuple[tuple[str, str], ...] = ()
    #: Units (and colours) of a table's columns, by displayed name: one unit per panel cannot fit a
    #: table whose columns are ratios, rates, bytes/s and seconds.
    column_formats: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError(f"panel {self.title!r} has no query")
        if not 1 <= self.width <= _GRID_WIDTH:
            raise ValueError(f"panel {self.title!r}: width must be 1..{_GRID_WIDTH}")
        if self.red_above is not None and self.thresholds is not None:
            raise ValueError(f"panel {self.title!r}: red_above or thresholds, not both")
        shown = {name for _, name in self.columns}
        unknown = [col.name for col in self.column_formats if col.name not in shown]
        if unknown:
            raise ValueError(f"panel {self.title!r}: formats for columns it does not show: {unknown}")

    def _steps(self) -> Steps | None:
        if self.red_above is not None:
            return Steps("green", ((self.red_above, "red"),))
        return self.thresholds

    def _field_defaults(self) -> dict[str, object]:
        defaults: dict[str, object] = {"unit": self.unit}
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        steps = self._steps()
        defaults["thresholds"] = (steps or Steps(NEUTRAL)).model()
        if self.kind == "timeseries":
            custom: dict[str, object] = {
                "drawStyle": "bars" if self.bars else "line",
                "fillOpacity": 60 if self.stack or self.bars else 10,
                "lineWidth": 1,
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"group": "A", "mode": "normal" if self.stack else "none"},
                "thresholdsStyle": {"mode": "off" if steps is None else "line"},
            }
            defaults["custom"] = custom
            defaults["color"] = {"mode": "palette-classic"}
        elif self.kind in ("stat", "bargauge"):
            defaults["color"] = {"mode": "thresholds"}
        return defaults

    def _options(self) -> dict[str, object]:
        reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
        if self.kind == "timeseries":
            return {
                "legend": {
                    "calcs": ["mean", "max"],
                    "displayMode": "table",
                    "placement": "bottom",
                    "showLegend": True,
                },
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        if self.kind == "stat":
            return {
                "colorMode": "value",
                "graphMode": "area",
                "justifyMode": "auto",
                "orientation": "auto",
                "reduceOptions": reduce,
                "textMode": "auto",
            }
        if self.kind == "bargauge":
            return {
                "displayMode": "gradient",
                "orientation": "horizontal",
                "reduceOptions": reduce,
                "showUnfilled": True,
            }
        if self.kind == "heatmap":
            return {
                "calculate": False,
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                "legend": {"show": True},
                # Grafana 11's heatmap tooltip has a mode; ``show`` was the old panel's (ignored).
                "tooltip": {"mode": "single", "yHistogram": False},
                "yAxis": {"axisPlacement": "left", "unit": self.unit},
            }
        return {"cellHeight": "sm", "showHeader": True}

    def model(self, panel_id: int, x: int, y: int) -> dict[str, object]:
        """The panel as Grafana stores it, placed at (x, y)."""
        refs = [chr(ord("A") + index) for index in range(len(self.targets))]
        panel: dict[str, object] = {
            "datasource": dict(DATASOURCE),
            "description": self.description,
            "fieldConfig": {
                "defaults": self._field_defaults(),
                "overrides": [column.override() for column in self.column_formats],
            },
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "id": panel_id,
            "options": self._options(),
            "targets": [target.model(ref) for target, ref in zip(self.targets, refs, strict=True)],
            "title": self.title,
            "type": self.kind,
        }
        if self.kind == "table":
            panel["transformations"] = [
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": dict(self.columns),
                    },
                },
            ]
        return panel


@dataclass(frozen=True)
class Row:
    """A collapsible section header; starts a new line of panels."""

    title: str


@dataclass(frozen=True)
class Variable:
    """A template variable filled from ``label_values(...)`` (multi-select, with All = ``.*``)."""

    name: str
    query: str
    label: str = ""

    def model(self) -> dict[str, object]:
        """The variable as Grafana stores it."""
        return {
            "allValue": ".*",
            "current": {},
            "datasource": dict(DATASOURCE),
            "definition": self.query,
            "includeAll": True,
            "label": self.label or self.name,
            "multi": True,
            "name": self.name,
            "options": [],
            "query": {
                "qryType": 1,
                "query": self.query,
                "refId": "PrometheusVariableQueryEditor-VariableQuery",
            },
            "refresh": 2,
            "regex": "",
            "sort": 1,
            "type": "query",
        }


@dataclass(frozen=True)
class Dashboard:
    """A dashboard: title, file name (its uid derives from it), variables and a flow of rows and panels."""

    title: str
    file_name: str
    description: str
    variables: tuple[Variable, ...]
    items: tuple[Panel | Row, ...]
    tags: tuple[str, ...] = ("babysitter",)
    refresh: str = "1m"
    time_from: str = "now-6h"
    #: Events drawn on every time series panel (restarts, checkpoint saves, Xids, hangs).
    annotations: tuple[Annotation, ...] = ()

    def panels(self) -> list[Panel]:
        """The panels without the rows."""
        return [item for item in self.items if isinstance(item, Panel)]

    def model(self) -> dict[str, object]:
        """The dashboard JSON model (import it in Grafana or provision it from ``dashboards/``)."""
        panels: list[dict[str, object]] = []
        x = y = line_height = 0
        for panel_id, item in enumerate(self.items, start=1):
            if isinstance(item, Row):
                y += line_height
                x = line_height = 0
                panels.append(
                    {
                        "collapsed": False,
                        "gridPos": {"h": 1, "w": _GRID_WIDTH, "x": 0, "y": y},
                        "id": panel_id,
                        "panels": [],
                        "title": item.title,
                        "type": "row",
                    }
                )
                y += 1
                continue
            if x + item.width > _GRID_WIDTH:
                y += line_height
                x = line_height = 0
            panels.append(item.model(panel_id, x, y))
            x += item.width
            line_height = max(line_height, item.height)
        datasource_variable: dict[str, object] = {
            "current": {},
            "hide": 0,
            "includeAll": False,
            "label": "Data source",
            "multi": False,
            "name": "datasource",
            "options": [],
            "query": "prometheus",
            "refresh": 1,
            "regex": "",
            "type": "datasource",
        }
        return {
            "annotations": {"list": [annotation.model() for annotation in self.annotations]},
            "description": self.description,
            "editable": True,
            "graphTooltip": 1,
            "links": [
                {
                    "asDropdown": True,
                    "includeVars": True,
                    "keepTime": True,
                    "tags": ["babysitter"],
                    "title": "babysitter",
                    "type": "dashboards",
                }
            ],
            "panels": panels,
            "refresh": self.refresh,
            "schemaVersion": SCHEMA_VERSION,
            "tags": list(self.tags),
            "templating": {"list": [datasource_variable, *(v.model() for v in self.variables)]},
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "timezone": "utc",
            "title": self.title,
            "uid": stable_uid(self.file_name),
            "version": 1,
        }
