"""The few numbers a framework's own loggers get (W&B, TensorBoard, MLflow, CSV, ``report_to``).

Values come from the tracker's snapshot (what a scrape reads: no device sync) at the framework's
logging cadence, so a run's MFU and goodput show up next to its loss where the team already looks.
Goodput runs the ledger's accounting, whose cost grows with the steps younger than its settle time
(16-29 ms with 15,000 of them, ``benchmarks/results/logged.md``), so the training thread never
computes it: the housekeeping thread refreshes it, at most every
:data:`GOODPUT_REFRESH_SECONDS` and only while someone logs, and the training thread reads the last
value.
"""

from __future__ import annotations

import time
from typing import Final

from babysitter.training.tracker import Tracker

__all__ = ["GOODPUT_REFRESH_SECONDS", "LOGGED_KEYS", "LoggedValues"]

#: Seconds between two goodput computations for the loggers (a scrape computes its own).
GOODPUT_REFRESH_SECONDS = 10.0

#: What is logged, under these keys (a framework may add a prefix):
#: ``tokens_per_second``: the job's tokens per second over the tracker's MFU window (this rank's rate
#: times the world size, as Lightning's ThroughputMonitor counts its global rate: ranks keep pace);
#: ``mfu`` / ``hfu``: as ``train_mfu_ratio`` / ``train_hfu_ratio``; ``data_wait_fraction``: the share
#: of wall time since the previous log spent waiting for batches; ``goodput``: as
#: ``train_goodput_ratio`` (rank 0 with a ``run_dir`` only).
LOGGED_KEYS: Final = ("tokens_per_second", "mfu", "hfu", "data_wait_fraction", "goodput")


class LoggedValues:
    """Turns tracker snapshots into a ``{key: float}`` dict, one call per framework log event."""

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        self._goodput: float | None = None
        self._wanted = False  # a log asked for values since the last refresh
        self._refreshed: float | None = None  # monotonic time of the last refresh
        self._last_time = tracker.start_time
        self._last_wait = 0.0
        tracker.add_housekeeping_hook(self._refresh)

    def _refresh(self, tracker: Tracker) -> None:
        """Housekeeping hook (off the training thread)."""
        now = time.monotonic()
        if not self._wanted or (
            self._refreshed is not None and now - self._refreshed < GOODPUT_REFRESH_SECONDS
        ):
            return
        goodput = tracker.goodput()
        if goodput is not None:  # None: no ledger, or not read yet; ask again at the next pass
            self._wanted = False
            self._refreshed = now
            self._goodput = goodput

    def values(self) -> dict[str, float]:
        """The values now; a key whose value is unknown (no FLOPs, no ledger, goodput not computed
        yet: it follows the first log by up to a housekeeping interval) is left out."""
        tracker = self._tracker
        snap = tracker.snapshot()
        out: dict[str, float] = {}
        if snap.tokens_per_second is not None:
            out["tokens_per_second"] = snap.tokens_per_second * tracker.config.rank.world_size
        if snap.mfu is not None:
            out["mfu"] = snap.mfu
        if snap.hfu is not None:
            out["hfu"] = snap.hfu
        elapsed = snap.time - self._last_time
        if elapsed > 0:
            waited = snap.data_wait_seconds - self._last_wait
            out["data_wait_fraction"] = min(1.0, max(0.0, waited / elapsed))
            self._last_time, self._last_wait = snap.time, snap.data_wait_seconds
        self._wanted = True
        if self._goodput is not None:
            out["goodput"] = self._goodput
        return out
