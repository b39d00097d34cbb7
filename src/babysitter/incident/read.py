"""Reading bundles back: the list of a run's incidents, and one incident whole.

Everything in a bundle was written by processes of the run (its ranks answer as the run's owner), so
it is read as untrusted: regular files only (no link followed), each read bounded, every value checked
for its type before use. A bundle without ``bundle.json`` is still being gathered (or its gatherer
died): it is listed as incomplete and shown from what it holds.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.incident.analyze import innermost, stuck_collective
from babysitter.training import incident_files as F
from babysitter.training.incidents import MAX_RANK_BYTES

__all__ = ["Incident", "IncidentError", "Summary", "list_incidents", "load_incident"]

MiB = 1024 * 1024
_LIMITS = {"bundle.json": 4 * MiB, "alert.json": MiB, "host.json": 8 * MiB, "ledger.json": 4 * MiB}
_CRASH_BYTES = 64 * 1024 + 256
_MAX_RANKS = 1 << 20


class IncidentError(ValueError):
    """No such incident, or a path that is not a run directory with incidents."""


def _ints(value: object) -> list[int]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_RANKS]


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class Summary:
    """One line of ``babysitter incident list``."""

    id: str
    path: Path
    complete: bool
    run: str | None = None
    alert: str = ""
    starts_at: float | None = None
    created: float | None = None
    world_size: int | None = None
    answered: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    stuck: dict[str, Any] | None = None
    bytes: int = 0
    hosts: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = dict(self.__dict__)
        out["path"] = str(self.path)
        return out


@dataclass
class Incident:
    """One bundle, read whole (within bounds)."""

    summary: Summary
    bundle: dict[str, Any]
    alert: dict[str, Any]
    answers: dict[int, dict[str, Any]]
    host: dict[str, Any]
    ledger: list[dict[str, Any]]
    crashes: list[dict[str, Any]]
    hangs: list[str]
    problems: list[str]

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form: the summary, the alert, each rank's innermost frames, the evidence."""
        ranks = {}
        for rank, answer in sorted(self.answers.items()):
            ranks[str(rank)] = {
                **{
                    k: answer.get(k)
                    for k in ("pid", "host", "step", "seconds_since_last_step", "world_size", "truncated")
                },
                "innermost": innermost(answer),
                "flight": {k: v for k, v in _dict(answer.get("flight")).items() if k != "entries"},
            }
        return {
            **self.summary.to_json(),
            "culprit": self.bundle.get("culprit"),
            "rank_hosts": _dict(self.bundle.get("rank_hosts")),
            "notes": self.bundle.get("notes", []),
            "alert_detail": self.alert,
            "ranks": ranks,
            "host": self.host,
            "ledger_tail": self.ledger[-20:],
            "crashes": self.crashes,
            "hang_dumps": self.hangs,
            "problems": self.problems,
        }


def _incidents_dir(run_dir: Path) -> Path:
    if not run_dir.is_dir():
        raise IncidentError(f"{run_dir} is not a directory")
    return run_dir / F.INCIDENTS


def _read(folder: int, name: str, problems: list[str]) -> Any:
    try:
        return F.read_json(name, dir_fd=folder, limit=_LIMITS.get(name, MAX_RANK_BYTES + 1024))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problems.append(f"{name}: {exc}"[:300])
        return None


def _summary(incident: str, path: Path, bundle: dict[str, Any] | None, alert: dict[str, Any]) -> Summary:
    labels = _dict(alert.get("labels"))
    name = alert.get("name") or labels.get("alertname") or ""
    out = Summary(
        id=incident,
        path=path,
        complete=bundle is not None,
        alert=str(name)[:200],
        starts_at=_number(alert.get("starts_at")),
    )
    if bundle is None:
        return out
    run = bundle.get("run")
    out.run = run if isinstance(run, str) else None
    out.created = _number(bundle.get("created"))
    world = bundle.get("world_size")
    out.world_size = world if isinstance(world, int) and not isinstance(world, bool) else None
    out.answered = _ints(bundle.get("answered"))
    out.missing = _ints(bundle.get("missing"))
    stuck = bundle.get("stuck")
    out.stuck = stuck if isinstance(stuck, dict) else None
    size = bundle.get("bytes")
    out.bytes = size if isinstance(size, int) and not isinstance(size, bool) else 0
    hosts = bundle.get("hosts")
    out.hosts = [str(h)[:253] for h in hosts] if isinstance(hosts, list) else []
    return out


def list_incidents(run_dir: Path) -> list[Summary]:
    """The run directory's incidents, oldest first."""
    top = _incidents_dir(run_dir)
    out: list[Summary] = []
    try:
        fd = F.open_dir(top)
    except FileNotFoundError:
        return out
    try:
        for incident in F.list_ids(fd):
            problems: list[str] = []
            try:
                with F.opened_dir(incident, dir_fd=fd) as folder:
                    bundle = _read(folder, F.BUNDLE, problems)
                    alert = _dict(_read(folder, "alert.json", problems))
            except OSError:
                continue  # a link or a file where a bundle's directory belongs: not ours
            out.append(
                _summary(incident, top / incident, bundle if isinstance(bundle, dict) else None, alert)
            )
    finally:
        os.close(fd)
    return out


def load_incident(run_dir: Path, incident: str) -> Incident:
    """One incident, whole; IncidentError when there is no such bundle."""
    if not F.valid_id(incident):
        raise IncidentError(
            f"{incident[:80]!r} is not an incident id (like 20260101T120000Z-0123456789abcdef: the page's)"
        )
    top = _incidents_dir(run_dir)
    problems: list[str] = []
    try:
        folder = F.open_dir(top / incident)
    except (FileNotFoundError, NotADirectoryError):
        known = [s.id for s in list_incidents(run_dir)][-5:]
        raise IncidentError(
            f"no incident {incident} in {top}" + (f" (newest: {', '.join(known)})" if known else "")
        ) from None
    try:
        raw = _read(folder, F.BUNDLE, problems)
        bundle = raw if isinstance(raw, dict) else None
        alert = _dict(_read(folder, "alert.json", problems))
        answers = _answers(folder, problems)
        host = _dict(_read(folder, "host.json", problems))
        ledger = [
            r for r in _dict(_read(folder, "ledger.json", problems)).get("records", []) if isinstance(r, dict)
        ]
        crashes = _crashes(folder, problems)
        hangs = _names(folder, "hangs")
    finally:
        os.close(folder)
    summary = _summary(incident, top / incident, bundle, alert)
    if bundle is None:  # still being gathered, or its gatherer died: what is there
        problems.append("no bundle.json: the bundle is incomplete (being gathered, or its gatherer stopped)")
        summary.answered = sorted(answers)
        summary.stuck = stuck_collective(answers, [])
    return Incident(summary, bundle or {}, alert, answers, host, ledger, crashes, hangs, problems)


def _answers(folder: int, problems: list[str]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    try:
        ranks = F.open_dir(F.RANKS, dir_fd=folder)
    except OSError:
        return out
    try:
        for name in sorted(os.listdir(ranks)):
            rank = F.rank_of(name)
            if rank is None:
                continue
            answer = _read(ranks, name, problems)
            if isinstance(answer, dict) and answer.get("rank") == rank:
                out[rank] = answer
    finally:
        os.close(ranks)
    return out


def _names(folder: int, sub: str) -> list[str]:
    try:
        with F.opened_dir(sub, dir_fd=folder) as fd:
            return sorted(
                f"{sub}/{n}"
                for n in os.listdir(fd)
                if stat.S_ISREG(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode)
            )
    except OSError:
        return []


def _crashes(folder: int, problems: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        fd = F.open_dir("crashes", dir_fd=folder)
    except OSError:
        return out
    try:
        for name in sorted(os.listdir(fd)):
            try:
                record = F.read_json(name, dir_fd=fd, limit=_CRASH_BYTES)
            except (OSError, ValueError) as exc:
                problems.append(f"crashes/{name}: {exc}"[:300])
                continue
            if isinstance(record, dict):
                out.append(record)
    finally:
        os.close(fd)
    return sorted(out, key=lambda r: _number(r.get("time")) or 0.0)
