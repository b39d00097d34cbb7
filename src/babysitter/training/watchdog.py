"""Hang detection inside the training process: no step for far longer than steps take.

A dedicated daemon thread (not the tracker's housekeeping thread: a hang on stuck storage can hold
that one too) wakes about once a second and compares the tracker's step age with a threshold:
a fixed ``timeout``, or adaptively ``factor`` x the median of recent step times, never below
``floor`` (and ``startup`` before two steps have finished, when compilation and NCCL setup run).
Checkpoints and marked phases do not count: the tracker reports no step age while one is under way.

On a hang (once per episode) it counts ``train_hangs_total``, writes a ``hang`` ledger event through
:meth:`Tracker.record_hang`, dumps every Python thread's stack to a file and logs one line. It never
touches the training thread and never stops the run unless ``kill_signal`` is given.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from babysitter.catalog import runtime as R
from babysitter.training.ticker import TrackerThread
from babysitter.training.tracker import Tracker

__all__ = ["Watchdog", "default_dump_dir", "validate_options"]

log = logging.getLogger("babysitter")

_RECENT_STEPS = 100


def validate_options(
    *,
    timeout: float | None = None,
    factor: float = 10.0,
    floor: float = 300.0,
    startup: float = 1800.0,
    interval: float = 1.0,
    kill_signal: int | None = None,
) -> None:
    """ValueError for a bad watchdog option (``watch()`` calls this before training starts)."""
    for name, value in (("factor", factor), ("floor", floor), ("startup", startup), ("interval", interval)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"watchdog {name} must be a positive number, got {value!r}")
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0
    ):
        raise ValueError(f"hang timeout must be a positive number of seconds or None, got {timeout!r}")
    if kill_signal is not None:
        signal.Signals(kill_signal)  # ValueError for an unknown signal, at setup


def default_dump_dir(tracker: Tracker) -> Path:
    """The run directory when there is one (shared storage, next to the ledger), else a temp dir."""
    run_dir = tracker.config.run_dir
    if run_dir is not None:
        return Path(run_dir) / "hangs"
    return Path(tempfile.gettempdir()) / "babysitter-hangs"


class Watchdog(TrackerThread):
    """Watches one tracker for hangs; start it with :meth:`start` (``watch(hang_timeout=...)`` does).

    Args:
        tracker: the tracker to watch.
        timeout: fixed hang threshold in seconds; None for the adaptive default.
        factor: adaptive threshold = ``factor`` x median of the last 100 step times ...
        floor: ... but never below ``floor`` seconds.
        startup: threshold before two steps have finished (first step: imports, compile, NCCL).
        dump_dir: where stack dumps go (default :func:`default_dump_dir`).
        kill_signal: a signal to send this process after the dump (e.g. ``signal.SIGABRT`` so that
            torchrun restarts the job); None (the default) only records.
        interval: seconds between checks.
        report: more text for the dump (the flight recorder's view of this rank's collectives:
            which one it waits in, the last it completed), never raising.
    """

    def __init__(
        self,
        tracker: Tracker,
        *,
        timeout: float | None = None,
        factor: float = 10.0,
        floor: float = 300.0,
        startup: float = 1800.0,
        dump_dir: str | os.PathLike[str] | None = None,
        kill_signal: int | None = None,
        interval: float = 1.0,
        report: Callable[[], str] | None = None,
    ) -> None:
        validate_options(
            timeout=timeout,
            factor=factor,
            floor=floor,
            startup=startup,
            interval=interval,
            kill_signal=kill_signal,
        )
        super().__init__(tracker, interval, "babysitter-watchdog")
        self.timeout = float(timeout) if timeout is not None else None
        self.factor = float(factor)
        self.floor = float(floor)
        self.startup = float(startup)
        self.dump_dir = Path(dump_dir) if dump_dir is not None else default_dump_dir(tracker)
        self.kill_signal = kill_signal
        self.report = report
        self.hangs = 0
        self.last_dump: Path | None = None
        self._in_hang = False
        self._threshold = self.timeout if self.timeout is not None else self.startup
        self._stalled = 0.0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Watchdog:
        """Start the watchdog thread and export its metrics through the tracker; returns self."""
        self.tracker.add_metrics_source(self.metrics)
        return super().start()

    def tick(self) -> object:
        return self.check()

    # ------------------------------------------------------------------ detection

    def threshold(self) -> float:
        """The current hang threshold in seconds."""
        if self.timeout is not None:
            return self.timeout
        recent = self.tracker.recent_step_seconds(_RECENT_STEPS)
        if len(recent) < 2:
            return max(self.floor, self.startup)
        return max(self.floor, self.factor * statistics.median(recent))

    def check(self) -> bool:
        """One check (the thread calls it every ``interval``); True if a new hang was declared."""
        try:
            return self._check()
        except Exception as exc:
            self.tracker.errors.record("watchdog", exc)
            return False

    def _check(self) -> bool:
        threshold = self.threshold()
        self._threshold = threshold
        age = self.tracker.seconds_since_last_step()
        if self.tracker.closed:
            age = None
        self._stalled = age if age is not None else 0.0
        if age is None or age < threshold:
            self._in_hang = False
            return False
        if self._in_hang:
            return False
        self._in_hang = True
        path = self._dump(age, threshold)
        self.tracker.record_hang(age)
        self.hangs += 1  # last: whoever sees the count sees the dump and the ledger event too
        cfg = self.tracker.config
        log.warning(
            "babysitter: run %r rank %d: no step for %.0f s (hang threshold %.0f s) at step %d; "
            "thread stacks in %s",
            cfg.run,
            cfg.rank.rank,
            age,
            threshold,
            self.tracker.global_step,
            path if path is not None else "(dump failed, see babysitter_internal_errors_total)",
        )
        if self.kill_signal is not None:
            log.error(
                "babysitter: sending %s to this process as configured", signal.Signals(self.kill_signal).name
            )
            os.kill(os.getpid(), self.kill_signal)
        return True

    # ------------------------------------------------------------------ stack dumps

    def _dump(self, age: float, threshold: float) -> Path | None:
        cfg = self.tracker.config
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"hang-{_safe(cfg.run)}-rank{cfg.rank.rank}-pid{os.getpid()}-{stamp}-{self.hangs + 1}.txt"
        try:
            self.dump_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            path = self.dump_dir / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(
                    f"babysitter hang report\nrun: {cfg.run}\nrank: {cfg.rank.rank}\npid: {os.getpid()}\n"
                    f"step: {self.tracker.global_step}\nseconds since last step: {age:.1f}\n"
                    f"threshold seconds: {threshold:.1f}\ntime: {stamp}\n\n"
                )
                out.write(self._report())
                out.write(format_stacks(sys._current_frames().items(), threading.enumerate()))
                out.write("\n--- faulthandler (all threads, C-level view) ---\n")
                out.flush()
                faulthandler.dump_traceback(file=out, all_threads=True)
        except Exception as exc:
            self.tracker.errors.record("hang_dump", exc)
            return None
        self.last_dump = path
        return path

    def _report(self) -> str:
        if self.report is None:
            return ""
        try:
            return self.report() + "\n"
        except Exception as exc:
            self.tracker.errors.record("hang_report", exc)
            return ""

    # ------------------------------------------------------------------ metrics

    def metrics(self, label_names: list[str], label_values: list[str]) -> list[Any]:
        """Metric families for the tracker's scrape (a tracker metrics source)."""
        hangs = R.HANGS.family(label_names)
        hangs.add_metric(label_values, float(self.hangs))  # type: ignore[attr-defined]
        stalled = R.STALLED_SECONDS.family(label_names)
        stalled.add_metric(label_values, self._stalled)  # type: ignore[attr-defined]
        if self.tracker.config.rank.rank != 0:  # the threshold is the run's view (catalog: ranks)
            return [hangs, stalled]
        threshold = R.HANG_THRESHOLD.family(label_names)
        threshold.add_metric(label_values, self._threshold)  # type: ignore[attr-defined]
        return [hangs, threshold, stalled]


def format_stacks(frames: Iterable[tuple[int, Any]], threads: Iterable[threading.Thread]) -> str:
    """Every thread's Python stack, named, innermost call last (like a traceback)."""
    names = {t.ident: (t.name, t.daemon) for t in threads}
    parts: list[str] = []
    for ident, frame in frames:
        name, daemon = names.get(ident, ("<unknown>", False))
        parts.append(f'Thread {ident} "{name}"{" (daemon)" if daemon else ""}:\n')
        parts.extend(traceback.format_stack(frame))
        parts.append("\n")
    return "".join(parts)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:64] or "run"
