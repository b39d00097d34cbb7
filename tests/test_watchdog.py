"""The hang watchdog on real trackers: detection, stack dumps, ledger events, pauses, options."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import babysitter
from babysitter.catalog import runtime as R
from babysitter.training.tracker import Tracker
from babysitter.training.watchdog import Watchdog
from integ_helpers import sample_value


@pytest.fixture
def tracker(tmp_path: Path) -> Iterator[Tracker]:
    t = babysitter.watch(run="wd", port=-1, run_dir=tmp_path / "run", hang_timeout=None, flush_interval=0.1)
    yield t
    t.close()


def _wait(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def _a_stuck_training_loop(seconds: float) -> None:
    """Stands in for a collective that never returns: the dump must show this frame."""
    time.sleep(seconds)


def test_a_run_that_stops_stepping_is_flagged_with_a_stack_dump(tracker: Tracker, tmp_path: Path) -> None:
    dog = Watchdog(tracker, timeout=0.3, interval=0.05, dump_dir=tmp_path / "dumps").start()
    for _ in range(3):
        tracker.step(tokens=1)
    started = time.monotonic()
    stuck = threading.Thread(target=_a_stuck_training_loop, args=(1.0,), name="stuck-trainer")
    stuck.start()
    assert _wait(lambda: dog.hangs == 1, timeout=5)
    flagged_after = time.monotonic() - started
    assert 0.3 <= flagged_after < 5.0  # not before the timeout; soon after (slack for a loaded machine)
    dump = dog.last_dump
    assert dump is not None and dump.parent == tmp_path / "dumps"
    text = dump.read_text()
    assert "rank: 0" in text and "step: 3" in text
    assert '"stuck-trainer"' in text and "_a_stuck_training_loop" in text  # every thread, named
    assert "faulthandler" in text
    assert sample_value(tracker.registry, R.HANGS.name) == 1
    assert sample_value(tracker.registry, R.HANG_THRESHOLD.name) == 0.3
    assert sample_value(tracker.registry, R.STALLED_SECONDS.name) >= 0.3
    stuck.join()
    # one episode, one hang; a step ends it and a second stall is a second hang
    time.sleep(0.2)
    assert dog.hangs == 1
    tracker.step(tokens=1)
    assert _wait(lambda: dog.hangs == 2, timeout=5)
    tracker.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "babysitter-ledger.jsonl").open()]
    hangs = [r for r in records if r["k"] == "hang"]
    assert [h["step"] for h in hangs] == [3, 4]
    assert all(h["since"] >= 300_000 for h in hangs)  # microseconds


def test_adaptive_threshold_follows_step_time_and_ignores_checkpoints(
    tracker: Tracker, tmp_path: Path
) -> None:
    dog = Watchdog(tracker, factor=4.0, floor=0.01, startup=60.0, interval=0.02, dump_dir=tmp_path)
    assert dog.threshold() == 60.0  # before two steps: the startup allowance
    for _ in range(6):
        time.sleep(0.05)
        tracker.step()
    threshold = dog.threshold()
    assert threshold >= 4 * 0.05  # k x a step time of at least 50 ms
    dog.start()
    with tracker.checkpoint_save(step=6):
        time.sleep(threshold * 2 + 0.2)  # a long save is not a hang
    assert dog.hangs == 0
    assert _wait(lambda: dog.hangs == 1, timeout=threshold + 5)


def test_kill_signal_is_sent_only_when_asked(tracker: Tracker, tmp_path: Path) -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    try:
        dog = Watchdog(
            tracker, timeout=0.1, interval=0.02, dump_dir=tmp_path, kill_signal=signal.SIGUSR1
        ).start()
        tracker.step()
        assert _wait(lambda: bool(got), timeout=5)
        assert got == [signal.SIGUSR1] and dog.hangs == 1
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_unwritable_dump_dir_is_counted_not_raised(tracker: Tracker, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    dog = Watchdog(tracker, timeout=0.05, interval=0.02, dump_dir=blocker / "dumps").start()
    tracker.step()
    assert _wait(lambda: dog.hangs == 1, timeout=5)
    assert dog.last_dump is None
    assert tracker.errors.counts().get("hang_dump") == 1


def test_watch_starts_the_watchdog_by_default_and_checks_options(tmp_path: Path) -> None:
    t = babysitter.watch(run="wd2", port=-1)
    try:
        # auto: the startup allowance (30 min) until steps are known
        assert sample_value(t.registry, R.HANG_THRESHOLD.name) == 1800.0
    finally:
        t.close()
    off = babysitter.watch(run="wd3", port=-1, hang_timeout=None)
    try:
        assert sample_value(off.registry, R.HANGS.name) is None
    finally:
        off.close()
    for bad in (
        {"hang_timeout": -1},
        {"hang_timeout": "soon"},
        {"hang_factor": 0},
        {"hang_kill_signal": 12345},
    ):
        with pytest.raises(ValueError):
            babysitter.watch(run="bad", port=-1, **bad)  # type: ignore[arg-type]
