"""What the callbacks hand the frameworks' loggers: goodput stays off the training thread."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import babysitter
from babysitter.integrations import _logged
from babysitter.integrations._logged import LoggedValues


def test_goodput_is_computed_by_housekeeping_only_while_logged_and_at_most_every_refresh_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = babysitter.watch(
        run="lv", port=-1, run_dir=tmp_path, tokens_per_step=8, hang_timeout=None, flush_interval=3600
    )
    calls: list[float | None] = []
    real = tracker.goodput

    def counted() -> float | None:
        calls.append(real())
        return calls[-1]

    monkeypatch.setattr(tracker, "goodput", counted)
    try:
        logged = LoggedValues(tracker)
        tracker.step()
        tracker.step()
        tracker.housekeep()
        assert calls == []  # nobody logged yet: no accounting
        values = logged.values()  # the training thread's call
        assert calls == [] and "goodput" not in values
        deadline = time.monotonic() + 5
        while not calls or calls[-1] is None:  # the ledger is read in the background first
            assert time.monotonic() < deadline, calls
            tracker.housekeep()
        assert logged.values()["goodput"] == calls[-1]
        count = len(calls)
        tracker.housekeep()
        assert len(calls) == count  # asked again, but within GOODPUT_REFRESH_SECONDS
        monkeypatch.setattr(_logged, "GOODPUT_REFRESH_SECONDS", 0.0)
        tracker.housekeep()
        assert len(calls) == count + 1
        tracker.housekeep()
        assert len(calls) == count + 1  # no log since: not computed
    finally:
        tracker.close()
