"""What the ranks' answers say together: the collective they are stuck in, and who never reached it.

Each answering rank says, per process group, the last collective it enqueued and the last it completed
(the flight recorder's counters). Ranks with one enqueued but not completed wait; the collective waited
in is the oldest such (``completed + 1``); a rank whose last enqueued is below it never reached it. A
rank that did not answer is judged from Prometheus' last value of its
``train_collective_last_enqueued_seq`` when there is one (a stopped rank's last scrape), else it is
unknown, and said so: never counted among the waiting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["innermost", "stuck_collective"]

_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _groups(answer: Mapping[str, Any]) -> dict[str, tuple[str, int, int]]:
    """``{group name: (pg_id, enqueued, completed)}`` of one answer (malformed entries skipped)."""
    flight = answer.get("flight")
    groups = flight.get("groups") if isinstance(flight, dict) else None
    out: dict[str, tuple[str, int, int]] = {}
    if not isinstance(groups, dict):
        return out
    for pg_id, group in groups.items():
        if not isinstance(group, dict):
            continue
        enqueued, completed = _int(group.get("enqueued")), _int(group.get("completed"))
        name = group.get("name") if isinstance(group.get("name"), str) and group.get("name") else str(pg_id)
        if enqueued is not None and completed is not None:
            out[str(name)] = (str(pg_id), enqueued, completed)
    return out


def _entry(answer: Mapping[str, Any], pg_id: str, seq: int) -> dict[str, Any] | None:
    flight = answer.get("flight")
    entries = flight.get("entries") if isinstance(flight, dict) else None
    for item in entries if isinstance(entries, list) else ():
        if isinstance(item, dict) and str(item.get("pg_id")) == pg_id and item.get("seq") == seq:
            return item
    return None


def stuck_collective(
    answers: Mapping[int, Mapping[str, Any]],
    missing: list[int],
    last_enqueued: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any] | None:
    """The collective the answering ranks wait in, or None when none waits.

    ``last_enqueued``: Prometheus' ``{group: {rank: seq}}`` for the ranks that did not answer.
    The default group (named ``0``) wins when it has waiting ranks; otherwise the group with most.
    """
    per_group: dict[str, dict[int, tuple[str, int, int]]] = {}
    for rank, answer in answers.items():
        for name, counters in _groups(answer).items():
            per_group.setdefault(name, {})[rank] = counters
    waiting_groups = {
        name: {r for r, (_, enq, done) in ranks.items() if enq > done} for name, ranks in per_group.items()
    }
    candidates = [name for name, waiting in waiting_groups.items() if waiting]
    if not candidates:
        return None
    group = "0" if "0" in candidates else max(candidates, key=lambda n: (len(waiting_groups[n]), n))
    ranks = per_group[group]
    waiting = sorted(waiting_groups[group])
    seq = min(ranks[r][2] + 1 for r in waiting)
    entry = None
    for rank in waiting:
        entry = _entry(answers[rank], ranks[rank][0], seq)
        if entry is not None:
            break
    reached = sorted(r for r, (_, enq, _) in ranks.items() if enq >= seq)
    never = sorted(r for r, (_, enq, _) in ranks.items() if enq < seq)
    remembered = (last_enqueued or {}).get(group, {})
    unknown: list[int] = []
    from_prometheus: dict[str, int] = {}
    for rank in sorted(missing):
        last = remembered.get(str(rank))
        if last is None:
            unknown.append(rank)
            continue
        from_prometheus[str(rank)] = last
        (never if last < seq else reached).append(rank)
    return {
        "group": group,
        "seq": seq,
        "op": str(entry.get("op", "")) if entry else "",
        "numel": _int(entry.get("numel")) if entry else None,
        "enqueued_at": entry.get("created") if entry else None,
        "waiting": waiting,
        "reached": sorted(set(reached)),
        "never_reached": sorted(set(never)),
        "unknown": unknown,
        "last_enqueued_from_prometheus": from_prometheus,
    }


def innermost(answer: Mapping[str, Any], count: int = 3) -> list[dict[str, Any]]:
    """The training (main) thread's innermost ``count`` frames, innermost last; then, when none of
    them is the script's own code, its innermost frame outside the libraries is put first."""
    threads = answer.get("threads")
    if not isinstance(threads, list) or not threads:
        return []
    main = next((t for t in threads if isinstance(t, dict) and t.get("main")), threads[0])
    frames = main.get("frames") if isinstance(main, dict) else None
    if not isinstance(frames, list):
        return []
    frames = [f for f in frames if isinstance(f, dict)]
    tail = frames[-count:]
    own = [f for f in frames if not any(m in str(f.get("file", "")) for m in _LIBRARY_MARKERS)]
    if own and own[-1] not in tail:
        return [own[-1], *tail]
    return tail
