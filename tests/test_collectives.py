"""The collectives monitor: what a rank says about its collectives, when, and that it never raises.

A one-rank gloo group makes torch.distributed real; the dumps are torch's own or, for the states a
single rank cannot reach (waiting in a collective for a peer), JSON in torch's format."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import babysitter
from babysitter.catalog import runtime as R
from babysitter.training import flight
from babysitter.training.collectives import MAX_GROUPS, CollectiveMonitor
from babysitter.training.flight import Recorder
from babysitter.training.tracker import Tracker
from node_helpers import wait_for


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    t = babysitter.watch(run="coll", port=-1, hang_timeout=None, flight_recorder=False, flush_interval=60)
    yield t
    t.close()


def _samples(monitor: CollectiveMonitor, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (
            dict(zip(["run", "rank", *s.labels], ["coll", "0", *s.labels.values()], strict=False)) | s.labels,
            s.value,
        )
        for family in monitor.metrics(["run", "rank"], ["coll", "0"])
        for s in family.samples
        if s.name == name
    ]


def _dump(groups: dict[str, tuple[int, int]], entries: list[tuple[str, str, int, str]]) -> bytes:
    """A dump in torch's format: group counters by pg_id, entries (pg_id, pg name, seq, op)."""
    return json.dumps(
        {
            "pg_status": {
                pg: {"last_enqueued_collective": str(e), "last_completed_collective": str(c)}
                for pg, (e, c) in groups.items()
            },
            "entries": [
                {
                    "pg_id": int(pg_id),
                    "process_group": [name, "default_pg" if name == "0" else "undefined"],
                    "collective_seq_id": seq,
                    "profiling_name": f"gloo:{op}",
                    "record_id": i,
                    "retired": False,
                    "time_created_ns": 1_700_000_000_000_000_000 + seq * 1_000_000,
                    "input_sizes": [[1024]],
                }
                for i, (pg_id, name, seq, op) in enumerate(entries)
            ],
        }
    ).encode()


def _fake(make: Callable[[], bytes]) -> Recorder:
    return Recorder({"generic": lambda entries, active: make() if entries else _strip(make())})


def _strip(raw: bytes) -> bytes:
    data = json.loads(raw)
    data.pop("entries", None)
    return json.dumps(data).encode()


def test_a_real_rank_exports_its_last_enqueued_collective_and_says_the_recorder_is_on(
    gloo: Any, tracker: Tracker, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    for _ in range(3):
        gloo.all_reduce(torch.ones(8))
    # gloo marks a collective completed a moment after wait() returns (more than 0.2 s under load):
    # read the recorder until it has, then start the monitor (which, waiting, would see a stall).
    wait_for(lambda: all(g.completed == g.enqueued for g in Recorder().status().groups.values()), timeout=20)
    monitor = CollectiveMonitor(tracker, enabled="user")
    tracker.flight_recorder = monitor.info
    with caplog.at_level(logging.INFO, logger="babysitter"):
        monitor.poll()
        monitor.poll()
    assert monitor.state == "on" and tracker.info()["flight_recorder"] == "on"
    said = [r.getMessage() for r in caplog.records if "flight recorder" in r.getMessage()]
    assert len(said) == 1 and "rank 0: flight recorder on" in said[0], said
    assert _samples(monitor, R.COLLECTIVE_LAST_ENQUEUED.name) == [
        ({"run": "coll", "rank": "0", "pg": "0"}, 3.0)
    ]
    assert _samples(monitor, R.COLLECTIVE_STUCK.name) == []  # not stalled
    assert "group 0: last enqueued #3, last completed #3" in monitor.describe()


def test_a_stalled_rank_reports_the_collective_it_waits_in(gloo: Any, tracker: Tracker) -> None:
    """Group 0 enqueued #1234 and completed #1233: waiting in it once the rank stalled, never before."""
    raw = _dump(
        {"0": (1234, 1233), "1": (5, 5)},
        [("0", "0", 1233, "all_reduce"), ("0", "0", 1234, "all_reduce"), ("1", "1", 5, "barrier")],
    )
    monitor = CollectiveMonitor(tracker, recorder=_fake(lambda: raw), stall_floor=0.2)
    tracker.step()
    monitor.poll()
    assert _samples(monitor, R.COLLECTIVE_STUCK.name) == []
    time.sleep(0.3)
    monitor.poll()
    (stuck,) = _samples(monitor, R.COLLECTIVE_STUCK.name)
    assert stuck == (
        {"run": "coll", "rank": "0", "pg": "0", "op": "all_reduce", "size": "1024", "last_completed": "1233"},
        1234.0,
    )
    groups = {labels["pg"]: v for labels, v in _samples(monitor, R.COLLECTIVE_LAST_ENQUEUED.name)}
    assert groups == {"0": 1234.0, "1": 5.0}
    assert "-> waiting in all_reduce #1234 (1024 elements) since" in monitor.describe()
    tracker.step()  # a step ends the stall: the series goes
    assert _samples(monitor, R.COLLECTIVE_STUCK.name) == []


def test_babysitters_own_group_is_left_out_and_at_most_four_groups_are_exported(
    gloo: Any, tracker: Tracker
) -> None:
    names = [str(i) for i in range(7)]
    raw = _dump(dict.fromkeys(names, (1, 1)), [(n, n, 1, "all_reduce") for n in names])
    monitor = CollectiveMonitor(tracker, recorder=_fake(lambda: raw))
    monitor.exclude_group("1")
    monitor.poll()
    exported = [labels["pg"] for labels, _ in _samples(monitor, R.COLLECTIVE_LAST_ENQUEUED.name)]
    assert exported == ["0", "2", "3", "4"] and len(exported) == MAX_GROUPS
    assert tracker.errors.counts()["flight_recorder_groups"] >= 1


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda: b"{broken", "flight_recorder_malformed"),
        (lambda: b"", "flight_recorder_empty"),
        (lambda: b'{"pg_status": {"0": {"last_enqueued_collective": "x"}}}', "flight_recorder_malformed"),
    ],
)
def test_a_bad_dump_is_counted_and_logged_once_never_raised(
    gloo: Any, tracker: Tracker, caplog: pytest.LogCaptureFixture, make: Callable[[], bytes], key: str
) -> None:
    monitor = CollectiveMonitor(tracker, recorder=Recorder({"generic": lambda e, a: make()}))
    with caplog.at_level(logging.WARNING, logger="babysitter"):
        for _ in range(3):
            monitor.poll()
    assert tracker.errors.counts()[key] == 3
    assert len([r for r in caplog.records if key in r.getMessage()]) == 1
    assert monitor.metrics(["run", "rank"], ["coll", "0"]) == []


def test_a_huge_dump_is_counted_not_parsed(gloo: Any, tracker: Tracker) -> None:
    raw = _dump({"0": (1, 1)}, [("0", "0", 1, "all_reduce")])
    monitor = CollectiveMonitor(
        tracker, recorder=Recorder({"generic": lambda e, a: raw}, max_bytes=len(raw) - 1)
    )
    monitor.poll()
    assert tracker.errors.counts()["flight_recorder_huge"] == 1


def test_a_dump_that_raises_is_counted(gloo: Any, tracker: Tracker) -> None:
    def boom(entries: bool, active: bool) -> bytes:
        raise RuntimeError("dump failed")

    monitor = CollectiveMonitor(tracker, recorder=Recorder({"generic": boom}))
    monitor.poll()
    assert tracker.errors.counts()["flight_recorder_api"] == 1


def test_a_torch_without_the_api_says_so_once(
    gloo: Any, tracker: Tracker, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = CollectiveMonitor(tracker, recorder=Recorder({}))
    with caplog.at_level(logging.WARNING, logger="babysitter"):
        monitor.poll()
        monitor.poll()
    assert monitor.info() == "unavailable"
    assert len([r for r in caplog.records if "flight recorder unavailable" in r.getMessage()]) == 1


def test_a_recorder_turned_off_says_so_and_falls_back(
    gloo: Any, tracker: Tracker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    monitor = CollectiveMonitor(tracker)
    with caplog.at_level(logging.WARNING, logger="babysitter"):
        monitor.poll()
        monitor.poll()
    assert monitor.info() == "off"
    (said,) = [r.getMessage() for r in caplog.records if "flight recorder off" in r.getMessage()]
    assert "straggler scores from step times" in said


def test_nothing_is_read_before_torch_distributed_exists(tracker: Tracker) -> None:
    calls: list[bool] = []
    monitor = CollectiveMonitor(
        tracker, recorder=Recorder({"generic": lambda e, a: calls.append(e) or b"{}"})
    )
    monitor.poll()
    assert calls == [] and monitor.info() == ""


def test_the_entry_waited_in_is_gone_after_a_wrap(gloo: Any, tracker: Tracker) -> None:
    """The ring dropped the entry a rank waits in (a buffer smaller than the stall's backlog): the
    rank still says where it waits, with the operation unknown, and the loss is counted."""
    raw = _dump({"0": (1234, 1233)}, [("0", "0", 1100, "all_reduce")])
    monitor = CollectiveMonitor(tracker, recorder=_fake(lambda: raw), stall_floor=0.1)
    tracker.step()
    time.sleep(0.2)
    monitor.poll()
    (stuck,) = _samples(monitor, R.COLLECTIVE_STUCK.name)
    assert stuck[0]["op"] == "unknown" and stuck[1] == 1234.0
    assert tracker.errors.counts()["flight_recorder_wrapped"] == 1


def test_a_round_capture_holds_the_default_groups_arrivals_up_to_the_round(
    gloo: Any, tracker: Tracker
) -> None:
    raw = _dump({"0": (5, 5)}, [("0", "0", seq, "all_reduce") for seq in range(1, 6)])
    monitor = CollectiveMonitor(tracker, recorder=_fake(lambda: raw))
    issued = 1_700_000_000_000_000_000 + 3 * 1_000_000  # collectives 1-3 were enqueued before the round
    monitor.request_capture(7, issued)
    monitor.poll()
    capture = monitor.round_capture(7)
    assert capture is not None and capture.x == 3 and capture.mode == "time"
    assert sorted(capture.arrivals) == [1, 2, 3, 4, 5] and capture.capacity == flight.DEFAULT_BUFFER
    assert monitor.round_capture(6) is None


def test_watch_sets_the_recorder_size_only_when_asked_and_checks_the_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in flight.BUFFER_ENV:  # set, then removed: whatever watch() sets is undone after the test
        monkeypatch.setenv(name, "1")
        monkeypatch.delenv(name)
    tracker = babysitter.watch(run="fr-off", port=-1, hang_timeout=None, flight_recorder=False)
    tracker.close()
    assert "TORCH_FR_BUFFER_SIZE" not in os.environ and tracker.info()["flight_recorder"] == ""
    tracker = babysitter.watch(run="fr-on", port=-1, hang_timeout=None)
    tracker.close()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == str(flight.DEFAULT_BUFFER)
    with pytest.raises(ValueError, match="flight_recorder"):
        babysitter.watch(run="fr-bad", port=-1, flight_recorder="yes")  # type: ignore[arg-type]
