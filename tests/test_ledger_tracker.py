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
from babysitter.events import NullEvents
from babysitter.ledger import LedgerWriter, summarize


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


def test_a_second_tracker_of_the_same_run_trains_on_without_a_ledger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    first = start(run_dir, tmp_path)
    try:
        with caplog.at_level(logging.ERROR):
            second = start(run_dir, tmp_path)
        try:
            assert isinstance(second._events, NullEvents)
            assert any("refusing a second writer" in r.getMessage() for r in caplog.records)
            second.step()  # training goes on
        finally:
            second.close()
    finally:
        first.close()
