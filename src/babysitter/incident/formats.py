"""The provider's report written out: Markdown for a support ticket, CSV for a spreadsheet, JSON.

Values come from Prometheus' labels and the runs' files: Markdown cells have their pipes and line
breaks escaped and control characters dropped (:func:`babysitter.terminal.clean`); CSV is quoted by
the ``csv`` module, and a cell that a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``)
starts with a quote; JSON is strict.
"""

from __future__ import annotations

import csv
import io
import time

from babysitter import jsonout
from babysitter.incident.report import Report
from babysitter.terminal import clean

__all__ = ["CSV_COLUMNS", "to_csv", "to_json", "to_markdown"]

CSV_COLUMNS = (
    "cluster",
    "node",
    "lemon",
    "start_utc",
    "end_utc",
    "kinds",
    "evidence",
    "runs",
    "restarts",
    "downtime_seconds",
    "lost_progress_seconds",
    "gpu_hours",
    "price_per_gpu_hour",
    "cost",
    "bundles",
)


def _utc(t: float | None) -> str:
    return "" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _cell(value: object) -> str:
    return clean(value).replace("|", "\\|")


def _money(value: float | None) -> str:
    return "" if value is None else f"{value:,.2f}"


def to_markdown(report: Report, *, currency: str = "USD") -> str:
    """The report as Markdown."""
    lines = [
        "# Hardware incidents",
        "",
        f"Window: {_utc(report.start)} to {_utc(report.end)} UTC. GPU-hours lost: each incident's restarts' "
        "downtime plus lost progress (steps computed again) from the runs' ledgers, times the run's GPUs. "
        f"A node with {report.lemon} or more incidents is flagged as a lemon.",
        "",
        "| cluster | incidents | nodes | GPU-hours lost | price per GPU-hour | cost |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for cluster, row in sorted(report.clusters().items()):
        price = "" if row["price"] is None else f"{row['price']:g} {currency}"
        lines.append(
            f"| {_cell(cluster)} | {row['incidents']} | {row['nodes']} | {row['gpu_hours']:.2f} | {price} "
            f"| {_money(row['cost'])}{' ' + currency if row['cost'] is not None else ''} |"
        )
    lemons = set(report.lemons())
    for (cluster, node), items in sorted(report.nodes().items()):
        flag = " — **lemon node**" if (cluster, node) in lemons else ""
        hours = sum(i.cost.gpu_hours for i in items)
        lines += [
            "",
            f"## {_cell(node)} ({_cell(cluster)}){flag}",
            "",
            f"{len(items)} incident{'s' if len(items) != 1 else ''}, {hours:.2f} GPU-hours lost.",
            "",
            "| start (UTC) | end (UTC) | kind | evidence | runs | downtime s | lost progress s "
            "| GPU-hours | cost | bundles |",
            "|---|---|---|---|---|---:|---:|---:|---:|---|",
        ]
        for incident in items:
            cost = incident.cost
            runs = ", ".join(sorted({r.run for r in cost.restarts}))
            bundles = ", ".join(b.rsplit("/", 1)[-1] for b in incident.bundles)
            kinds, evidence = ", ".join(incident.kinds), "; ".join(incident.evidence)
            lines.append(
                f"| {_utc(incident.start)} | {_utc(incident.end) or 'firing'} | {_cell(kinds)} "
                f"| {_cell(evidence)} | {_cell(runs)} "
                f"| {cost.downtime_seconds:.0f} | {cost.lost_progress_seconds:.0f} | {cost.gpu_hours:.2f} "
                f"| {_money(cost.money)} | {_cell(bundles)} |"
            )
    if report.unmatched:
        lines += [
            "",
            "## Restarts no hardware incident explains (not billed)",
            "",
            "| run | restart | failed (UTC) | cause | GPU-hours |",
            "|---|---:|---|---|---:|",
        ]
        for restart in report.unmatched:
            lines.append(
                f"| {_cell(restart.run)} | {restart.index} | {_utc(restart.failed)} | {_cell(restart.cause)} "
                f"| {restart.gpu_hours:.2f} |"
            )
    for note in report.notes:
        lines += ["", f"Note: {_cell(note)}"]
    return "\n".join(lines) + "\n"


def _csv_safe(value: str) -> str:
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def to_csv(report: Report) -> str:
    """One row per incident."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    lemons = set(report.lemons())
    for incident in report.incidents:
        cost = incident.cost
        row = [
            incident.cluster,
            incident.node,
            "yes" if (incident.cluster, incident.node) in lemons else "no",
            _utc(incident.start),
            _utc(incident.end),
            " ".join(incident.kinds),
            "; ".join(incident.evidence),
            " ".join(sorted({r.run for r in cost.restarts})),
            str(len(cost.restarts)),
            f"{cost.downtime_seconds:.3f}",
            f"{cost.lost_progress_seconds:.3f}",
            f"{cost.gpu_hours:.6f}",
            "" if cost.price is None else f"{cost.price:g}",
            "" if cost.money is None else f"{cost.money:.2f}",
            " ".join(incident.bundles),
        ]
        writer.writerow([_csv_safe(clean(v)) for v in row])
    return out.getvalue()


def to_json(report: Report) -> str:
    """The report as strict JSON."""
    return jsonout.dumps(report.to_json(), indent=2) + "\n"
