"""Ledger schema round trips, torn-line handling at every byte, and completed_checkpoints()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter.ledger import completed_checkpoints, read_ledger
from babysitter.ledger.reader import parse_ledger
from babysitter.ledger.records import (
    Alive,
    CheckpointBegin,
    CheckpointEnd,
    End,
    Hang,
    PhaseBegin,
    PhaseEnd,
    Progress,
    SchemaError,
    Start,
    decode,
    encode,
)

T0 = 1_700_000_000_000_000

SAMPLE = [
    Start(t=T0, pst=T0 - 5_000_000, id="abc", host="node-1", pid=42, run="r", info={"world_size": 8}),
    Progress(
        t=T0 + 3,
        steps=(1, 2, 3),
        ends=(T0 + 1, T0 + 2, T0 + 3),
        data_wait=1,
        model_flops=1e12,
        peak_flops=9.89e14,
    ),
    Progress(t=T0 + 9, steps=(5, 7), ends=(T0 + 5, T0 + 9), data_wait=0, model_flops=0.0, peak_flops=None),
    Progress(
        t=T0 + 9,
        steps=(8, 9),
        ends=(T0 + 9, T0 + 9),
        data_wait=3,
        model_flops=0.0,
        peak_flops=None,
        waits=(3, 0),
        extra=((0, 70),),
    ),
    CheckpointBegin(t=T0 + 10, op="save", step=7, path="/ck/7"),
    CheckpointEnd(t=T0 + 20, op="save", step=7, ok=True, nbytes=123, path="/ck/7"),
    CheckpointEnd(t=T0 + 21, op="save", step=8, ok=False, nbytes=None, path=None),
    PhaseBegin(t=T0 + 30, name="eval"),
    PhaseEnd(t=T0 + 40, name="eval"),
    Hang(t=T0 + 50, step=7, since=40),
    Start(
        t=T0 + 55,
        pst=T0 - 5_000_000,
        id="abc",
        host="node-1",
        pid=42,
        run="r",
        segment=1,
        last_step=9,
        last_end=T0 + 9,
        resumed=0,
    ),
    Alive(t=T0 + 60),
    End(t=T0 + 70, clean=True),
]


def test_every_record_kind_round_trips() -> None:
    for record in SAMPLE:
        line = encode(record)
        assert line.endswith(b"\n")
        assert line.count(b"\n") == 1
        assert decode(json.loads(line)) == record


def test_unknown_version_and_kind_are_schema_errors() -> None:
    with pytest.raises(SchemaError):
        decode({"v": 3, "k": "alive", "t": 1})
    with pytest.raises(SchemaError):
        decode({"v": 1, "k": "nope", "t": 1})
    with pytest.raises(SchemaError):
        decode({"v": 1, "k": "alive", "t": 1.5})


@pytest.mark.parametrize(
    "line",
    [
        {"v": 2, "k": "alive", "t": 2**63},
        {"v": 2, "k": "alive", "t": -1},
        {"v": 2, "k": "alive", "t": True},
        {"v": 1, "k": "prog", "s": 2**63, "b0": 1, "d": []},
        {"v": 1, "k": "prog", "s": 1, "b0": 2**53, "d": []},
        {"v": 1, "k": "prog", "s": 1, "b0": 2**52, "d": [2**52]},  # the sum leaves the range
        {"v": 1, "k": "prog", "s": 1, "b0": 1, "d": [1], "ss": [1, 2**64]},
        {"v": 2, "k": "prog", "s": 1, "b0": 1, "dd": [1, 1]},  # one wait per boundary, interleaved
        {"v": 2, "k": "prog", "s": 1, "b0": 1, "d": [], "mf": float("inf")},
        {"v": 2, "k": "prog", "s": 1, "b0": 1, "d": [], "x": [[1, 5]]},
        {"v": 2, "k": "cke", "t": 1, "op": "save", "step": 1, "ok": True, "bytes": 2**63, "path": None},
        {"v": 2, "k": "start", "t": 1, "pst": 1, "id": "a", "host": "h", "pid": -5, "run": "r"},
    ],
)
def test_out_of_range_fields_are_schema_errors(line: dict[str, object]) -> None:
    with pytest.raises(SchemaError):
        decode(line)


def test_out_of_range_fields_are_refused_by_the_encoder() -> None:
    with pytest.raises(ValueError, match="outside"):
        encode(Hang(t=T0, step=2**63, since=0))


def test_truncation_at_every_byte_reads_a_prefix(tmp_path: Path) -> None:
    data = b"".join(encode(r) for r in SAMPLE)
    boundaries = {0}
    pos = 0
    for r in SAMPLE:
        pos += len(encode(r))
        boundaries.add(pos)
    path = tmp_path / "ledger.jsonl"
    for cut in range(len(data) + 1):
        got = parse_ledger(data[:cut])
        if cut % 17 == 0:  # through the file too, now and then (same parser)
            path.write_bytes(data[:cut])
            assert read_ledger(path) == got
        complete = max(b for b in boundaries if b <= cut)
        n_complete = sorted(boundaries).index(complete)
        assert got.records == SAMPLE[:n_complete]
        assert got.torn_lines == (0 if cut == complete else 1)
        # A later writer terminates the torn line with a newline and appends: still a clean prefix.
        again = parse_ledger(data[:cut] + (b"" if got.ends_with_newline else b"\n") + encode(Alive(t=1)))
        if cut + 1 in boundaries and cut != complete:
            # Only the newline was missing: the terminated line is a whole record again.
            assert again.records == [*SAMPLE[: n_complete + 1], Alive(t=1)]
            assert again.torn_lines == 0
        else:
            assert again.records == [*SAMPLE[:n_complete], Alive(t=1)]
            assert again.torn_lines == got.torn_lines


def test_garbage_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    path.write_bytes(
        b"\x00\x00\x00\n{not json\n" + b'{"v":9,"k":"alive","t":1}\n' + encode(Alive(t=5)) + b"\n"
    )
    got = read_ledger(path)
    assert got.records == [Alive(t=5)]
    assert got.torn_lines == 1
    assert got.invalid_lines == 1


def test_completed_checkpoints_lists_only_successful_saves_newest_last(tmp_path: Path) -> None:
    lines = [
        CheckpointEnd(t=T0 + 5_000_000, op="save", step=20, ok=True, nbytes=10, path="/c/20"),
        CheckpointEnd(t=T0 + 1_000_000, op="save", step=10, ok=True, nbytes=None, path=None),
        CheckpointEnd(t=T0 + 6_000_000, op="save", step=30, ok=False, nbytes=None, path="/c/30"),
        CheckpointEnd(t=T0 + 7_000_000, op="load", step=20, ok=True, nbytes=None, path="/c/20"),
    ]
    (tmp_path / "babysitter-ledger.jsonl").write_bytes(b"".join(encode(r) for r in lines) + b'{"v":1,"k":"ck')
    got = completed_checkpoints(tmp_path)
    assert [(c.step, c.path, c.nbytes) for c in got] == [(10, None, None), (20, "/c/20", 10)]
    assert got[-1].time == pytest.approx((T0 + 5_000_000) / 1e6)
    assert completed_checkpoints(tmp_path / "missing") == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10**7), min_size=1, max_size=30),
    st.integers(min_value=0, max_value=10**9),
)
def test_progress_round_trips_for_any_boundaries(deltas: list[int], first: int) -> None:
    ends = [T0]
    for d in deltas[1:]:
        ends.append(ends[-1] + d)
    rec = Progress(
        t=ends[-1],
        steps=tuple(range(first, first + len(ends))),
        ends=tuple(ends),
        data_wait=0,
        model_flops=1.0,
        peak_flops=None,
    )
    assert decode(json.loads(encode(rec))) == rec
