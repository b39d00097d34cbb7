"""A run's goodput summary from its ledger: totals, rolling windows, incarnations (for the report).

The run's state decides where its wall time ends: ``ended`` (an end record) at that record,
``running`` (a live writer holds the lock) at ``now``, ``down`` (killed, not restarted yet) at ``now``
with the time since its last record counted as downtime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from babysitter.ledger.accounting import Accountant, Accounting
from babysitter.ledger.lock import lock_is_live, read_lock
from babysitter.ledger.reader import DEFAULT_FILE_NAME, read_timeline
from babysitter.ledger.timeline import Incarnation, Timeline

__all__ = ["WINDOWS", "IncarnationSummary", "RunSummary", "State", "summarize"]

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

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return dict(self.__dict__)


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
        }


def _ending(inc: Incarnation, last: bool, state: State) -> str:
    if inc.end is not None:
        return "clean" if inc.end.clean else "error"
    if last and state == "running":
        return "running"
    return "killed"


def _incarnation(inc: Incarnation, stop: int, last: bool, state: State) -> IncarnationSummary:
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
    )


def summarize(
    run_dir: Path,
    *,
    file_name: str = DEFAULT_FILE_NAME,
    now: float | None = None,
    stale_after: float = 60.0,
    keep_points: bool = True,
) -> RunSummary:
    """Read the run's ledger and account for it (``keep_points``: keep per-line step time and MFU for
    plots). Raises OSError when the ledger cannot be read."""
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
        rows.append(_incarnation(inc, stop, i + 1 == len(incs), state))
    saves = [c for inc in incs for c in inc.checkpoints if c.op == "save"]
    ok = [c for c in saves if c.ok]
    run = incs[0].start.run if incs else Path(run_dir).name
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
    )
