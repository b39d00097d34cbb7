"""The tracker follows the training loop's step numbers (issue 22): a restart that forgets
``checkpoint_load`` still books the right resume step, restart and lost progress, because the first
far-off step number the loop gives (a ``checkpoint_save(step=)`` or ``step(step=)``) is adopted,
renumbering what the tracker had counted itself, in the ledger too; and it says so once.

Real tracker, real ledger writer, in-process (two trackers one after the other stand for two
incarnations; the first closes unclean, as a crash would leave its steps after the checkpoint)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import babysitter
from babysitter.ledger import read_ledger, summarize
from babysitter.ledger.accounting import Accountant
from babysitter.ledger.records import Renumber, decode, encode
from babysitter.ledger.timeline import Timeline

STEP = 0.004


def _watch(run_dir: Path) -> babysitter.Tracker:
    return babysitter.watch(
        run_dir=run_dir,
        run="adopt",
        port=-1,
        registry_dir=run_dir.parent / "registry",
        tokens_per_step=100,
        flops_per_token=6.0,
        peak_flops=1e12,
    )


def _first_incarnation(run_dir: Path, *, until: int, save_every: int) -> tuple[float, float]:
    """Steps 1..until with saves every ``save_every``; returns the wall times just before the last
    save's block ended and just after it had (the ledger's save end lies between them: it is written,
    and synced, as the block exits, which a loaded machine can stretch to tens of ms)."""
    tracker = _watch(run_dir)
    saving, saved_at = 0.0, 0.0
    try:
        for step in range(1, until + 1):
            time.sleep(STEP)
            tracker.step()
            if step % save_every == 0:
                with tracker.checkpoint_save(step=step):
                    saving = time.time()
                saved_at = time.time()
    finally:
        tracker.close(clean=False)  # as if training had raised after step `until`
    return saving, saved_at


def test_a_restart_without_checkpoint_load_is_booked_from_the_loops_step_numbers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: killed at 248 with the last checkpoint at 200, restarted from it without
    ``checkpoint_load``. Before, the second incarnation counted 1, 2..., the report said resumed 0 and
    booked all 248 steps of the first as lost progress."""
    run_dir = tmp_path / "run"
    saving, saved_at = _first_incarnation(run_dir, until=248, save_every=100)
    ended = read_ledger(run_dir / "babysitter-ledger.jsonl")
    assert ended.records
    second = _watch(run_dir)
    caplog.set_level(logging.WARNING, logger="babysitter")
    try:
        for step in range(201, 321):
            time.sleep(STEP)
            second.step()  # the README's loop before issue 22: no step=, no checkpoint_load
            if step % 50 == 0:
                with second.checkpoint_save(step=step):
                    pass
        assert second.global_step == 320
    finally:
        second.close()
    adopted = [r for r in caplog.records if "adopting the training loop's step numbers" in r.getMessage()]
    assert len(adopted) == 1, [r.getMessage() for r in caplog.records]
    assert "checkpoint_save(step=250)" in adopted[0].getMessage() and "(+200)" in adopted[0].getMessage()

    summary = summarize(run_dir)
    first, again = summary.incarnations
    assert (first.first_step, first.last_step) == (1, 248)
    assert (again.resumed_from, again.first_step, again.last_step) == (200, 201, 320)
    assert summary.totals.restarts == 1
    # Lost: steps 201..248 of the first incarnation (48 steps and the save-free stretch after step 200,
    # by this test's clock), not all 248 of them.
    # A lost step that was also slow (a loaded machine stretches these 4 ms steps) books its excess as
    # slowdown and its ideal time as lost progress (docs/goodput.md): the two together are the stretch.
    lost = summary.totals.badput_seconds["lost_progress"]
    slow = summary.accountant.window(saving, first.end).badput_seconds.get("slowdown", 0.0)
    assert lost <= first.end - saving + 0.01, (lost, saving, saved_at)
    assert first.end - saved_at - 0.01 <= lost + slow <= first.end - saving + 0.01, (
        lost,
        slow,
        saving,
        saved_at,
    )
    assert lost < 0.5 * (first.end - first.start)
    # The identity still holds exactly.
    acc = summary.totals
    assert acc.productive_us + sum(acc.badput_us.values()) == acc.wall_us


def test_a_far_step_number_passed_to_step_renumbers_what_the_tracker_counted(tmp_path: Path) -> None:
    """The loop starts passing ``step=`` after some self-counted steps of a restart: those steps take
    the loop's numbering too (off-by-one differences are left alone)."""
    run_dir = tmp_path / "run"
    _first_incarnation(run_dir, until=30, save_every=20)
    second = _watch(run_dir)
    try:
        for _ in range(5):
            time.sleep(STEP)
            second.step()  # counted 1..5 by the tracker: really 21..25
        for step in range(26, 41):
            time.sleep(STEP)
            second.step(step=step)
        assert second.global_step == 40
    finally:
        second.close()
    again = summarize(run_dir).incarnations[1]
    assert (again.resumed_from, again.first_step, again.last_step) == (20, 21, 40)


def test_numbers_that_agree_or_a_checkpoint_load_are_not_adopted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A save within one step of the counter (0- or 1-based loops) marks the numbering as the loop's;
    after ``checkpoint_load`` the counter is the loop's; a save numbered far from the counter after
    that (an epoch number, a micro-batch count) is recorded as given, with one warning per tracker,
    never adopted."""
    caplog.set_level(logging.WARNING, logger="babysitter")
    run_dir = tmp_path / "run"
    tracker = _watch(run_dir)
    try:
        for _ in range(10):
            tracker.step()
        with tracker.checkpoint_save(step=9):  # a 0-based loop index
            pass
        for _ in range(10):
            tracker.step()
        with tracker.checkpoint_save(step=120):  # far, but the numbering is already the loop's
            pass
        assert tracker.global_step == 20
    finally:
        tracker.close()
    loaded = _watch(tmp_path / "loaded")
    try:
        with loaded.checkpoint_load() as handle:
            handle.step = 500  # learnt from the checkpoint inside the block
        loaded.step()
        with loaded.checkpoint_save(step=900):
            pass
        assert loaded.global_step == 501
        for _ in range(3):
            loaded.step()
        with loaded.checkpoint_save(step=7):  # below the counter: not adopted, not said twice
            pass
        assert loaded.global_step == 504
    finally:
        loaded.close()
    said = [r.getMessage() for r in caplog.records]
    assert not any("adopting" in m for m in said), said
    mismatches = [m for m in said if "while the tracker's step is" in m]
    assert len(mismatches) == 2, said
    assert "checkpoint_save(step=120) while the tracker's step is 20" in mismatches[0]
    assert "checkpoint_save(step=900) while the tracker's step is 501" in mismatches[1]
    summary = summarize(tmp_path / "loaded")
    assert summary.incarnations[0].resumed_from == 500
    assert summary.incarnations[0].first_step == 501


def test_renumber_records_round_trip_and_the_live_accounting_follows_them() -> None:
    """The ``renum`` line: encoded and read back; applied to a timeline whose accountant already
    classified (and cached) the renumbered steps, the totals equal a fresh accountant's."""
    line = encode(Renumber(t=1_000_000, by=200), fence="abcd")
    import json

    assert decode(json.loads(line)) == Renumber(t=1_000_000, by=200)

    from babysitter.ledger.records import CheckpointBegin, CheckpointEnd, End, Progress, Start

    def start(i: int, t: int) -> Start:
        return Start(t=t, pst=t, id=f"{i:04d}" * 4, host="h", pid=1, run="r")

    def steps(first: int, n: int, t0: int) -> Progress:
        ends = tuple(t0 + k * 100_000 for k in range(n))
        return Progress(
            t=ends[-1],
            steps=tuple(range(first, first + n)),
            ends=ends,
            data_wait=0,
            model_flops=0.0,
            peak_flops=None,
        )

    timeline = Timeline(keep_points=False)
    timeline.extend(
        [
            start(1, 0),
            steps(1, 50, 1_000_000),
            CheckpointBegin(t=3_000_000, op="save", step=20, path=None),
            CheckpointEnd(t=3_000_001, op="save", step=20, ok=True, nbytes=None, path=None),
            End(t=7_000_000, clean=False),
            start(2, 8_000_000),
            steps(1, 30, 9_000_000),  # counted from 1 by a tracker that was not told the resume step
        ]
    )
    live = Accountant(timeline, settle_seconds=0.5)
    before = live.totals(now=20.0, live=True)
    assert timeline.incarnations[1].resume_step() == 0
    timeline.add(Renumber(t=13_000_000, by=20))
    after = live.totals(now=20.0, live=True)
    fresh = Accountant(timeline, settle_seconds=0.5).totals(now=20.0, live=True)
    assert after == fresh
    assert timeline.incarnations[1].resume_step() == 20
    assert after.badput_us["lost_progress"] < before.badput_us["lost_progress"]
