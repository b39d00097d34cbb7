"""The ledger behind the real tracker: goodput on the tracker's own scrape, continued across a restart,
and a second tracker of the same run refused without breaking training."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import babysitter
from babysitter.catalog import goodput as G
from babysitter.ledger import LedgerWriter, summarize
from test_ledger_writer import wait_for


def scrape(tracker: babysitter.Tracker) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(tracker.registry).decode()):
        for s in family.samples:
            out[(s.name, s.labels.get("cause", ""))] = s.value
    return out


def start(run_dir: Path, tmp_path: Path) -> babysitter.Tracker:
    return babysitter.watch(
        run_dir=run_dir,
        run="tracked",
        port=-1,
        registry_dir=tmp_path / "registry",
        tokens_per_step=100,
        flops_per_token=6.0,
        peak_flops=1e12,
        flush_interval=0.02,
    )


def wait_loaded(tracker: babysitter.Tracker) -> None:
    events = tracker._events
    assert isinstance(events, LedgerWriter)
    assert events.wait_loaded(10)


def test_goodput_is_on_the_tracker_scrape_and_continues_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BABYSITTER_LEDGER_FLUSH_SECONDS", "0.02")
    run_dir = tmp_path / "run"
    first = start(run_dir, tmp_path)
    try:
        wait_loaded(first)
        for _ in range(10):
            time.sleep(0.01)
            first.step()
        with first.checkpoint_save(step=10, path=str(run_dir / "ck10")) as handle:
            time.sleep(0.02)
            handle.nbytes = 1
        for _ in range(5):
            time.sleep(0.01)
            first.step()
        time.sleep(0.1)
        got = scrape(first)
        assert got[(G.RESTARTS.name, "")] == 0
        assert got[(G.PRODUCTIVE_SECONDS.name, "")] > 0
        assert got[(G.BADPUT_SECONDS.name, "checkpoint_save")] >= 0.02
        assert 0 < got[(G.GOODPUT.name, "")] < 1
        assert (G.LEDGER_PENDING_BYTES.name, "") in got  # the ledger's own health is on the scrape
        productive_before = got[(G.PRODUCTIVE_SECONDS.name, "")]
    finally:
        first.close(clean=False)  # as if training had raised: steps 11..15 are not covered

    second = start(run_dir, tmp_path)
    try:
        wait_loaded(second)
        with second.checkpoint_load(step=10):
            time.sleep(0.01)
        for _ in range(5):
            time.sleep(0.01)
            second.step()
        time.sleep(0.1)
        got = scrape(second)
        assert got[(G.RESTARTS.name, "")] == 1
        assert got[(G.BADPUT_SECONDS.name, "lost_progress")] > 0.03  # steps 11..15 of the first
        assert got[(G.BADPUT_SECONDS.name, "checkpoint_load")] >= 0.01
        assert got[(G.PRODUCTIVE_SECONDS.name, "")] >= productive_before  # never taken back
    finally:
        second.close()
    summary = summarize(run_dir)
    assert summary.state == "ended"
    assert [i.ending for i in summary.incarnations] == ["error", "clean"]
    assert summary.incarnations[1].resumed_from == 10


def test_a_second_tracker_of_the_same_run_trains_on_and_its_ledger_waits_for_the_lock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The second process keeps its records and says so; it writes once the first one is gone (the
    same path a restart takes when the previous host's lock is not stale yet)."""
    run_dir = tmp_path / "run"
    first = start(run_dir, tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            second = start(run_dir, tmp_path)
        assert isinstance(second._events, LedgerWriter)
        assert any(
            "writes no ledger until that lock is provably stale" in r.getMessage() for r in caplog.records
        )
        second.step()  # training goes on
        assert scrape(second).get((G.LEDGER_WRITER_STATE.name, "")) is not None
        assert second._events.state == "waiting"
    finally:
        first.close()
    try:
        wait_for(lambda: second._events.state == "writing")  # type: ignore[attr-defined]
        second.step()
    finally:
        second.close()
    summary = summarize(run_dir)
    assert [inc.steps for inc in summary.incarnations] == [0, 2]


def test_more_steps_between_two_folds_than_the_ring_holds_keep_the_ledger_count_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 12.11: above ~65k steps per fold the ring overruns; the ledger must still count every step
    (the boundaries it lost are folded into the first one it kept, with their time)."""
    monkeypatch.setenv("BABYSITTER_LEDGER_FLUSH_SECONDS", "600")
    run_dir = tmp_path / "run"
    tracker = babysitter.watch(
        run_dir=run_dir, run="fast", port=-1, registry_dir=tmp_path / "reg", flush_interval=600.0
    )
    try:
        for _ in range(70_000):
            tracker.step()
        tracker.fold()
        for _ in range(10):
            tracker.step()
    finally:
        tracker.close()
    assert tracker.errors.counts()["ring_overrun"] == 1
    summary = summarize(run_dir)
    inc = summary.incarnations[0]
    # The first boundary kept stands for the 4,464 before it (their numbers are gone, not their count).
    assert (inc.first_step, inc.last_step, inc.steps) == (70_000 - 65_536 + 1, 70_010, 70_010)
    acc = summary.totals
    assert acc.productive_us + sum(acc.badput_us.values()) == acc.wall_us
