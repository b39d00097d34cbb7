"""An incident in words: what ``babysitter incident list`` and ``show`` print.

Every value comes from files the run's processes wrote or from Prometheus: each line is passed
through :func:`babysitter.terminal.clean` by the caller's print, and nothing here is markup.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from babysitter.incident.analyze import innermost
from babysitter.incident.read import Incident, Summary

__all__ = ["list_lines", "show_lines"]

_GROWTH_SHOWN = 20
_FRAMES = 3


def _d(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _l(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _utc(t: float | None) -> str:
    if t is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _clock(t: object) -> str:
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return "?"
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def _ranks(ranks: Iterable[int], limit: int = 16) -> str:
    items = sorted(ranks)
    text = ", ".join(str(r) for r in items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "") if items else "none"


def _stuck(stuck: dict[str, Any] | None) -> str:
    if not stuck:
        return ""
    op = stuck.get("op") or "collective"
    text = f"{op} #{stuck.get('seq')} of group {stuck.get('group')}"
    numel = stuck.get("numel")
    return text + (f" ({numel} elements)" if isinstance(numel, int) else "")


def list_lines(items: list[Summary]) -> list[str]:
    """One line per incident, newest last."""
    if not items:
        return ["no incidents"]
    lines = []
    for s in items:
        if s.run is not None and s.complete:
            world = s.world_size if s.world_size is not None else "?"
            ranks = f"{len(s.answered)}/{world} ranks answered"
            if s.missing:
                ranks += f", not {_ranks(s.missing, 6)}"
        elif s.complete:
            ranks = "no ranks (a host's incident)"
        else:
            ranks = "incomplete"
        stuck = _stuck(s.stuck)
        where = f" on {', '.join(s.hosts[:3])}" if s.hosts else ""
        lines.append(
            f"{s.id}  {_utc(s.starts_at or s.created)}  {s.alert or '?'}{where}  {ranks}"
            + (f"  stuck in {stuck}" if stuck else "")
        )
    return lines


def _frame(frame: dict[str, Any]) -> str:
    path = str(frame.get("file", "?"))
    short = "/".join(path.rsplit("/", 2)[-2:])
    code = str(frame.get("code", "")).strip()
    return f"{short}:{frame.get('line', '?')} in {frame.get('function', '?')}" + (f": {code}" if code else "")


def _host_lines(host: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for instance, state in sorted(_d(host.get("hosts")).items()):
        if not isinstance(state, dict):
            continue
        series, grew = _l(state.get("series")), _l(state.get("grew"))
        lines.append(f"Host {instance}: {len(series)} series of its node agent kept")
        for item in grew[:_GROWTH_SHOWN]:
            labels = dict(_d(_d(item).get("labels")))
            name = labels.pop("metric", "?")
            keep = {
                k: v for k, v in labels.items() if k not in ("instance", "job", "cluster", "uuid", "model")
            }
            shown = ", ".join(f"{k}={v}" for k, v in sorted(keep.items()))
            value = _d(item).get("value")
            amount = f"{value:g}" if isinstance(value, (int, float)) else "?"
            lines.append(f"  {name}{{{shown}}} grew by {amount} in the hour before")
        if len(grew) > _GROWTH_SHOWN:
            lines.append(f"  ... and {len(grew) - _GROWTH_SHOWN} more counters that grew")
        if not grew and series:
            lines.append("  no counter of its GPUs, fabric or host grew in the hour before")
        down = [
            s for s in series if (s.get("labels") or {}).get("__name__") == "gpu_up" and s.get("value") == 0
        ]
        for item in down:
            lines.append(f"  GPU {(item.get('labels') or {}).get('gpu', '?')} is down (gpu_up 0)")
        for error in state.get("errors") or []:
            lines.append(f"  not read: {error}")
    return lines


def show_lines(incident: Incident) -> list[str]:
    """The whole incident, for a person: the alert, the ranks, the stuck collective, the host, the rest."""
    s, bundle = incident.summary, incident.bundle
    out = [f"Incident {s.id}" + (f" of run {s.run}" if s.run else "") + f" ({s.path})"]
    if s.complete:
        finished = bundle.get("finished")
        took = (
            f" in {finished - s.created:.1f} s"
            if isinstance(finished, (int, float)) and s.created is not None
            else ""
        )
        out.append(f"Gathered {_utc(s.created)}{took}, {s.bytes} bytes")
    alert = incident.alert
    if alert:
        annotations = _d(alert.get("annotations"))
        out.append(f"Alert: {s.alert}, firing since {_utc(s.starts_at)}: {annotations.get('summary', '')}")
    culprit = _d(bundle.get("culprit"))
    if culprit.get("culprit_hosts"):
        out.append(f"The page names the culprit's host: {culprit['culprit_hosts']}")
    description = str(culprit.get("description", ""))
    if description:
        out.append(f"  {description[:600]}")
    hosts = _d(bundle.get("rank_hosts"))
    if s.run is not None:
        world = s.world_size if s.world_size is not None else "?"
        out.append(f"Ranks: {len(s.answered)} of {world} answered")
        for rank in s.missing:
            where = f" (reported through {hosts[str(rank)]})" if str(rank) in hosts else ""
            out.append(f"  rank {rank} did not answer{where}: stopped, hung hard in C, or dead")
    stuck = s.stuck
    if stuck:
        since = f", enqueued {_clock(stuck.get('enqueued_at'))}" if stuck.get("enqueued_at") else ""
        out.append(f"Stuck collective: {_stuck(stuck)}{since}")
        out.append(f"  waiting in it: ranks {_ranks(stuck.get('waiting') or [])}")
        never = stuck.get("never_reached") or []
        if never:
            remembered = stuck.get("last_enqueued_from_prometheus") or {}
            notes = [
                f"{r} (last enqueued #{remembered[str(r)]}, Prometheus)"
                for r in never
                if str(r) in remembered
            ]
            plain = [str(r) for r in never if str(r) not in remembered]
            out.append(f"  never reached it: ranks {', '.join(plain + notes)}")
        if stuck.get("unknown"):
            out.append(f"  unknown (no answer, nothing in Prometheus): ranks {_ranks(stuck['unknown'])}")
    elif s.run is not None and incident.answers:
        out.append("Stuck collective: none (no answering rank waits in a collective)")
    if incident.answers:
        out.append("Each rank's innermost frames (its training thread):")
        for rank, answer in sorted(incident.answers.items()):
            age = answer.get("seconds_since_last_step")
            since = f", {age:.1f} s since its last step" if isinstance(age, (int, float)) else ""
            who = f"pid {answer.get('pid')} on {answer.get('host')}, step {answer.get('step')}"
            out.append(f"  rank {rank} ({who}{since}):")
            frames = innermost(answer, _FRAMES)
            out += [f"    {_frame(f)}" for f in frames] or ["    (no frames)"]
    out += _host_lines(incident.host)
    for crash in incident.crashes:
        frames = _l(crash.get("frames"))
        where = f" at {_frame(frames[-1])}" if frames and isinstance(frames[-1], dict) else ""
        out.append(
            f"Crash: rank {crash.get('rank')} (pid {crash.get('pid')} on {crash.get('host')}) at "
            f"{_clock(crash.get('time'))}, step {crash.get('step')}: {crash.get('type')}: "
            f"{str(crash.get('message', ''))[:300]}{where}"
        )
    for name in incident.hangs:
        out.append(f"Hang dump: {s.path / name}")
    if incident.ledger:
        kinds = [str(r.get("k", "?")) for r in incident.ledger[-8:]]
        out.append(f"Ledger: {len(incident.ledger)} last records kept, the newest: {' '.join(kinds)}")
    for note in _l(bundle.get("notes")) + incident.problems:
        out.append(f"Note: {note}")
    return out
