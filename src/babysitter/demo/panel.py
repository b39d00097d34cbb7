"""The demo's live panel, laid out for an 80x24 terminal.

``babysitter top``'s boxed tables (a column per metric, one per alert's labels) need about 130
columns and 33 rows; in the demo the panel shares the screen with the event and page lines that
scroll above it. So the panel is its own compact layout of the same :class:`Frame`: borderless tables
whose headers and cells fit 76 columns, the node's address said once (the alerts name their GPU, not
their host), at most :data:`MAX_ALERTS` alert rows, and at most :data:`MAX_HEIGHT` rows in all.
Names that could be long (a run, an alert) are bounded so a row never wraps.
"""

from __future__ import annotations

import time
from typing import Any

from babysitter.demo.scenario import DemoEvent
from babysitter.terminal import clean
from babysitter.views.top import AlertRow, Frame
from babysitter.views.top.cells import pct, secs
from babysitter.views.top.screen import differing_labels

__all__ = ["MAX_ALERTS", "MAX_HEIGHT", "panel"]

#: Alert rows shown (critical first); the rest is one "+N more" line.
MAX_ALERTS = 4
#: Rows the panel takes at most (borders included), so that ten lines of events stay visible at 24.
MAX_HEIGHT = 14
_WIDTH = 80
_NAME = 12
#: The alert table's widths: 22 + 7 (state) + 8 (severity) + 26 + 5 (for) + 4 x 2 (gaps) = 76.
_ALERT = 22
_ABOUT = 26
_SUBJECT = ("run", "gpu", "xid")


def _bounded(text: str, limit: int) -> str:
    """``text`` (a name from Prometheus: no control characters, see :func:`clean`) cut to ``limit``."""
    text = clean(text)
    return text if len(text) <= limit else text[: limit - 1] + "~"


def _abouts(alerts: list[AlertRow]) -> list[str]:
    """What each alert is about: its run, GPU and Xid, and for alerts that would read the same (a GPU
    throttled for two reasons) the label that tells them apart: ``gpu=6 reason=hw_slowdown``, or its
    value alone (``gpu=6 hw_thermal_slowdown``) where the name would not fit."""
    base = [" ".join(f"{k}={a.labels[k]}" for k in _SUBJECT if k in a.labels) for a in alerts]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, a in enumerate(alerts):
        groups.setdefault((a.name, base[i]), []).append(i)
    out = list(base)
    for members in groups.values():
        if len(members) < 2:
            continue
        differ = differing_labels([alerts[i] for i in members])
        named = {i: [base[i], *(f"{k}={alerts[i].labels.get(k, '')}" for k in differ)] for i in members}
        bare = {i: [base[i], *(alerts[i].labels.get(k, "") for k in differ)] for i in members}
        fits = all(len(" ".join(named[i])) <= _ABOUT for i in members)
        for i in members:
            out[i] = " ".join(named[i] if fits else bare[i]).strip()
    return out


def _table(*columns: str, left: int = 1) -> Any:
    """A borderless table (no rule rows: height is scarce); the first ``left`` columns left-aligned."""
    from rich.table import Table

    table = Table(box=None, padding=(0, 1), pad_edge=False, expand=False)
    for i, col in enumerate(columns):
        table.add_column(
            col, justify="left" if i < left else "right", no_wrap=True, header_style="bold underline"
        )
    return table


def panel(frame: Frame | None, next_event: DemoEvent | None, *, t0: float, duration: float) -> Any:
    """The live panel: clock and next fault, then the runs, the node and the active alerts."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    elapsed = time.time() - t0
    parts: list[Any] = []
    if next_event is not None:
        head = f"next fault in {max(0.0, next_event.at - elapsed):3.0f}s: {next_event.describe()}"
        parts.append(Text(_bounded(head, _WIDTH - 4), style="yellow", no_wrap=True))
    else:
        parts.append(Text("no more faults: recovery", style="green"))
    if frame is not None:
        runs = _table("run", "step", "MFU", "goodput", "step time", "last step", "last ckpt", "restarts")
        for row in frame.runs[:2]:
            name = _bounded(row.run, _NAME) if row.reporting else _bounded(row.run, _NAME - 2) + " ?"
            runs.add_row(
                Text(name, style="" if row.reporting else "bold red"),
                "-" if row.step is None else str(row.step),
                pct(row.mfu),
                pct(row.goodput),
                secs(row.step_seconds),
                secs(row.last_step_age),
                secs(row.checkpoint_age),
                "-" if row.restarts is None else str(row.restarts),
            )
        if not frame.runs:
            runs.add_row("(none yet)", *[""] * 7)
        parts.append(runs)
        nodes = _table("node", "GPUs up", "lost", "Xid x count", "max temp", "util")
        for node in frame.nodes[:1]:
            nodes.add_row(
                Text(_bounded(node.instance, 21)),
                Text(f"{node.gpus_up}/{node.gpus}", style="bold red" if node.lost else "green"),
                Text(_bounded(",".join(node.lost) or "-", 8), style="bold red" if node.lost else ""),
                Text(_bounded(" ".join(f"{c}x{n}" for c, n in sorted(node.xids.items())) or "-", 14)),
                "-" if node.max_temperature is None else f"{node.max_temperature:.0f}C",
                pct(node.mean_utilization),
            )
        parts.append(nodes)
        if frame.alerts:
            alerts = _table("alert", "state", "severity", "about", "for", left=4)
            ordered = sorted(frame.alerts, key=lambda a: (a.state != "firing", a.severity != "critical"))
            for a, about in list(zip(ordered, _abouts(ordered), strict=True))[:MAX_ALERTS]:
                since = "-" if a.since is None else secs(max(0.0, frame.time - a.since))
                style = "bold red" if a.state == "firing" and a.severity == "critical" else None
                alerts.add_row(
                    Text(_bounded(a.name, _ALERT)),
                    Text(_bounded(a.state, 8)),
                    Text(_bounded(a.severity, 8)),
                    Text(_bounded(about, _ABOUT)),
                    since,
                    style=style,
                )
            parts.append(alerts)
            if len(ordered) > MAX_ALERTS:
                parts.append(Text(f"+{len(ordered) - MAX_ALERTS} more alert(s)", style="dim"))
        elif frame.alerts is not None:
            parts.append(Text("no active alerts", style="green"))
    return Panel(
        Group(*parts),
        title=f"babysitter demo {elapsed:4.0f}s / {duration:.0f}s",
        subtitle="Ctrl-C stops everything",
        width=_WIDTH,
    )
