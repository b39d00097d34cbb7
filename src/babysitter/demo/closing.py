"""The demo's closing tables, laid out for 80 columns.

A boxed table spends 16 of 80 columns on its borders and padding; with the alert names, receivers
and delays taking their own width, the fault's description was left 18 columns and folded mid-word
("TrainingProcessExi/ted", a lone ")"). Here: no vertical borders, names and numbers never wrapped,
receivers wrapped after a comma, a description wrapped between words only, and a fault that causes
two alerts described once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from babysitter.demo.scenario import DemoEvent
from babysitter.terminal import clean

__all__ = ["FaultResult", "fault_table", "unscripted_table"]


@dataclass(frozen=True)
class FaultResult:
    """A scripted fault and, for each alert it must cause, the delay of its first page (None: none)."""

    event: DemoEvent
    pages: dict[str, float | None]
    #: For each alert that arrived, the receivers its first notifications went to (pager, chat...).
    receivers: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _table(title: str) -> Any:
    from rich import box
    from rich.table import Table

    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))


def fault_table(results: Sequence[FaultResult], *, pager: bool) -> Any:
    """Each scripted fault, the alerts it must cause, where each went and how long it took."""
    from rich.text import Text

    table = _table("Scripted faults: the alerts they must cause, and where each went")
    table.add_column("at", justify="right", no_wrap=True)
    table.add_column("fault", overflow="fold")  # words wrap; fold only a word wider than the column
    table.add_column("alert", no_wrap=True)
    receivers = [x for r in results for names in r.receivers.values() for x in names]
    table.add_column(  # "chat, pager, remediate" wraps after a comma, never inside a receiver's name
        "went to", overflow="fold", min_width=max((len(x) + 1 for x in receivers), default=7)
    )
    table.add_column("after", justify="right", no_wrap=True)
    for r in results:
        at, what = f"{r.event.at:g}s", clean(r.event.describe())
        if not r.pages:
            table.add_row(at, what, "-", "-", "-")
        for i, (name, delay) in enumerate(r.pages.items()):
            if not pager:
                cell, went = Text("no pager"), "-"
            else:
                cell = Text("not sent", style="bold red") if delay is None else Text(f"{delay:.1f}s")
                went = ", ".join(r.receivers.get(name, ())) or "-"
            first = i == 0
            table.add_row(
                at if first else "", what if first else "", Text(clean(name)), Text(clean(went)), cell
            )
    return table


def unscripted_table(others: Mapping[str, tuple[str, tuple[str, ...]]]) -> Any:
    """Alerts that fired though no scripted fault expects them: name, severity, receivers."""
    from rich.text import Text

    table = _table("Alerts no scripted fault caused")
    table.add_column("alert", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("went to", overflow="fold")  # the one column that may wrap, after a comma
    for name, (severity, receivers) in others.items():
        table.add_row(Text(clean(name)), Text(clean(severity)), Text(clean(", ".join(receivers))))
    return table
