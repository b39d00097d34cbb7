"""A run's goodput summary from its ledger: totals, rolling windows, incarnations, restarts (for the report).

The run's state decides where its wall time ends: ``ended`` (an end record) at that record,
``running`` (a live writer holds the lock) at ``now``, ``down`` (killed, not restarted yet) at ``now``
with the time since its last record counted as downtime.

Each restart gets its cause: the remediation that caused it when ``babysitter remediate`` left a note
(:mod:`babysitter.ledger.remediations`), with the time to detect (alert start to action) and to
recover (action to the new incarnation's first step); otherwise how the previous incarnation ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from babysitter.ledger.accounting import Accountant, Accounting
from babysitter.ledger.advisor import Advice, ClusterRate, advise_timeline
from babysitter.ledger.lock import lock_is_live, read_lock
from babysitter.ledger.reader import DEFAULT_FILE_NAME, read_timeline
from babysitter.ledger.remediations import NOTES_FILE, RemediationNote, match_restarts, read_notes
from babysitter.ledger.slowcause import SlowdownSplit, split_from_ledger
from babysitter.ledger.timeline import Incarnation, Timeline

__all__ = ["WINDOWS", "IncarnationSummary", "RestartSummary", "RunSummary", "State", "summarize"]

State = Literal["empty", "running", "down", "ended"]

#: Rolling windows the summary reports: name -> seconds.
WINDOWS = {"1h": 3600.0, "24h": 86400.0}

US = 1_000_000


@dataclass(frozen=True)
class IncarnationSummary:
    """One incarnation, as a row of the report."""

    index: int
    host: str
    pid: int
    start: float
    end: float
    resumed_from: int | None
    first_step: int | None
    last_step: int | None
    steps: int
    ending: str
    mean_step_seconds: float | None
    #: Its start is not in this file: it continues from a deleted or replaced ledger file.
    continued: bool = False
    #: Times its writer found the ledger file deleted or replaced and went on in a new segment.
    segments: int = 0
    #: What the tracker recorded at start: world size, version, device, FLOPs per token, ...
    info: dict[str, object] = field(default_factory=dict)
    #: The ideal step time of its last judged step, and its steps' time beyond the ideal.
    ideal_step_seconds: float | None = None
    slowdown_seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return dict(self.__dict__)


#: A restart's cause when no remediation note explains it: how the previous incarnation ended.
ENDING_CAUSES = {
    "killed": "process died without an end record",
    "error": "process exited with an error",
    "clean": "process ended cleanly",
}


@dataclass(frozen=True)
class RestartSummary:
    """One restart: the incarnation that began, why, and how long getting there took."""

    index: int
    #: How the previous incarnation ended: ``killed``, ``error`` or ``clean``.
    after: str
    #: Its last sign of life to this one's process start (the restart's share of ``downtime``).
    downtime_seconds: float
    #: ``remediated: drained host n1 after Xid 79, requeued job 12``, or how the previous one ended.
    cause: str
    remediation: RemediationNote | None = None
    #: Alert start to the remediation (None: no remediation, or no alert start).
    time_to_detect_seconds: float | None = None
    #: Remediation to this incarnation's first step (None: no remediation, or no step yet).
    time_to_recover_seconds: float | None = None

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        out = dict(self.__dict__)
        out["remediated"] = self.remediation is not None
        out["remediation"] = None if self.remediation is None else self.remediation.to_json()
        return out


@dataclass
class RunSummary:
    """Everything ``babysitter report`` shows."""

    run: str
    ledger: str
    state: State
    totals: Accounting
    windows: dict[str, Accounting]
    incarnations: list[IncarnationSummary]
    timeline: Timeline
    accountant: Accountant
    torn_lines: int = 0
    invalid_lines: int = 0
    #: Lines of a writer that another writer had taken the lock over from (dropped).
    fenced_lines: int = 0
    #: The file does not go back to the run's first start (it was deleted or replaced mid-run).
    partial: bool = False
    checkpoints_ok: int = 0
    checkpoints_failed: int = 0
    last_checkpoint_step: int | None = None
    #: Productive step time no completed checkpoint covers yet: lost if the run crashed now.
    at_risk_seconds: float = 0.0
    restart_list: list[RestartSummary] = field(default_factory=list)
    #: Every remediation note of the run, oldest first, with the restart it caused (None: none yet).
    remediations: list[tuple[RemediationNote, int | None]] = field(default_factory=list)
    #: Note lines skipped, by reason, and why the notes file could not be read (None: it could).
    notes_skipped: dict[str, int] = field(default_factory=dict)
    notes_error: str | None = None
    #: How often to checkpoint, from this ledger (docs/checkpoint-interval.md).
    advice: Advice | None = None
    #: The slowdown split by cause (the ledger's evidence; ``report --prometheus`` refines it).
    slowdown: SlowdownSplit | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The ``--json`` summary (seconds as floats, goodput 0..1)."""
        t = self.totals
        return {
            "run": self.run,
            "ledger": self.ledger,
            "state": self.state,
            "start_time": t.start_us / US,
            "horizon_time": t.horizon_us / US,
            "wall_seconds": t.wall_seconds,
            "productive_seconds": t.productive_seconds,
            "goodput": t.goodput,
            "badput_seconds": t.badput_seconds,
            "restarts": t.restarts,
            "incarnations": t.incarnations,
            "at_risk_seconds": self.at_risk_seconds,
            "windows": {
                name: {
                    "wall_seconds": w.wall_seconds,
                    "productive_seconds": w.productive_seconds,
                    "goodput": w.goodput,
                    "badput_seconds": w.badput_seconds,
                }
                for name, w in self.windows.items()
            },
            "checkpoints": {
                "saved": self.checkpoints_ok,
                "failed": self.checkpoints_failed,
                "last_step": self.last_checkpoint_step,
            },
            "skipped_lines": {
                "torn": self.torn_lines,
                "invalid": self.invalid_lines,
                "fenced": self.fenced_lines,
            },
            "partial": self.partial,
            "incarnation_list": [inc.to_json() for inc in self.incarnations],
            "restart_list": [r.to_json() for r in self.restart_list],
            "remediations": [{**note.to_json(), "restart": k} for note, k in self.remediations],
            "remediation_notes": {"skipped": dict(self.notes_skipped), "error": self.notes_error},
            "checkpoint_advice": None if self.advice is None else self.advice.to_json(),
            "slowdown": None if self.slowdown is None else self.slowdown.to_json(),
        }


def _ending(inc: Incarnation, last: bool, state: State) -> str:
    if inc.end is not None:
        return "clean" if inc.end.clean else "error"
    if last and state == "running":
        return "running"
    return "killed"


def _incarnation(
    inc: Incarnation, stop: int, last: bool, state: State, accountant: Accountant
) -> IncarnationSummary:
    n = inc.n
    mean = None
    if inc.continued and n >= 1:
        mean = (inc.ends[-1] - inc.begin) / inc.step_count / US
    elif n >= 2:
        mean = (inc.ends[-1] - inc.ends[0]) / (inc.step_count - 1) / US
    return IncarnationSummary(
        index=inc.index,
        host=inc.start.host,
        pid=inc.start.pid,
        start=inc.begin / US,
        end=stop / US,
        resumed_from=inc.resume_step(),
        first_step=inc.steps[0] if n else None,
        last_step=inc.steps[-1] if n else None,
        steps=inc.step_count,
        ending=_ending(inc, last, state),
        mean_step_seconds=mean,
        continued=inc.continued,
        segments=inc.segments,
        info=dict(inc.start.info),
        ideal_step_seconds=accountant.slow.incarnation_ideal_seconds(inc.index),
        slowdown_seconds=accountant.slow.incarnation_seconds(inc.index),
    )


def _restarts(
    incs: list[Incarnation], rows: list[IncarnationSummary], notes: list[RemediationNote]
) -> tuple[list[RestartSummary], list[tuple[RemediationNote, int | None]]]:
    """Each restart with its cause, and each note with the restart it caused."""
    caused = match_restarts(notes, [(inc.begin / US, inc.last_t / US) for inc in incs])
    out = []
    for k in range(1, len(incs)):
        prev, inc = incs[k - 1], incs[k]
        stop = max(prev.begin, min(prev.last_t, inc.begin))
        after = rows[k - 1].ending
        note = caused.get(k)
        detect = recover = None
        if note is not None:
            detect = note.time_to_detect
            recover = inc.ends[0] / US - note.t if inc.n else None
        out.append(
            RestartSummary(
                index=inc.index,
                after=after,
                downtime_seconds=max(0, inc.begin - stop) / US,
                cause=note.cause if note is not None else ENDING_CAUSES.get(after, after),
                remediation=note,
                time_to_detect_seconds=detect,
                time_to_recover_seconds=recover,
            )
        )
    which = {id(note): k for k, note in caused.items()}
    return out, [(note, which.get(id(note))) for note in notes]


def summarize(
    run_dir: Path,
    *,
    file_name: str = DEFAULT_FILE_NAME,
    now: float | None = None,
    stale_after: float = 60.0,
    keep_points: bool = True,
    notes_file: str = NOTES_FILE,
    gpus: int | None = None,
    cluster: ClusterRate | None = None,
) -> RunSummary:
    """Read the run's ledger and account for it (``keep_points``: keep per-line step time and MFU for
    plots), with the remediation notes next to it and the checkpoint advice (``gpus``, ``cluster``:
    see :func:`~babysitter.ledger.advisor.advise_timeline`). Raises OSError when the ledger cannot be
    read (never because of the notes)."""
    path = Path(run_dir) / file_name
    timeline, ledger = read_timeline(path, keep_points=keep_points)
    now = time.time() if now is None else now
    incs = timeline.incarnations
    state: State
    if not incs:
        state = "empty"
    elif incs[-1].end is not None:
        state = "ended"
    else:
        lock = read_lock(path.with_name(path.name + ".lock"))
        state = "running" if lock is not None and lock_is_live(lock, stale_after=stale_after) else "down"
    accountant = Accountant(timeline)
    live = state == "running"
    totals = accountant.totals(now=None if state == "ended" else now, live=live, tail="other")
    held = accountant.totals(now=None if state == "ended" else now, live=live, tail="other", hold=True)
    at_risk = (totals.productive_us - held.productive_us) / US
    horizon = totals.horizon_us / US
    windows = {
        name: accountant.window(horizon - seconds, horizon, now=None if state == "ended" else now, live=live)
        for name, seconds in WINDOWS.items()
    }
    rows = []
    for i, inc in enumerate(incs):
        stop = min(inc.last_t, incs[i + 1].begin) if i + 1 < len(incs) else max(inc.last_t, totals.horizon_us)
        if i + 1 == len(incs) and state != "running":
            stop = inc.last_t
        rows.append(_incarnation(inc, stop, i + 1 == len(incs), state, accountant))
    saves = [c for inc in incs for c in inc.checkpoints if c.op == "save"]
    ok = [c for c in saves if c.ok]
    run = incs[0].start.run if incs else Path(run_dir).name
    notes = read_notes(Path(run_dir), run=run if incs else None, file_name=notes_file)
    restarts, remediations = _restarts(incs, rows, notes.notes)
    return RunSummary(
        run=run,
        ledger=str(path),
        state=state,
        totals=totals,
        windows=windows,
        incarnations=rows,
        timeline=timeline,
        accountant=accountant,
        # A live writer may be mid-append: its unterminated last line is in flight, not torn.
        torn_lines=max(0, ledger.torn_lines - (state == "running" and not ledger.ends_with_newline)),
        invalid_lines=ledger.invalid_lines,
        fenced_lines=ledger.fenced_lines,
        partial=bool(incs) and incs[0].start.segment > 0,
        checkpoints_ok=len(ok),
        checkpoints_failed=sum(1 for c in saves if c.ok is False),
        last_checkpoint_step=ok[-1].step if ok else None,
        at_risk_seconds=at_risk,
        restart_list=restarts,
        remediations=remediations,
        notes_skipped=notes.skipped,
        notes_error=notes.error,
        advice=advise_timeline(timeline, totals, gpus=gpus, cluster=cluster) if incs else None,
        slowdown=split_from_ledger(accountant.slow, timeline) if incs else None,
    )
