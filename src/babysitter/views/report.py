"""A run's goodput report as a person reads it: rich tables and a PNG timeline (matplotlib, Agg).

The numbers come from :func:`babysitter.ledger.summarize`; this module only draws them. rich and
matplotlib are the ``report`` extra and are imported when a function needs them (ImportError
otherwise, which the caller turns into a message).
"""

from __future__ import annotations

import math
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from babysitter.checkpoints import CheckpointStatus
from babysitter.ledger.summary import RunSummary
from babysitter.terminal import clean
from babysitter.views.slowdown import render_slowdown, slow_spans

__all__ = [
    "CAUSE_COLORS",
    "advice_line",
    "legend",
    "render_checkpoints",
    "render_png",
    "render_table",
    "resume_lines",
]

#: One color per cause, stable across reports (colorblind-friendly where it matters most).
CAUSE_COLORS = {
    "startup": "#9467bd",
    "checkpoint_load": "#17becf",
    "checkpoint_save": "#1f77b4",
    "data_stall": "#bcbd22",
    "lost_progress": "#d62728",
    "downtime": "#7f7f7f",
    "eval": "#2ca02c",
    "phase": "#98df8a",
    "hang": "#ff7f0e",
    "slowdown": "#e377c2",
    "other": "#c7c7c7",
}

_INCARNATION_COLOR = "#aec7e8"


def _dur(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{sec:02d}s"
    return f"{minutes}m{sec:02d}s"


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def render_table(summary: RunSummary, console: Any = None) -> None:
    """Print the goodput tables with rich (to ``console``, default stdout)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    t = summary.totals
    console.print(
        f"[bold]{escape(clean(summary.run))}[/bold]  state [bold]{summary.state}[/bold]  "
        f"wall {_dur(t.wall_seconds)}  goodput [bold]{t.goodput:.1%}[/bold]  restarts {t.restarts}  "
        f"checkpoints {summary.checkpoints_ok} saved / {summary.checkpoints_failed} failed"
    )
    if summary.at_risk_seconds > 0:
        console.print(
            f"[yellow]{_dur(summary.at_risk_seconds)} of productive time is not covered by a checkpoint "
            "yet (lost if the run crashed now)[/]"
        )
    if summary.torn_lines or summary.invalid_lines or summary.fenced_lines:
        console.print(
            f"[yellow]ledger: skipped {summary.torn_lines} torn, {summary.invalid_lines} invalid and "
            f"{summary.fenced_lines} fenced line(s) (written after another writer took the lock over)[/]"
        )
    if summary.partial:
        console.print(
            "[yellow]ledger: the file starts in the middle of the run (it was deleted or replaced while "
            "the run went on); the accounting covers what it holds[/]"
        )
    causes = Table(title="Where the wall time went")
    causes.add_column("bucket")
    causes.add_column("time", justify="right")
    causes.add_column("share", justify="right")
    for name in summary.windows:
        causes.add_column(f"last {name}", justify="right")
    rows = [
        ("productive", t.productive_seconds, {n: w.productive_seconds for n, w in summary.windows.items()})
    ]
    for cause, seconds in t.badput_seconds.items():
        rows.append(
            (cause, seconds, {n: w.badput_seconds.get(cause, 0.0) for n, w in summary.windows.items()})
        )
    wall = t.wall_seconds or 1.0
    for name, seconds, per_window in rows:
        if seconds == 0 and all(v == 0 for v in per_window.values()):
            continue
        cells = [f"{per_window[n] / (summary.windows[n].wall_seconds or 1.0):.1%}" for n in summary.windows]
        style = "bold green" if name == "productive" else None
        causes.add_row(Text(clean(name)), _dur(seconds), f"{seconds / wall:.1%}", *cells, style=style)
    causes.add_row(
        "wall", _dur(t.wall_seconds), "100%", *[_dur(w.wall_seconds) for w in summary.windows.values()]
    )
    console.print(causes)
    # At 80 columns nothing is cut (issue 22): start times without the date when the run's
    # incarnations share one (in the title), headers never narrower than their longest word, long
    # values wrapped rather than cut.
    days = {_utc(inc.start)[:10] for inc in summary.incarnations}
    one_day = len(days) == 1
    incs = Table(title=f"Incarnations (start times UTC{f', {next(iter(days))}' if one_day else ''})")
    for col in ("#", "host", "pid", "start", "length", "resumed", "steps", "step time", "ending"):
        incs.add_column(
            col.replace(" ", "\n"),
            justify="right" if col in ("#", "pid", "resumed", "steps") else "left",
            min_width=max(len(word) for word in col.split()),
            overflow="fold",
        )
    for inc in summary.incarnations:
        steps = "-" if inc.first_step is None else f"{inc.first_step}..{inc.last_step}"
        incs.add_row(
            str(inc.index),
            Text(clean(inc.host)),  # from the ledger file: never markup, no control characters
            str(inc.pid),
            _utc(inc.start)[11:] if one_day else _utc(inc.start)[5:],
            _dur(inc.end - inc.start),
            "-" if inc.resumed_from is None else str(inc.resumed_from),
            steps,
            "-" if inc.mean_step_seconds is None else f"{inc.mean_step_seconds:.3g}s",
            Text(clean(inc.ending)),
        )
    console.print(incs)
    render_slowdown(summary, console)
    _render_restarts(summary, console)
    _render_advice(summary, console)


def resume_lines(statuses: list[CheckpointStatus], resume: CheckpointStatus | None) -> list[tuple[str, str]]:
    """(style, text) lines: the checkpoint to resume from, then each newer one a resume must skip."""
    if not statuses:
        return []
    if resume is None:
        head = ("bold red", "resume from: no checkpoint of this run verifies")
    elif resume.verified:
        head = (
            "bold green",
            f"resume from: step {resume.step} ({resume.path}), verified against its manifest",
        )
    else:
        head = (
            "yellow",
            f"resume from: step {resume.step} ({resume.path}); no manifest, its size is all that was checked",
        )
    out = [head]
    for s in statuses:
        if resume is not None and s.time <= resume.time:
            continue
        where = f" {s.file}:" if s.file else ""
        style = "yellow" if s.status == "pending" else "red"
        out.append((style, f"  step {s.step} is {s.status}:{where} {s.detail or s.reason}".rstrip()))
    return out


def render_checkpoints(
    statuses: list[CheckpointStatus], resume: CheckpointStatus | None, console: Any = None
) -> None:
    """Print :func:`resume_lines` with rich (to ``console``, default stdout)."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    for style, line in resume_lines(statuses, resume):
        console.print(Text(clean(line), style=style))  # paths and details from files: never markup


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.1%}"


def advice_line(summary: RunSummary) -> str:
    """The checkpoint advice in one line (plain text): the advice, the expected goodputs, the inputs
    and how much data they rest on. The expected goodputs are Daly's model's, which counts only what
    checkpointing trades (saves against lost work and restarts), and say so: a run's measured goodput
    printed next to them is lower by every other badput (startup, data stalls, hangs)."""
    a = summary.advice
    if a is None:
        return "checkpoint advice: no ledger records"
    inputs = []
    if a.save_seconds is not None:
        inputs.append(f"save {_dur(a.save_seconds)} (mean of {a.saves})")
    if a.restart_seconds is not None:
        inputs.append(f"restart {_dur(a.restart_seconds)} ({a.restarts} measured)")
    if a.rate is not None:
        r = a.rate
        inputs.append(f"{r.per_hour:.3g} interruptions/h (95% {r.low:.3g}..{r.high:.3g}, {r.source})")
    now = "?" if a.current_interval_seconds is None else _dur(a.current_interval_seconds)
    if a.recommended_interval_seconds is None:
        head = f"checkpoint advice: none (now every {now})"
    else:
        lo, hi = a.recommended_range or (a.recommended_interval_seconds, a.recommended_interval_seconds)
        span = f"{_dur(lo)}..{'inf' if hi == float('inf') else _dur(hi)}"
        gain = "" if a.gain is None else f", {a.gain * 100:+.1f} points"
        head = (
            f"checkpoint advice: save every {_dur(a.recommended_interval_seconds)} (95%: {span}; now every "
            f"{now}): by Daly's model (saves, restarts and lost work only) expected goodput "
            f"{_pct(a.expected_goodput_recommended)} vs {_pct(a.expected_goodput_current)} now{gain}"
        )
    note = a.note
    data = ""
    if not a.sufficient:
        # Said once, loudly: the advisor's note may already begin with it (issue 22).
        data = "INSUFFICIENT DATA: "
        if note.lower().startswith("insufficient data: "):
            note = note[len("insufficient data: ") :]
    return f"{head}. Inputs: {'; '.join(inputs) or 'none yet'}. {data}{note}."


def _render_advice(summary: RunSummary, console: Any) -> None:
    from rich.text import Text

    if summary.advice is None:
        return
    console.print(Text(clean(advice_line(summary)), style="" if summary.advice.sufficient else "yellow"))


def _render_restarts(summary: RunSummary, console: Any) -> None:
    """Each restart's cause, downtime, time to detect and time to recover; remediations still pending."""
    from rich.table import Table
    from rich.text import Text

    if summary.notes_error or summary.notes_skipped:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(summary.notes_skipped.items()))
        console.print(
            Text(
                clean(
                    "remediation notes: "
                    + "; ".join(x for x in (summary.notes_error, skipped and f"skipped {skipped}") if x)
                ),
                style="yellow",
            )
        )
    if summary.restart_list:
        table = Table(title="Restarts")
        for col in ("#", "after", "downtime", "cause", "detect", "recover"):
            table.add_column(
                col, justify="right" if col in ("#", "downtime", "detect", "recover") else "left"
            )
        for r in summary.restart_list:
            table.add_row(
                str(r.index),
                Text(clean(r.after)),
                _dur(r.downtime_seconds),
                Text(clean(r.cause)),  # from the notes file: never markup, no control characters
                "-" if r.time_to_detect_seconds is None else _dur(r.time_to_detect_seconds),
                "-" if r.time_to_recover_seconds is None else _dur(r.time_to_recover_seconds),
            )
        console.print(table)
    last_begin = summary.incarnations[-1].start if summary.incarnations else None
    for note, restart in summary.remediations:
        if restart is None and last_begin is not None and note.t > last_begin:
            console.print(
                Text(
                    clean(f"{_utc(note.t)} UTC {note.cause}; no incarnation has started since"),
                    style="yellow",
                )
            )


def render_png(summary: RunSummary, path: Path, *, now: float | None = None) -> None:
    """Write the timeline: incarnations as bars, badput colored by cause, step time and MFU over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from babysitter.ledger.spans import badput_spans, step_points

    t = summary.totals
    t0 = t.start_us / 1e6
    scale, unit = (3600.0, "hours") if t.wall_seconds > 3 * 3600 else (60.0, "minutes")
    if t.wall_seconds < 180:
        scale, unit = 1.0, "seconds"

    def x(v: float) -> float:
        return (v - t0) / scale

    fig, (ax_t, ax_s, ax_m) = plt.subplots(
        3, 1, figsize=(12, 7.5), sharex=True, gridspec_kw={"height_ratios": [1.3, 1, 1]}
    )
    try:
        run = _literal(summary.run)
        fig.suptitle(f"{run}: goodput {t.goodput:.1%} over {_dur(t.wall_seconds)}, {t.restarts} restart(s)")
        for inc in summary.incarnations:
            ax_t.broken_barh(
                [(x(inc.start), max((inc.end - inc.start) / scale, 1e-9))],
                (1.1, 0.8),
                facecolors=_INCARNATION_COLOR,
                edgecolors="black",
                linewidth=0.5,
            )
            if len(summary.incarnations) <= 12 or (inc.end - inc.start) > t.wall_seconds / 25:
                ax_t.text(x(inc.start), 2.0, f"#{inc.index}", fontsize=7, va="bottom")
        spans = badput_spans(
            summary.accountant, now=now if summary.state != "ended" else None, live=summary.state == "running"
        )
        by_cause: dict[str, list[tuple[float, float]]] = {}
        for sp in [*spans, *_stall_spans(summary), *slow_spans(summary)]:
            by_cause.setdefault(sp.cause, []).append((x(sp.begin), (sp.end - sp.begin) / scale))
        order = ("startup", "downtime", "lost_progress", "hang", "other")
        for cause in sorted(by_cause, key=lambda c: order.index(c) if c in order else len(order)):
            bars = by_cause[cause]
            ax_t.broken_barh(bars, (0.0, 0.8), facecolors=CAUSE_COLORS.get(cause, "#000000"))
        ax_t.set_yticks([0.4, 1.5], labels=["badput", "incarnations"])
        ax_t.set_ylim(-0.2, 2.6)
        # Every cause the run has badput of, with its total: one booked in slivers too thin to see
        # (a data stall spread over many steps) is in the legend all the same (issue 22).
        present = [c for c, v in t.badput_seconds.items() if v > 0]
        handles = [Patch(color=_INCARNATION_COLOR, label="incarnation")]
        handles += [
            Patch(color=CAUSE_COLORS.get(c, "#000000"), label=_literal(f"{c} {_dur(t.badput_seconds[c])}"))
            for c in present
        ]
        ax_t.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        for begin, width in by_cause.get("hang", ()):  # the step that hung is marked, not plotted to scale
            ax_s.axvspan(begin, begin + width, color=CAUSE_COLORS["hang"], alpha=0.25, lw=0)
        for begin, width in by_cause.get("slowdown", ()):  # where the steps were slow
            ax_s.axvspan(begin, begin + width, color=CAUSE_COLORS["slowdown"], alpha=0.2, lw=0)
        any_mfu = False
        steps_seen: list[float] = []
        total_points = sum(len(inc.points) for inc in summary.timeline.incarnations) or 1
        for full in summary.timeline.incarnations:
            # About 4000 points for the whole figure, shared by the incarnations by their length.
            points = step_points(full, max_points=max(20, 4000 * len(full.points) // total_points))
            if not points:
                continue
            marker = "." if total_points < 300 else None
            xs, ys = _broken([x(p.time) for p in points], [p.step_seconds for p in points])
            ax_s.plot(xs, ys, lw=0.8, color="#1f77b4", marker=marker)
            steps_seen += [p.step_seconds for p in points]
            mfu = [(x(p.time), p.mfu) for p in points if p.mfu is not None]
            if mfu:
                any_mfu = True
                xs, ys = _broken([a for a, _ in mfu], [b for _, b in mfu])
                ax_m.plot(xs, ys, lw=0.8, color="#d62728", marker=marker)
        ax_s.set_ylabel("step time (s)")
        _clip_outliers(ax_s, steps_seen)
        ax_m.set_ylabel("MFU")
        if not any_mfu:
            ax_m.text(0.5, 0.5, "no MFU (peak FLOP/s unknown)", transform=ax_m.transAxes, ha="center")
        ax_m.set_xlabel(f"{unit} since the run started ({_utc(t0)} UTC)")
        for ax in (ax_t, ax_s, ax_m):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def _literal(text: str) -> str:
    """``text`` from the ledger as matplotlib must show it: a ``$`` is a dollar, not mathtext (a run
    named ``a$\\x$`` failed the whole PNG with a mathtext parse error)."""
    return clean(text).replace("$", r"\$")


def legend(summary: RunSummary) -> list[tuple[str, str]]:
    """``(cause, label)`` of every badput cause the run has time in, with its total: the timeline's
    legend (a data stall spread over many steps draws as slivers too thin to see, but is listed)."""
    t = summary.totals
    return [(c, f"{c} {_dur(v)}") for c, v in t.badput_seconds.items() if v > 0]


def _stall_spans(summary: RunSummary) -> list[Any]:
    """Data stalls long enough to see on the timeline (a thousandth of the wall time), where they
    happened: each step's wait, at the start of its step. Shorter ones are in the legend's total."""
    from babysitter.ledger.spans import Span

    visible = max(0.001 * summary.totals.wall_seconds, 0.05) * 1e6
    out = []
    for inc in summary.timeline.incarnations:
        for j, wait in enumerate(inc.stall):
            if wait >= visible:
                start = inc.ends[j - 1] if j else inc.begin
                out.append(Span(start / 1e6, (start + wait) / 1e6, "data_stall"))
    return out


def _clip_outliers(ax: Any, values: list[float]) -> None:
    """Keep a hang's stuck step (28 s among 0.1 s steps) from flattening the step-time panel: the
    axis stops at 3x the 95th percentile, and what lies above is said on the panel (its span is
    shaded where the hang was)."""
    finite = sorted(v for v in values if math.isfinite(v))
    if len(finite) < 5:
        return
    top = 3 * finite[int(0.95 * (len(finite) - 1))]
    above = [v for v in finite if v > top]
    if not above or top <= 0:
        return
    ax.set_ylim(0, top)
    ax.text(
        0.99,
        0.95,
        f"{len(above)} point(s) above the axis, up to {max(above):.3g} s (a hang or stall: shaded)",
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=7,
    )


def _broken(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """Break the line (a NaN point) where consecutive points are far apart in time — a hang, a stall,
    a long save — so the plot shows a gap rather than a slope that no step ever had."""
    if len(xs) < 3:
        return xs, ys
    gaps = sorted(b - a for a, b in pairwise(xs))
    limit = 5 * gaps[len(gaps) // 2]
    out_x, out_y = [xs[0]], [ys[0]]
    for a, b, y in zip(xs, xs[1:], ys[1:], strict=False):
        if limit > 0 and b - a > limit:
            out_x.append((a + b) / 2)
            out_y.append(float("nan"))
        out_x.append(b)
        out_y.append(y)
    return out_x, out_y
