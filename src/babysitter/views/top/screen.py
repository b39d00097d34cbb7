"""``babysitter top`` on a terminal: a frame as rich tables, refreshed live (rich imported lazily)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from babysitter.terminal import clean
from babysitter.views.top.cells import pct, secs
from babysitter.views.top.frame import AlertRow, Frame, Source, gpu_key

__all__ = ["NARROW", "differing_labels", "merged_alerts", "render", "run_top"]


#: Labels that say nothing about what an alert is about (merging duplicates ignores them).
_PLUMBING = frozenset({"alertname", "alertstate", "severity", "job", "team", "likely_cause", "likely_host"})
#: Below this many columns the alerts leave the runs and nodes tables for lines under them.
NARROW = 120
#: Headers set on two lines when narrow.
_SPLIT_NARROW = frozenset({"step time", "last step", "last ckpt", "GPUs up", "max temp", "firing alerts"})


def merged_alerts(alerts: tuple[AlertRow, ...]) -> list[tuple[AlertRow, str]]:
    """Alerts that differ only in a label beyond their subject (GpuThrottled once per throttle reason)
    as one row each, with the label that tells them apart: ``reason=hw_slowdown,hw_thermal_slowdown``."""
    groups: dict[tuple[str, str, str, str], list[AlertRow]] = {}
    for a in alerts:
        groups.setdefault((a.name, a.state, a.severity, a.subject()), []).append(a)
    out = []
    for rows in groups.values():
        first = rows[0]
        if len(rows) == 1:
            out.append((first, ""))
            continue
        differ = differing_labels(rows)
        extra = " ".join(
            f"{k}={', '.join(sorted({r.labels.get(k, '') for r in rows} - {''}))}" for k in differ
        )
        since = min((r.since for r in rows if r.since is not None), default=None)
        out.append(
            (AlertRow(first.name, first.state, first.severity, first.labels, since, first.summary), extra)
        )
    return out


def differing_labels(rows: list[AlertRow]) -> list[str]:
    """The labels, beyond alert plumbing, whose values tell ``rows`` (one alert's instances) apart."""
    keys = sorted({k for r in rows for k in r.labels} - _PLUMBING)
    return [k for k in keys if len({r.labels.get(k, "") for r in rows}) > 1]


def _names(alerts: list[AlertRow]) -> str:
    """Alert names, each once (``GpuThrottled x2`` when it fires for two reasons)."""
    counts: dict[str, int] = {}
    for a in alerts:
        counts[a.name] = counts.get(a.name, 0) + 1
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in counts.items())


def render(frame: Frame, width: int | None = None) -> Any:
    """The frame as a rich renderable: a runs table, a nodes table, the firing alerts, errors.

    ``width``: the terminal's columns. Under :data:`NARROW`, the firing alerts of each run and node go
    on a line under its table instead of a column, so that at 80 columns no header or value is cut
    (long values wrap; nothing is truncated with an ellipsis).
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    narrow = width is not None and width < NARROW
    alert_column = frame.alerts is not None and not narrow

    def column(table: Any, header: str, *, right: bool = False, fold: bool = False) -> None:
        # A one-word header is never squeezed below its own width (rich would cut it: "good…");
        # narrow, one word a line, so a header is as wide as its longest word, not its whole text.
        longest = max(len(word) for word in header.split())
        table.add_column(
            header.replace(" ", "\n") if narrow and header in _SPLIT_NARROW else header,
            justify="right" if right else "left",
            min_width=longest,
            overflow="fold" if fold else "ellipsis",
        )

    stamp = time.strftime("%H:%M:%S", time.localtime(frame.time))
    # Every name and label value below comes from Prometheus or a /metrics page: through clean() and
    # into Text, never markup ("[link=...]" would become a hyperlink), never a control character.
    parts: list[Any] = [
        Text(clean(f"babysitter top  {stamp}  {frame.source}"), style="bold", overflow="fold")
    ]
    runs = Table(title="Runs", title_justify="left", expand=False)
    for col in ("run", "ranks", "step", "MFU", "goodput", "step time", "last step", "last ckpt", "restarts"):
        column(runs, col, right=col != "run", fold=col == "run")
    if alert_column:
        column(runs, "firing alerts", fold=True)
    under: list[Any] = []
    for row in frame.runs:
        stale = row.last_step_age is not None and row.last_step_age > max(30.0, 10 * (row.step_seconds or 0))
        cells: list[Any] = [
            Text(clean(row.run))
            if row.reporting
            else Text(clean(f"{row.run} (not reporting)"), style="bold red"),
            str(row.ranks),
            "-" if row.step is None else str(row.step),
            pct(row.mfu),
            pct(row.goodput),
            secs(row.step_seconds),
            Text(secs(row.last_step_age), style="bold red" if stale else ""),
            secs(row.checkpoint_age),
            "-" if row.restarts is None else str(row.restarts),
        ]
        firing = _names(frame.alerts_for_run(row.run)) if frame.alerts is not None else ""
        if alert_column:
            cells.append(Text(clean(firing), style="red"))
        elif firing:
            under.append(Text(clean(f"  {row.run} firing: {firing}"), style="red", overflow="fold"))
        runs.add_row(*cells)
    if not frame.runs:
        runs.add_row("(no runs)", *[""] * (len(runs.columns) - 1))
    parts.append(runs)
    parts.extend(under)
    for row in frame.runs:
        if row.hint:
            parts.append(Text(clean(f"  {row.run}: {row.hint}"), style="yellow", overflow="fold"))
    nodes = Table(title="Nodes", title_justify="left", expand=False)
    for col in ("node", "GPUs up", "lost", "Xid (code x n)", "max temp", "util"):
        column(nodes, col, right=col not in ("node", "lost", "Xid (code x n)"), fold=col != "GPUs up")
    if alert_column:
        column(nodes, "firing alerts", fold=True)
    under = []
    for node in frame.nodes:
        healthy = not node.lost
        cells = [
            Text(clean(node.instance)),
            Text(f"{node.gpus_up}/{node.gpus}", style="green" if healthy else "bold red"),
            Text(clean(",".join(node.lost) or "-"), style="" if healthy else "bold red"),
            Text(
                clean(
                    " ".join(f"{code}x{node.xids[code]}" for code in sorted(node.xids, key=gpu_key)) or "-"
                ),
                style="yellow" if node.xids else "",
            ),
            "-" if node.max_temperature is None else f"{node.max_temperature:.0f}C",
            pct(node.mean_utilization),
        ]
        firing = _names(frame.alerts_for_node(node.instance)) if frame.alerts is not None else ""
        if alert_column:
            cells.append(Text(clean(firing), style="red"))
        elif firing:
            under.append(Text(clean(f"  {node.instance} firing: {firing}"), style="red", overflow="fold"))
        nodes.add_row(*cells)
    if not frame.nodes:
        nodes.add_row("(no nodes)", *[""] * (len(nodes.columns) - 1))
    parts.append(nodes)
    parts.extend(under)
    if frame.alerts is not None:
        alerts = Table(title="Alerts", title_justify="left", expand=False)
        for col in ("alert", "state", "severity", "about", "for"):
            column(alerts, col, fold=col in ("alert", "about"))
        rows = merged_alerts(frame.alerts)
        for a, extra in rows:
            since = "-" if a.since is None else secs(max(0.0, frame.time - a.since))
            style = "bold red" if a.state == "firing" and a.severity == "critical" else None
            alerts.add_row(
                Text(clean(a.name)),
                Text(clean(a.state)),
                Text(clean(a.severity)),
                Text(clean(" ".join(x for x in (a.subject(), extra) if x))),
                since,
                style=style,
            )
        if not rows:
            alerts.add_row("(none)", "", "", "", "")
        parts.append(alerts)
    for error in list(dict.fromkeys(frame.errors))[:5]:  # a dead server fails every query alike
        parts.append(Text(clean(f"! {error}"), style="yellow", overflow="fold"))
    return Group(*parts)


def run_top(
    source: Source,
    *,
    console: Any = None,
    interval: float = 2.0,
    once: bool = False,
    stop: Callable[[], bool] | None = None,
) -> int:
    """Show frames until Ctrl-C (or ``stop()``); ``once`` prints one. 0, or 1 when nothing answered."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    if once:
        frame = source.frame()
        console.print(render(frame, console.width))
        return 1 if frame.errors and not frame.runs and not frame.nodes else 0
    try:
        first = render(source.frame(), console.width)
        with Live(first, console=console, refresh_per_second=4, screen=False) as live:
            while not (stop and stop()):
                time.sleep(interval)
                live.update(render(source.frame(), console.width))
    except KeyboardInterrupt:
        pass
    return 0
