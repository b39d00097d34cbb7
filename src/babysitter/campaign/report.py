"""A campaign's results as markdown (the per-fault table, the summary next to the published figures)
and as JSON (everything: the schedule, every notification, every remediation record)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from babysitter.campaign.faults import kind
from babysitter.campaign.play import Outcome
from babysitter.campaign.score import Score

__all__ = ["PUBLISHED", "markdown", "merge", "to_json"]

#: The field's published figures (docs: /shared/reference/campaigns.md), as they are published.
PUBLISHED: tuple[tuple[str, str, str], ...] = (
    ("Minder (ByteDance, NSDI'25)", "precision 0.904, F1 0.893, 3.6 s mean reaction", "production, > 1 year"),
    (
        "Holmes (NSDI'25)",
        "97.21% of faults localized; 30.3 s on a production prototype",
        "trace-driven simulation",
    ),
    ("C4D (Alibaba, HPCA'25)", "faulty node found in tens of seconds", "production"),
    (
        "Llama 3 (16,384 H100, 54 days)",
        "419 unexpected interruptions, > 90% effective training time",
        "production",
    ),
    ("ByteRobust (ByteDance, 2025)", "97% effective training time over 3 months, 9,600 GPUs", "production"),
)


def _versions() -> str:
    found = []
    for binary in ("prometheus", "prometheus-alertmanager"):
        try:
            out = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            found.append((out.stdout or out.stderr).splitlines()[0])
        except (OSError, IndexError, subprocess.SubprocessError):
            found.append(f"{binary}: not found")
    return "; ".join(found)


def to_json(outcome: Outcome, *, label: str = "") -> dict[str, Any]:
    """Everything a reader needs to check the table: schedule, grade, notifications, remediations."""
    return {
        "label": label,
        "schedule": outcome.schedule.to_json(),
        "t0": outcome.t0,
        "score": outcome.score.to_json(),
        "culprits": {str(k): v for k, v in outcome.culprits.items()},
        "job_starts": outcome.job_starts,
        "unplanned_exits": outcome.unplanned_exits,
        "events": outcome.events,
        "notifications": [
            {
                "t": round(p.received - outcome.t0, 2),
                "status": p.status,
                "alert": p.name,
                "severity": p.severity,
                "receiver": p.receiver,
                "notification": p.notification,
                "labels": p.labels,
                "summary": p.summary,
                "started": round(p.starts_at - outcome.t0, 2) if p.starts_at else None,
            }
            for p in outcome.pages
        ],
        "remediations": outcome.remediations,
        "machine": {"python": platform.python_version(), "cpus": _cpus(), "servers": _versions()},
        "started": datetime.datetime.fromtimestamp(outcome.t0, datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
        "load_average": os.getloadavg()[0],
    }


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value).replace("|", "\\|")


def _where(culprit: dict[str, Any]) -> str:
    keys = ("host", "gpu", "rank", "device", "pci_address", "controller", "step")
    return " ".join(f"{k} {culprit[k]}" for k in keys if k in culprit) or "-"


def fault_table(campaign: Mapping[str, Any]) -> list[str]:
    """The per-fault table of one campaign (its :func:`to_json` form)."""
    lines = [
        "| # | at (s) | fault | where | expected | first notification | after (s) | culprit | pages | "
        "chat | other alerts | remediation (planned: verdict) |",
        "|---:|---:|---|---|---|---|---:|---|---:|---:|---|---|",
    ]
    for i, f in enumerate(campaign["score"]["faults"], 1):
        first = f"{f['first_alert']} ({f['first_receiver']})" if f["detected"] else "**missed**"
        others = [
            *f["consequences"],
            *(f"{n} (wrong place)" for n in f["wrong_place"]),
            *(f"{n} (left over)" for n in f["left_over"]),
            *(f"{n} (still firing, sent again)" for n in f.get("resent", ())),
        ]
        pages = f"{f['pager_notifications']}" + (
            f" ({f['resolved_mid_fault']} resolved early)" if f["resolved_mid_fault"] else ""
        )
        remedy = f"{_cell(f['remedy_planned'])}: {f['remedy']} (want {f['remedy_expected']})"
        lines.append(
            f"| {i} | {f['at']:g} | {f['title']} | {_cell(_where(f['culprit']))} | {_cell(f['expected'])} | "
            f"{first} | {_cell(f['first_after'])} | {f['culprit_named']} | {pages} | "
            f"{f['chat_notifications']} | {_cell(others)} | {remedy} |"
        )
    return lines


def summary_lines(campaigns: Sequence[Mapping[str, Any]]) -> list[str]:
    """The campaigns' summaries side by side."""
    rows = (
        ("faults played", "faults"),
        ("detected (recall)", "recall"),
        ("precision", "precision"),
        ("F1", "f1"),
        ("first notification went to a pager", "paged"),
        ("time to first notification, median (s)", "first_notification_median_s"),
        ("time to first notification, p90 (s)", "first_notification_p90_s"),
        ("time to the first page, median (s)", "paged_median_s"),
        ("culprit named right / wrong / not", None),
        ("false pages per healthy hour", "false_pages_per_healthy_hour"),
        ("false chat notifications", "false_chat"),
        ("chat about a past fault's cost (goodput window)", "hindsight_chat"),
        ("sent after a fault, begun in it (group_interval)", "late"),
        ("alerts naming a place no fault touched", "wrong_place"),
        ("alerts naming the previous fault's place", "left_over"),
        ("pager notifications per fault", "notifications_per_fault"),
        ("resolved in the middle of a fault", "resolved_mid_fault"),
        ("remediation right / wrong / missed", None),
    )
    head = "| | " + " | ".join(c["label"] for c in campaigns) + " |"
    lines = [head, "|---|" + "---:|" * len(campaigns)]
    for title, key in rows:
        cells = []
        for c in campaigns:
            s = c["score"]["summary"]
            if title.startswith("culprit"):
                cells.append(f"{s['culprit_right']} / {s['culprit_wrong']} / {s['culprit_unnamed']}")
            elif title.startswith("remediation"):
                cells.append(f"{s['remedy_right']} / {s['remedy_wrong']} / {s['remedy_missed']}")
            elif key == "recall":
                cells.append(f"{s['detected']}/{s['faults']} ({s['recall']:.3f})")
            else:
                cells.append(_cell(s.get(key or "")))
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines


def merge(campaigns: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, Any]:
    """The campaigns whose label starts with ``prefix`` (one campaign played in parts, side by side:
    the shipped profile's hours do not fit one run) as one summary column, ``PREFIX, all parts``."""
    parts = [c for c in campaigns if str(c.get("label", "")).startswith(prefix)]
    if not parts:
        raise ValueError(f"no campaign's label starts with {prefix!r}")
    whole = Score.merged([c["score"] for c in parts])
    return {"label": f"{prefix}, all {len(parts)} parts", "score": whole.to_json()}


def markdown(campaigns: Sequence[Mapping[str, Any]], *, command: str = "", merged: Sequence[str] = ()) -> str:
    """The results page: the summary next to the published figures (with a column for each prefix in
    ``merged``: a campaign played in parts, as one), then each campaign's schedule and per-fault
    table, its notifications in healthy time and its job's restarts."""
    out = ["## Summary", ""]
    out += summary_lines([*[merge(campaigns, prefix) for prefix in merged], *campaigns])
    out += ["", "Published figures, for comparison (their methods differ: production incidents, traces):", ""]
    out += ["| system | figure | how |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in PUBLISHED]
    for c in campaigns:
        s, score = c["schedule"], c["score"]
        shape = s["shape"]
        out += ["", f"## {c['label']}", ""]
        out.append(
            f"Seed {s['seed']}, profile {s['profile']}, {shape['hosts']} hosts x {shape['gpus']} GPUs, one "
            f"rank per host; {len(s['faults'])} faults over {s['length'] / 60:.0f} min; "
            f"{score['healthy_seconds'] / 60:.1f} min of healthy time; the job started {c['job_starts']} "
            f"times, exited unplanned {len(c['unplanned_exits'])} times."
        )
        if s["noise"]:
            noise = ", ".join(
                f"{n['kind']} at {n['at']:g} s" + (f" ({n['seconds']:g} s)" if n["seconds"] else "")
                for n in s["noise"]
            )
            out.append(f"Healthy noise (must not page): step-time jitter throughout; {noise}.")
        out += ["", *fault_table(c)]
        false = [*score["false_pages"], *score["false_chat"]]
        if false:
            out += ["", "Notifications in healthy time:", ""]
            for p in false:
                where = " ".join(f"{k}={v}" for k, v in p["labels"].items())
                out.append(f"- {p['t']} s: {p['alert']} to {p['receiver']} {where}".rstrip())
        else:
            out += ["", "No notification in healthy time."]
        after = score.get("hindsight_chat") or []
        if after:
            out += ["", "In healthy time about a fault inside the alert's window (not counted as false):", ""]
            out += [f"- {p['t']} s: {p['alert']} to {p['receiver']}" for p in after]
        late = score.get("late") or []
        if late:
            out += ["", "Sent in healthy time, begun in a fault and about it (not counted as false):", ""]
            out += [f"- {p['t']} s: {p['alert']} to {p['receiver']}" for p in late]
    if command:
        out += ["", f"Command: `{command}`"]
    return "\n".join(out) + "\n"


def fault_titles() -> dict[str, str]:
    """Every kind's title (for the docs)."""
    from babysitter.campaign.faults import KINDS

    return {k.name: kind(k.name).title for k in KINDS}
