"""Grade a campaign the way an on-call engineer would: per fault and overall.

Per fault (its window: from its start until it was cleared and settled):

* **detected**: a notification of an alert the fault must cause (:class:`babysitter.campaign.faults.Expect`)
  arrived, on any receiver; **time to first notification** and the receiver (``pager``: a pager
  receiver, ``chat``, ``switch``: the external dead man's switch);
* **culprit**: ``right`` when every such notification that names a place names the fault's (host,
  GPU, port, PCI address, memory controller, rank, checkpoint step or file), ``wrong`` when one names
  another, ``unnamed`` when none names any;
* **notifications**: the pager notifications in the window (a notification is one webhook request:
  alerts Alertmanager grouped count once), and how many of them were resolutions sent before the
  fault was cleared (a resolve in the middle of a fault); chat notifications apart;
* **others**: the other alerts that notified in the window, each either about the fault's place or
  run (a consequence) or about a place no fault touched (**wrong place**, a false page), or about the
  place of the fault before (**left over**); an alert already firing when the window opened and
  notified again in it (a Prometheus restart re-sends what is still true) is **resent**, apart;
* **remediation**: what ``babysitter remediate --dry-run`` planned in the window, against the kind's
  remedy (drain the culprit's host, requeue the job, or nothing).

Overall: recall (detected faults), precision (notifications about a fault over all notifications),
culprit accuracy, time to first notification, false pages per hour of healthy time (time outside
every fault's window), notifications per fault, remediation accuracy.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from babysitter.campaign.faults import Kind, kind
from babysitter.campaign.schedule import Schedule
from babysitter.demo.pager import Page

__all__ = [
    "HEARTBEAT",
    "SWITCH",
    "FaultScore",
    "Score",
    "score",
    "switch_pages",
]

#: The always-firing alert the dead man's switch listens for, and the page the switch sends.
HEARTBEAT = "Watchdog"
SWITCH = "DeadMansSwitch"
#: A training process gone without closing its tracker: every rank of a job a fault killed.
EXITED = "TrainingProcessExited"
#: Labels that name a place (a page naming another value of one of them is about another place).
_PLACE = ("instance", "gpu", "device", "port", "pci_address", "controller", "rank")


@dataclass(frozen=True)
class FaultScore:
    """The grade of one fault (see the module docstring)."""

    kind: str
    title: str
    at: float
    seconds: float
    culprit: dict[str, Any]
    expected: tuple[str, ...]
    detected: bool
    first_after: float | None
    first_alert: str
    first_receiver: str
    #: Seconds to the first pager notification of an expected alert (None: it never paged).
    paged_after: float | None
    culprit_named: str
    pager_notifications: int
    resolved_mid_fault: int
    chat_notifications: int
    consequences: tuple[str, ...]
    wrong_place: tuple[str, ...]
    left_over: tuple[str, ...]
    remedy_expected: str
    remedy_planned: tuple[str, ...]
    remedy: str
    #: Alerts already firing when the fault began, notified again in its window (Alertmanager resolved
    #: them while Prometheus was down, and they fired again when it came back): still true, about an
    #: earlier fault, neither a consequence nor a wrong place.
    resent: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Its JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class Score:
    """The campaign's grade."""

    faults: tuple[FaultScore, ...]
    healthy_seconds: float
    false_pages: tuple[dict[str, Any], ...]
    false_chat: tuple[dict[str, Any], ...]
    summary: dict[str, Any] = field(default_factory=dict)
    #: Notifications in healthy time of an alert that looks back (``hindsight``) at a fault inside
    #: its window: true statements about the past, not false alarms, counted apart.
    hindsight_chat: tuple[dict[str, Any], ...] = ()
    #: Notifications in healthy time of an alert that began firing in a fault, about that fault
    #: (its place, or the exit of a rank it killed): late news of it, not false alarms, counted apart
    #: (a late page counts among its fault's pager notifications too).
    late: tuple[dict[str, Any], ...] = ()

    @classmethod
    def merged(cls, parts: Sequence[Mapping[str, Any]]) -> Score:
        """One grade from the JSON grades (:meth:`to_json`) of a campaign played in parts (its
        faults split over runs side by side): every fault and healthy second of each, summed up."""

        def fault(f: Mapping[str, Any]) -> FaultScore:
            fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in f.items()}
            return FaultScore(**fields)

        faults = tuple(fault(f) for part in parts for f in part["faults"])

        def rows(key: str) -> tuple[dict[str, Any], ...]:
            return tuple(row for part in parts for row in part.get(key, ()))

        whole = cls(
            faults,
            round(sum(float(part["healthy_seconds"]) for part in parts), 1),
            rows("false_pages"),
            rows("false_chat"),
            {},
            rows("hindsight_chat"),
            rows("late"),
        )
        return replace(whole, summary=_summary(whole))

    def to_json(self) -> dict[str, Any]:
        """Its JSON form."""
        return {
            "summary": self.summary,
            "faults": [f.to_json() for f in self.faults],
            "healthy_seconds": self.healthy_seconds,
            "false_pages": list(self.false_pages),
            "false_chat": list(self.false_chat),
            "hindsight_chat": list(self.hindsight_chat),
            "late": list(self.late),
        }


def switch_pages(heartbeats: Iterable[float], period: float, start: float, end: float) -> list[float]:
    """When an external dead man's switch with ``period`` would have paged, given the heartbeat
    notifications it received between ``start`` (it was armed) and ``end``: once per silence longer
    than the period, ``period`` after the last heartbeat."""
    out = []
    last = start
    for beat in sorted(b for b in heartbeats if start <= b <= end):
        if beat - last > period:
            out.append(last + period)
        last = beat
    if end - last > period:
        out.append(last + period)
    return out


def _transitions(pages: Sequence[Page]) -> list[Page]:
    """What a person saw change: per receiver and alert (its labels), a firing alert when it starts
    firing and a resolved one when it resolves. Alertmanager sends a group's every alert whenever the
    group changes; an alert already firing, sent again beside a new one, is not news."""
    state: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}
    out = []
    for page in pages:
        key = _series(page)
        if state.get(key, "resolved") != page.status:
            out.append(page)
        state[key] = page.status
    return out


def _series(page: Page) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    return (page.receiver, page.name, tuple(sorted(page.labels.items())))


def _firing_at(alerts: Sequence[Page], t: float) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """The alerts (per receiver, with their labels) whose last transition before ``t`` was firing."""
    state: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}
    for page in alerts:
        if page.received >= t:
            break
        state[_series(page)] = page.status
    return {key for key, status in state.items() if status == "firing"}


def _is_pager(receiver: str) -> bool:
    return receiver == "pager" or receiver.startswith("pager-") or receiver == "switch"


def _text(page: Page) -> str:
    return " ".join(
        [page.summary, page.annotations.get("description", ""), page.annotations.get("culprit_hosts", "")]
    )


def _names(page: Page, k: Kind, culprit: Mapping[str, Any]) -> str:
    """Whether ``page`` (an expected alert) names the fault's place: right, wrong or unnamed."""
    expect = next((e for e in k.expect if e.alert == page.name), None)
    if expect is None:
        return "unnamed"
    verdicts = []
    for key in expect.keys:
        want = str(culprit.get(key, ""))
        got = page.labels.get("instance" if key == "host" else key)
        verdicts.append("unnamed" if got is None else "right" if got == want else "wrong")
    text = _text(page)
    for key in expect.texts:
        want = str(culprit.get(key, ""))
        if key == "rank":
            found = re.findall(r"\brank (\d+)", text)
            verdicts.append(
                "unnamed" if not found else "right" if want in found and len(set(found)) == 1 else "wrong"
            )
        elif key == "host":
            hosts = {h.rstrip(".") for h in re.findall(r"\bhost ([^\s,;()]+)", text)} | {
                h for h in page.annotations.get("culprit_hosts", "").split(",") if h
            }
            verdicts.append("unnamed" if not hosts else "right" if hosts == {want} else "wrong")
        elif key == "step":
            steps = re.findall(r"\bstep (\d+)", text)
            verdicts.append("unnamed" if not steps else "right" if want in steps else "wrong")
        elif key == "data":
            cause = re.search(r"likely ([a-z ]+?)(?: on host|[.;]|$)", page.summary)
            verdicts.append("unnamed" if cause is None else "right" if "data" in cause.group(1) else "wrong")
    if "wrong" in verdicts:
        return "wrong"
    if verdicts and all(v == "right" for v in verdicts):
        return "right"
    return "unnamed" if verdicts else "right"


def _place_of(page: Page) -> dict[str, str]:
    return {key: page.labels[key] for key in _PLACE if key in page.labels}


def _about(page: Page, culprit: Mapping[str, Any]) -> bool:
    """Whether ``page`` is about the fault's place: its host, or the run as a whole (no host label)."""
    place = _place_of(page)
    host = culprit.get("host")
    if "instance" in place:
        return host is not None and place["instance"] == host
    if "rank" in place:
        return str(culprit.get("rank", "")) == place["rank"]
    return True  # a run-level or cluster-level alert: a consequence of whatever happened


def _belongs(page: Page, k: Kind, culprit: Mapping[str, Any]) -> bool:
    """Whether ``page`` is about fault ``k``: at its place, one of its related alerts, or the exit of
    any rank of a job the fault killed (torchrun stops the others; a rank stuck in a collective dies
    without closing its tracker, and says so truly, naming its own host)."""
    if _about(page, culprit) or page.name in k.related:
        return True
    return k.interrupts and page.name == EXITED


def _remedy(
    expected: str, records: Sequence[dict[str, Any]], host: str | None
) -> tuple[tuple[str, ...], str]:
    """What was planned (``drain 127.0.0.3``, ``requeue 4242``) and whether it was right."""
    planned = []
    drains, requeues, annotated = set(), 0, 0
    for r in records:
        if (
            r.get("event") == "skipped"
            and r.get("action") == "requeue"
            and "requeued" in str(r.get("detail"))
        ):
            # The job was requeued for another alert moments ago (the policy's window): decided, once.
            requeues += 1
            continue
        if r.get("event") != "action":
            continue
        action = str(r.get("action"))
        target = str(r.get("host") or "")
        if action == "requeue":
            target = f"job {r.get('job')}" if r.get("job") else "?"
        planned.append(f"{action} {target}".strip())
        if action == "drain":
            drains.add(str(r.get("host")))
        elif action == "requeue":
            requeues += 1
        elif action == "annotate":
            annotated += 1
    host = host.rsplit(":", 1)[0] if host else host  # the scheduler's node name: the instance's host
    want_drain = expected.startswith("drain")
    want_requeue = expected.endswith("requeue")
    if drains - ({host} if want_drain and host else set()):
        verdict = "wrong"
    elif expected in ("none", "annotate"):
        verdict = "right" if not requeues else "wrong"
    elif want_drain and host not in drains:
        verdict = "missed" if not planned else "partial"
    elif want_requeue and not requeues:
        verdict = "partial" if planned else "missed"
    else:
        verdict = "right"
    return tuple(planned), verdict


def score(
    schedule: Schedule,
    pages: Sequence[Page],
    t0: float,
    *,
    culprits: Mapping[int, Mapping[str, Any]],
    remediations: Sequence[dict[str, Any]] = (),
    switch_period: float = 0.0,
    end: float | None = None,
    hindsight: Mapping[str, float] | None = None,
) -> Score:
    """Grade ``pages`` (every notification's alerts) and ``remediations`` (audit records) against
    ``schedule`` started at ``t0``. ``culprits`` gives each fault (by index) its places as the pages
    spell them (``host`` as the agent's instance, a checkpoint's step...).

    ``hindsight``: alerts that judge a window of the past (TrainingGoodputLow: the goodput over its
    window), by name, with that window in seconds. A chat notification of one in healthy time, with a
    fault begun within its window before, says something true about that fault's cost: it is counted
    as hindsight, not as a false notification. A page never is."""
    end = t0 + schedule.length if end is None else end
    # A resolved Watchdog is no heartbeat: the shipped receiver has send_resolved: false, and the
    # resolve means Alertmanager stopped hearing from Prometheus (its endsAt passed).
    beats = [p.received for p in pages if p.name == HEARTBEAT and p.status == "firing"]
    switch = [
        Page(t, "firing", SWITCH, "critical", {"paged_at": f"{t:.1f}"}, receiver="switch")
        for t in (switch_pages(beats, switch_period, t0 + 30.0, end) if switch_period else [])
    ]
    alerts = _transitions(
        sorted((p for p in [*pages, *switch] if p.name != HEARTBEAT), key=lambda p: p.received)
    )
    windows = [(t0 + f.at, t0 + (f.until or f.end)) for f in schedule.faults]

    def began_in(p: Page) -> int | None:
        """The fault a notification sent in healthy time is late news of: its alert began firing (its
        startsAt) in that fault's window and is about it. Alertmanager sends an alert that joins a
        group already notified at the group's next group_interval (chat: 5 m)."""
        if p.status != "firing" or not p.starts_at or any(lo <= p.received < hi for lo, hi in windows):
            return None
        for index, (lo, hi) in enumerate(windows):
            if lo <= p.starts_at < hi:
                f = schedule.faults[index]
                about = _belongs(p, kind(f.kind), dict(culprits.get(index, f.culprit)))
                return index if about else None
        return None

    scored = []
    for index, f in enumerate(schedule.faults):
        k = kind(f.kind)
        lo, hi = windows[index]
        culprit = dict(culprits.get(index, f.culprit))
        before = culprits.get(index - 1, {}) if index else {}
        mine = [p for p in alerts if lo <= p.received < hi]
        firing = [p for p in mine if p.status == "firing"]
        expected = [p for p in firing if p.name in k.alerts]
        verdicts = {_names(p, k, culprit) for p in expected}
        named = "wrong" if "wrong" in verdicts else "right" if "right" in verdicts else "unnamed"
        first = expected[0] if expected else None
        paged = next((p for p in expected if _is_pager(p.receiver)), None)
        pager_ids = {p.notification or id(p) for p in mine if _is_pager(p.receiver) and p.status == "firing"}
        # A page sent after the window about this fault is still one of its pages.
        pager_ids |= {
            p.notification or id(p) for p in alerts if _is_pager(p.receiver) and began_in(p) == index
        }
        resolved_early = {
            p.notification
            for p in mine
            if _is_pager(p.receiver)
            and p.status == "resolved"
            and p.received < t0 + f.end
            # Its own page resolving, not another alert's (seed 1 counted a RuleEvaluationFailing
            # resolve from the fault before as the EDAC page "resolved early").
            and p.name in k.alerts
        }
        chat_ids = {p.notification for p in firing if p.receiver == "chat"}
        carried = _firing_at(alerts, lo)
        resent = sorted({p.name for p in firing if p.name not in k.alerts and _series(p) in carried})
        others = [p for p in firing if p.name not in k.alerts and _series(p) not in carried]
        wrong = sorted(
            {p.name for p in others if not _belongs(p, k, culprit) and not (before and _about(p, before))}
        )
        left = sorted(
            {p.name for p in others if before and not _belongs(p, k, culprit) and _about(p, before)}
        )
        consequences = sorted({p.name for p in others} - set(wrong) - set(left))
        records = [r for r in remediations if lo <= float(r.get("t", 0.0)) < hi]
        planned, remedy = _remedy(k.remedy, records, culprit.get("host"))
        scored.append(
            FaultScore(
                kind=f.kind,
                title=k.title,
                at=f.at,
                seconds=f.seconds,
                culprit=culprit,
                expected=k.alerts,
                detected=first is not None,
                first_after=round(first.received - lo, 1) if first else None,
                first_alert=first.name if first else "",
                first_receiver=("pager" if paged else first.receiver) if first else "",
                paged_after=round(paged.received - lo, 1) if paged else None,
                culprit_named=named if first else "-",
                pager_notifications=len(pager_ids | resolved_early),
                resolved_mid_fault=len(resolved_early),
                chat_notifications=len(chat_ids),
                consequences=tuple(consequences),
                wrong_place=tuple(wrong),
                left_over=tuple(left),
                remedy_expected=k.remedy,
                remedy_planned=planned,
                remedy=remedy,
                resent=tuple(resent),
            )
        )
    healthy = [
        p for p in alerts if p.status == "firing" and not any(lo <= p.received < hi for lo, hi in windows)
    ]
    healthy_seconds = max((end - t0) - sum(hi - lo for lo, hi in windows), 0.0)

    def row(p: Page) -> dict[str, Any]:
        return {
            "t": round(p.received - t0, 1),
            "alert": p.name,
            "receiver": p.receiver,
            "labels": _place_of(p),
        }

    looks_back = dict(hindsight or {})

    def after_fault(p: Page) -> bool:
        window = looks_back.get(p.name)
        return window is not None and any(p.received - window <= lo < p.received for lo, _ in windows)

    late = tuple(row(p) for p in healthy if began_in(p) is not None)
    healthy = [p for p in healthy if began_in(p) is None]
    false_pages = tuple(row(p) for p in healthy if _is_pager(p.receiver))
    chat = [p for p in healthy if p.receiver == "chat"]
    false_chat = tuple(row(p) for p in chat if not after_fault(p))
    hindsight_chat = tuple(row(p) for p in chat if after_fault(p))
    result = Score(
        tuple(scored), round(healthy_seconds, 1), false_pages, false_chat, {}, hindsight_chat, late
    )
    return replace(result, summary=_summary(result))


def _summary(result: Score) -> dict[str, Any]:
    faults = result.faults
    n = len(faults)
    detected = [f for f in faults if f.detected]
    times = sorted(f.first_after for f in detected if f.first_after is not None)
    paging = sorted(f.paged_after for f in detected if f.paged_after is not None)
    paged = [f for f in detected if f.first_receiver == "pager"]
    pager_total = sum(f.pager_notifications for f in faults)
    # Precision over alerts (each alert name once per fault): about a fault (expected, or a
    # consequence at its place) against all, the false ones of healthy time included.
    true_notes = sum((1 if f.detected else 0) + len(f.consequences) for f in faults)
    false_notes = (
        len({(p["alert"], p["t"]) for p in result.false_pages})
        + len({(p["alert"], p["t"]) for p in result.false_chat})
        + sum(len(f.wrong_place) + len(f.left_over) for f in faults)
    )
    precision = true_notes / (true_notes + false_notes) if true_notes + false_notes else 0.0
    recall = len(detected) / n if n else 0.0
    hours = result.healthy_seconds / 3600.0
    named = [f for f in detected if f.culprit_named != "unnamed"]
    remedies = list(faults)
    return {
        "faults": n,
        "detected": len(detected),
        "recall": round(recall, 3),
        "precision": round(precision, 3),
        "f1": round(2 * precision * recall / (precision + recall), 3) if precision + recall else 0.0,
        "paged": len(paged),
        "first_notification_median_s": round(statistics.median(times), 1) if times else None,
        "first_notification_p90_s": round(times[max(math.ceil(0.9 * len(times)) - 1, 0)], 1)
        if times
        else None,
        "paged_median_s": round(statistics.median(paging), 1) if paging else None,
        "culprit_right": sum(1 for f in detected if f.culprit_named == "right"),
        "culprit_wrong": sum(1 for f in detected if f.culprit_named == "wrong"),
        "culprit_unnamed": sum(1 for f in detected if f.culprit_named == "unnamed"),
        "culprit_accuracy": round(sum(1 for f in named if f.culprit_named == "right") / len(named), 3)
        if named
        else None,
        "healthy_hours": round(hours, 3),
        "false_pages": len(result.false_pages),
        "false_pages_per_healthy_hour": round(len(result.false_pages) / hours, 2) if hours else None,
        "false_chat": len(result.false_chat),
        "hindsight_chat": len(result.hindsight_chat),
        "late": len(result.late),
        "wrong_place": sum(len(f.wrong_place) for f in faults),
        "left_over": sum(len(f.left_over) for f in faults),
        "pager_notifications": pager_total,
        "notifications_per_fault": round(pager_total / n, 2) if n else None,
        "resolved_mid_fault": sum(f.resolved_mid_fault for f in faults),
        "remedy_right": sum(1 for f in remedies if f.remedy == "right"),
        "remedy_wrong": sum(1 for f in remedies if f.remedy == "wrong"),
        "remedy_missed": sum(1 for f in remedies if f.remedy in ("missed", "partial")),
    }
