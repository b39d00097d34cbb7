"""torch's flight recorder as this build records it, and the parser's answer to every bad dump."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from babysitter.training import flight
from babysitter.training.flight import DumpError, GroupStatus, Recorder, parse


def _entry(seq: int, **extra: Any) -> dict[str, Any]:
    return {
        "collective_seq_id": seq,
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "profiling_name": "gloo:all_reduce",
        "record_id": seq - 1,
        "retired": True,
        "state": "scheduled",
        "time_created_ns": 1_700_000_000_000_000_000 + seq,
        "input_sizes": [[4, 256]],
        "is_p2p": False,
        **extra,
    }


def _dump(entries: list[dict[str, Any]] | None = None, **status: tuple[int, int]) -> bytes:
    data: dict[str, Any] = {
        "version": "2.10",
        "pg_status": {
            pg: {
                "last_enqueued_collective": str(e),
                "last_completed_collective": str(c),
                "last_started_collective": "-1",
            }
            for pg, (e, c) in status.items()
        },
    }
    if entries is not None:
        data["entries"] = entries
    return json.dumps(data).encode()


def test_the_gloo_recorder_of_this_build_holds_what_the_docs_say(gloo: Any) -> None:
    """What docs/integrations.md says gloo records here (torch 2.13): enqueue times on the wall clock,
    no start or completion times (state stays 'scheduled'), 'retired' once done, per-group counters."""
    import torch

    t = torch.ones(4, 256)
    before = time.time_ns()
    gloo.all_reduce(t)
    after = time.time_ns()
    gloo.all_reduce(t, async_op=True).wait()
    time.sleep(0.3)  # gloo marks the last one completed a moment after wait() returns
    raw = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, False))
    # The recorder is the process's: entries of a group destroyed earlier (another test's) stay in it.
    mine = [e for e in raw["entries"] if e["time_created_ns"] >= before]
    first = mine[0]
    assert first["state"] == "scheduled" and first["retired"] is True
    assert first["time_discovered_started_ns"] == 0 and first["time_discovered_completed_ns"] == 0
    assert before <= first["time_created_ns"] <= after
    # Counters per pg_id: this group's (groups of earlier tests in this process have other ids).
    pg_id = str(first["pg_id"])
    assert raw["pg_status"][pg_id] == {
        "last_completed_collective": "2",
        "last_enqueued_collective": "2",
        "last_started_collective": "-1",
    }
    recorder = Recorder()
    assert set(recorder.api) == {"generic"}  # a CPU build has no NCCL recorder
    capture = recorder.capture()
    assert capture.groups[pg_id] == GroupStatus(enqueued=2, completed=2)
    assert [(e.pg, e.seq, e.op, e.backend, e.numel, e.retired) for e in capture.entries[-2:]] == [
        ("0", 1, "all_reduce", "gloo", 1024, True),
        ("0", 2, "all_reduce", "gloo", 1024, True),
    ]
    assert before / 1e9 <= capture.entries[-2].created <= after / 1e9
    assert capture.names[pg_id] == ("0", "default_pg")
    status = recorder.status()
    assert status.entries == [] and not status.has_entries and status.groups == capture.groups


def test_a_shifted_host_clock_shifts_the_recorder_times_too(
    gloo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end-to-end test's skewed rank: wall_ns() ahead by 25 ms moves the parsed enqueue times with it,
    as a host whose clock is ahead stamps both (time.time_ns and the recorder read the same clock)."""
    import torch

    gloo.all_reduce(torch.ones(2))
    true = Recorder().capture().entries[-1].created
    real = time.time_ns
    monkeypatch.setattr(flight, "wall_ns", lambda: real() + 25_000_000)
    assert Recorder().capture().entries[-1].created == pytest.approx(true + 0.025, abs=1e-9)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty"),
        (b"{not json", "malformed"),
        (b"[1, 2]", "malformed"),
        (b'{"pg_status": []}', "malformed"),
        (b'{"pg_status": {"0": {"last_enqueued_collective": "x"}}}', "malformed"),
        (b'{"pg_status": {}, "entries": {}}', "malformed"),
        (b'{"pg_status": {"0": 7}}', "malformed"),
        (12, "malformed"),
    ],
)
def test_unusable_dumps_raise_dump_error_only(raw: Any, reason: str) -> None:
    with pytest.raises(DumpError) as info:
        parse(raw)
    assert info.value.reason == reason


def test_a_huge_dump_is_not_parsed() -> None:
    raw = _dump([_entry(i) for i in range(1, 200)], **{"0": (199, 199)})
    with pytest.raises(DumpError, match="huge"):
        parse(raw, max_bytes=len(raw) - 1)
    assert len(parse(raw, max_bytes=len(raw)).entries) == 199


def test_bad_entries_are_skipped_and_counted_p2p_left_out_and_an_off_recorder_has_no_entries() -> None:
    entries = [
        _entry(1),
        {"collective_seq_id": 2},  # no process group
        _entry(3, time_created_ns="soon"),
        _entry(4, process_group="0"),
        _entry(0, is_p2p=True, profiling_name="gloo:send"),
        _entry(5, duration_ms=1.5, profiling_name="nccl:all_reduce"),
    ]
    capture = parse(_dump(entries, **{"0": (5, 4)}))
    assert [e.seq for e in capture.entries] == [1, 5] and capture.skipped == 3
    assert capture.entries[1].duration == pytest.approx(0.0015) and capture.entries[1].backend == "nccl"
    off = parse(_dump(None))
    assert not off.has_entries and off.groups == {} and off.entries == []


def test_a_wrapped_buffer_is_read_oldest_first_by_what_it_holds() -> None:
    """torch dumps the ring oldest first; after it wrapped the oldest kept entries start mid-stream."""
    capture = parse(_dump([_entry(i) for i in range(1801, 2001)], **{"0": (2000, 2000)}))
    assert capture.entries[0].seq == 1801 and capture.entries[-1].seq == 2000


def test_missing_or_failing_api_raises_dump_error() -> None:
    with pytest.raises(DumpError, match="api"):
        Recorder({}).status()

    def boom(entries: bool, active: bool) -> bytes:
        raise RuntimeError("c10d dump failed")

    with pytest.raises(DumpError, match="RuntimeError"):
        Recorder({"generic": boom}).capture()


def test_both_recorders_merge_and_nccls_counters_win() -> None:
    nccl = _dump([_entry(7, profiling_name="nccl:all_reduce", duration_ms=2.0)], **{"0": (7, 6)})
    generic = _dump(
        [_entry(3, pg_id=1, process_group=["1", "babysitter"]), _entry(9)], **{"0": (9, 9), "1": (3, 3)}
    )
    capture = Recorder({"nccl": lambda e, a: nccl, "generic": lambda e, a: generic}).capture()
    assert capture.groups == {"0": GroupStatus(7, 6), "1": GroupStatus(3, 3)}
    assert [(e.pg, e.seq, e.backend) for e in capture.entries] == [("0", 7, "nccl"), ("1", 3, "gloo")]
    assert capture.seconds >= 0


@pytest.mark.parametrize(
    ("env", "state", "size"),
    [
        ({}, "set", "2000"),
        ({"TORCH_FR_BUFFER_SIZE": "500"}, "user", "500"),
        ({"TORCH_FR_BUFFER_SIZE": "0"}, "off", "0"),
        ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}, "user", None),
        ({"TORCH_FR_BUFFER_SIZE": "lots"}, "off", "lots"),
    ],
)
def test_enable_sets_the_buffer_only_when_unset(env: dict[str, str], state: str, size: str | None) -> None:
    assert flight.enable(env) == state
    assert env.get("TORCH_FR_BUFFER_SIZE") == size
