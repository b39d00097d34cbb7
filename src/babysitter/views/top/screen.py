"""``babysitter top`` on a terminal: a frame as rich tables, refreshed live (rich imported lazily)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from babysitter.views.top.cells import pct, secs
from babysitter.views.top.frame import Frame, Source, gpu_key

__all__ = ["render", "run_top"]


def render(frame: Frame) -> Any:
    """The frame as a rich renderable: a runs table, a nodes table, the firing alerts, errors."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    stamp = time.strftime("%H:%M:%S", time.localtime(frame.time))
    parts: list[Any] = [Text(f"babysitter top  {stamp}  {frame.source}", style="bold")]
    runs = Table(title="Runs", title_justify="left", expand=False)
    for col in ("run", "ranks", "step", "MFU", "goodput", "step time", "last step", "last ckpt", "restarts"):
        runs.add_column(col, justify="left" if col == "run" else "right")
    if frame.alerts is not None:
        runs.add_column("firing alerts")
    for row in frame.runs:
        stale = row.last_step_age is not None and row.last_step_age > max(30.0, 10 * (row.step_seconds or 0))
        cells: list[Any] = [
            row.run if row.reporting else Text(f"{row.run} (not reporting)", style="bold red"),
            str(row.ranks),
            "-" if row.step is None else str(row.step),
            pct(row.mfu),
            pct(row.goodput),
            secs(row.step_seconds),
            Text(secs(row.last_step_age), style="bold red" if stale else ""),
            secs(row.checkpoint_age),
            "-" if row.restarts is None else str(row.restarts),
        ]
        if frame.alerts is not None:
            cells.append(Text(", ".join(a.name for a in frame.alerts_for_run(row.run)), style="red"))
        runs.add_row(*cells)
    if not frame.runs:
        runs.add_row("(no runs)", *[""] * (len(runs.columns) - 1))
    parts.append(runs)
    for row in frame.runs:
        if row.hint:
            parts.append(Text(f"  {row.run}: {row.hint}", style="yellow"))
    nodes = Table(title="Nodes", title_justify="left", expand=False)
    for col in ("node", "GPUs up", "lost", "Xid (code x count)", "max temp", "util"):
        nodes.add_column(col, justify="left" if col in ("node", "lost", "Xid (code x count)") else "right")
    if frame.alerts is not None:
        nodes.add_column("firing alerts")
    for node in frame.nodes:
        healthy = not node.lost
        cells = [
            node.instance,
            Text(f"{node.gpus_up}/{node.gpus}", style="green" if healthy else "bold red"),
            Text(",".join(node.lost) or "-", style="" if healthy else "bold red"),
            Text(
                " ".join(f"{code}x{node.xids[code]}" for code in sorted(node.xids, key=gpu_key)) or "-",
                style="yellow" if node.xids else "",
            ),
            "-" if node.max_temperature is None else f"{node.max_temperature:.0f}C",
            pct(node.mean_utilization),
        ]
        if frame.alerts is not None:
            cells.append(Text(", ".join(a.name for a in frame.alerts_for_node(node.instance)), style="red"))
        nodes.add_row(*cells)
    if not frame.nodes:
        nodes.add_row("(no nodes)", *[""] * (len(nodes.columns) - 1))
    parts.append(nodes)
    if frame.alerts is not None:
        alerts = Table(title="Alerts", title_justify="left", expand=False)
        for col in ("alert", "state", "severity", "about", "for"):
            alerts.add_column(col)
        for a in frame.alerts:
            since = "-" if a.since is None else secs(max(0.0, frame.time - a.since))
            style = "bold red" if a.state == "firing" and a.severity == "critical" else None
            alerts.add_row(a.name, a.state, a.severity, a.subject(), since, style=style)
        if not frame.alerts:
            alerts.add_row("(none)", "", "", "", "")
        parts.append(alerts)
    for error in frame.errors[:5]:
        parts.append(Text(f"! {error}", style="yellow"))
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
        console.print(render(frame))
        return 1 if frame.errors and not frame.runs and not frame.nodes else 0
    try:
        with Live(render(source.frame()), console=console, refresh_per_second=4, screen=False) as live:
            while not (stop and stop()):
                time.sleep(interval)
                live.update(render(source.frame()))
    except KeyboardInterrupt:
        pass
    return 0
