"""The report's slowdown section: the split by cause, the largest episodes, each incarnation's ideal.

Everything that came from a ledger or a Prometheus answer (hosts, GPU names, evidence) is printed as
plain text, never as markup.
"""

from __future__ import annotations

import time
from typing import Any

from babysitter.ledger.slowcause import CAUSES, SlowdownSplit
from babysitter.ledger.spans import Span
from babysitter.ledger.summary import RunSummary
from babysitter.terminal import clean

__all__ = ["render_slowdown", "slow_spans", "slowdown_lines"]

#: Episodes the table lists (the largest; the JSON has up to 100).
_SHOWN = 8


def _utc(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def slowdown_lines(split: SlowdownSplit) -> list[str]:
    """The split in plain lines: the total, each cause with time in it, and where it comes from."""
    total = split.total_us / 1e6
    ideal = "" if split.ideal_seconds is None else f" (ideal step {split.ideal_seconds:.3g} s)"
    out = [f"slowdown {total:.1f} s{ideal}"]
    for cause, seconds in split.by_cause.items():
        if seconds > 0:
            where = sorted({clean(e.where()) for e in split.episodes if e.cause == cause and e.where()})
            named = f": {'; '.join(where[:3])}" if where else ""
            out.append(f"  {cause} {seconds:.1f} s ({seconds / total:.0%}){named}")
    if split.note:
        out.append(f"  {clean(split.note)}")
    return out


def slow_spans(summary: RunSummary) -> list[Span]:
    """The slow episodes as timeline spans (their booked time is inside them, spread over their steps)."""
    if summary.slowdown is None:
        return []
    return [Span(e.begin_us / 1e6, e.end_us / 1e6, "slowdown") for e in summary.slowdown.episodes]


def render_slowdown(summary: RunSummary, console: Any) -> None:
    """Print the slowdown split and its largest episodes (nothing when the run booked none)."""
    from rich.table import Table
    from rich.text import Text

    split = summary.slowdown
    if split is None or split.total_us <= 0:
        return
    total = split.total_us / 1e6
    ideal = "" if split.ideal_seconds is None else f", ideal step time now {split.ideal_seconds:.3g} s"
    # The figures on a line of their own: as the title of a table this narrow they wrapped over three.
    console.print(
        Text(f"Slowdown by cause: {total:.1f} s{ideal}; evidence: {clean(split.source)}", style="bold")
    )
    table = Table()
    for col in ("cause", "time", "share", "where"):
        table.add_column(col, justify="right" if col in ("time", "share") else "left", overflow="fold")
    for cause, seconds in split.by_cause.items():
        if seconds <= 0:
            continue
        where = sorted({clean(e.where()) for e in split.episodes if e.cause == cause and e.where()})
        table.add_row(cause, f"{seconds:.1f}s", f"{seconds / total:.0%}", Text("; ".join(where[:3])))
    console.print(table)
    episodes = sorted(split.episodes, key=lambda e: -e.excess_us)[:_SHOWN]
    if episodes:
        eps = Table(title=f"Largest slow episodes (of {len(split.episodes)}; times UTC)")
        for col in ("#", "from", "to", "steps", "slower", "lost", "cause"):
            eps.add_column(col, overflow="fold")
        ordered = sorted(episodes, key=lambda e: e.begin_us)
        for e in ordered:
            eps.add_row(
                str(e.incarnation),
                _utc(e.begin_us / 1e6),
                _utc(e.end_us / 1e6),
                f"{e.first_step}..{e.last_step}",
                f"{e.factor:.2f}x",
                f"{e.excess_us / 1e6:.1f}s",
                Text(clean(f"{e.cause} {e.where()}".strip())),
            )
        console.print(eps)
        for e in ordered:
            for line in e.evidence or [CAUSES.get(e.cause, "")]:
                console.print(Text(f"  {_utc(e.begin_us / 1e6)} {clean(line)}"))
    if split.note:
        console.print(Text(clean(split.note), style="yellow"))
    rows = [inc for inc in summary.incarnations if inc.ideal_step_seconds is not None]
    if len(rows) > 1:
        console.print(
            Text(
                "ideal step time by incarnation: "
                + ", ".join(f"#{inc.index} {inc.ideal_step_seconds:.3g}s" for inc in rows)
            )
        )
