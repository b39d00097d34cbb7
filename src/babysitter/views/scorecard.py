"""The scorecard as a table (rich) and as a PNG (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from babysitter.scorecard.compute import METRICS, MetricInfo, Scorecard
from babysitter.terminal import clean

__all__ = ["format_value", "render_png", "render_table"]


def format_value(value: float | None, unit: str) -> str:
    """A cell: ratios as percentages, rates with two decimals, bandwidths with an SI prefix."""
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "per1000h":
        return f"{value:.2f}"
    if unit == "count":
        return f"{value:.0f}"
    if unit == "hours":
        return f"{value:.1f}"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {prefix}B/s"
    return f"{value:.0f} B/s"


def _actions(card: Scorecard) -> list[str]:
    return sorted({a for c in card.clusters for a in c.xid_per_1000_gpu_hours_by_action})


def _causes(card: Scorecard) -> list[str]:
    """The slowdown causes any cluster has time in, the largest in total first."""
    totals: dict[str, float] = {}
    for c in card.clusters:
        for cause, share in c.slowdown_by_cause.items():
            totals[cause] = totals.get(cause, 0.0) + share
    return [cause for cause, total in sorted(totals.items(), key=lambda kv: -kv[1]) if total > 0]


def _rows(card: Scorecard) -> list[tuple[str, list[str], str | None]]:
    rows: list[tuple[str, list[str], str | None]] = []
    for info in METRICS:
        values = [c.value(info.key) for c in card.clusters]
        if all(v is None for v in values):
            continue
        rows.append((info.title, [format_value(v, info.unit) for v in values], card.best(info.key)))
        if info.key == "xid_per_1000_gpu_hours":
            for action in _actions(card):
                cells = [
                    format_value(c.xid_per_1000_gpu_hours_by_action.get(action, 0.0), "per1000h")
                    if c.gpu_hours
                    else "-"
                    for c in card.clusters
                ]
                rows.append((f"  Xid / 1000 GPU-h: {action}", cells, None))
        if info.key == "slowdown_share":
            for cause in _causes(card):
                shares = [
                    None if c.slowdown_share is None else c.slowdown_by_cause.get(cause, 0.0)
                    for c in card.clusters
                ]
                cells = [format_value(share, "ratio") for share in shares]
                rows.append((f"  slow steps: {cause}", cells, None))
    rows.append(
        ("GPU-hours seen by node agents", [format_value(c.gpu_hours, "count") for c in card.clusters], None)
    )
    rows.append(("training rank-hours", [format_value(c.rank_hours, "count") for c in card.clusters], None))
    if any(c.gpu_hours_lost is not None for c in card.clusters):
        lost = [format_value(c.gpu_hours_lost, "hours") for c in card.clusters]
        rows.append(("GPU-hours lost (badput x ranks)", lost, None))
    if any(c.money_lost is not None for c in card.clusters):
        money = ["-" if c.money_lost is None else f"{c.money_lost:,.2f}" for c in card.clusters]
        rows.append((f"{card.currency} lost (at --price per GPU-hour)", money, None))
    return rows


def render_table(card: Scorecard, stream: Any = None) -> None:
    """Print the scorecard: clusters as columns, best first; the best value of each row in green."""
    # Cluster names and Xid actions are label values from Prometheus: cleaned, and Text (not markup).
    names = [c.cluster for c in card.clusters]
    title = clean(f"babysitter scorecard by {card.by}, last {card.window} (ranked by effective MFU)")
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        out = stream or sys.stdout
        out.write(title + "\n" + "\t".join(["metric", *map(clean, names)]) + "\n")
        for label, cells, _ in _rows(card):
            out.write("\t".join(map(clean, [label, *cells])) + "\n")
        return
    table = Table(title=Text(title))
    table.add_column("metric")
    for c in card.clusters:
        table.add_column(Text(clean(f"#{c.rank} {c.cluster}")), justify="right")
    for label, cells, best in _rows(card):
        styled = [
            Text(cell, style="bold green" if best == name and cell != "-" else "")
            for name, cell in zip(names, cells, strict=True)
        ]
        table.add_row(Text(clean(label)), *styled)
    if card.mfu_match:
        table.caption = Text(clean(f"MFU of runs matching {card.mfu_match}"))
    else:
        table.caption = "MFU over all runs: pass --mfu-match to compare one model config"
    Console(file=stream, width=max(100, 40 + 22 * len(names))).print(table)


def _literal(text: str) -> str:
    """A label value as matplotlib must show it: a ``$`` is a dollar, not mathtext."""
    return clean(text).replace("$", r"\$")


def render_png(card: Scorecard, path: Path) -> None:
    """One bar chart per scorecard column, clusters in rank order; Xid rate stacked by action."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    infos: list[MetricInfo] = [
        m
        for m in METRICS
        if m.key != "xid_per_1000_gpu_hours" and any(c.value(m.key) is not None for c in card.clusters)
    ]
    panels = len(infos) + 1
    cols = 3
    rows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    names = [_literal(f"#{c.rank} {c.cluster}") for c in card.clusters]
    colors = [plt.get_cmap("tab10")(i) for i in range(10)]
    flat = list(axes.flat)
    for ax, info in zip(flat, infos, strict=False):
        values = [c.value(info.key) for c in card.clusters]
        heights = [v if v is not None else 0.0 for v in values]
        scale = 100.0 if info.unit == "ratio" else 1.0
        bars = ax.bar(
            names, [h * scale for h in heights], color=[colors[i % len(colors)] for i in range(len(names))]
        )
        for bar, value in zip(bars, values, strict=True):
            ax.annotate(
                format_value(value, info.unit),
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        arrow = "higher is better" if info.higher_is_better else "lower is better"
        ax.set_title(f"{info.title}\n({arrow})", fontsize=9)
        if info.unit == "ratio":
            ax.set_ylabel("%")
        ax.tick_params(axis="x", labelsize=8)
    ax = flat[len(infos)]
    bottom = [0.0] * len(card.clusters)
    for i, action in enumerate(_actions(card)):
        heights = [c.xid_per_1000_gpu_hours_by_action.get(action, 0.0) for c in card.clusters]
        ax.bar(names, heights, bottom=bottom, label=_literal(action), color=colors[i % len(colors)])
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_title("Xid errors / 1000 GPU-h by action\n(lower is better)", fontsize=9)
    if _actions(card):
        ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=8)
    for extra in flat[panels:]:
        extra.set_visible(False)
    fig.suptitle(_literal(f"babysitter scorecard by {card.by}, last {card.window}"), fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
