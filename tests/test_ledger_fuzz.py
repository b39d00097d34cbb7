"""Out-of-range and mutated ledger lines: every reader skips what it cannot use and never raises (issue 12.10).

The fuzz test mutates real ledgers (one written by the previous format's writer, one by today's) 3,000
times with a fixed seed and runs everything that reads a ledger on each: the report's summary and JSON,
its plot data, the saves, the node agent's run name and checkpoint list, and the live writer's
accounting. Mutations include lines nested 100,000 deep, alone or as a value of a start or save line
(issue 31: a RecursionError in the sentinel's pass). Set
``BABYSITTER_FUZZ_SEED`` to explore other mutations.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

import babysitter
from babysitter.catalog import goodput as G
from babysitter.ledger import LedgerWriter, completed_checkpoints, read_ledger, summarize
from babysitter.ledger.accounting import Accountant
from babysitter.ledger.reader import read_saves, read_timeline
from babysitter.ledger.records import Progress
from babysitter.ledger.spans import badput_spans, step_points
from babysitter.node.storage.sentinel import LedgerTail, run_name
from test_ledger_helpers import T0, Book, ramp

DATA = Path(__file__).with_name("data") / "ledger"
LEDGER = "babysitter-ledger.jsonl"
MUTATIONS = 3000

_VALUES: list[object] = [
    2**63,
    -(2**63) - 1,
    2**64,
    10**30,
    2**53,
    -1,
    0,
    1.5,
    1e308,
    -1e308,
    "x",
    "",
    None,
    True,
    [],
    {},
    [1, 2],
    [2**63, -1],
    {"a": 1},
    "y" * 5000,
]
_LITERALS = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"9" * 400]
_KEYS = ["v", "k", "t", "s", "b0", "d", "ss", "w", "dw", "dd", "x", "f", "mf", "pk", "pst", "id", "host"]
_KEYS += [
    "pid",
    "run",
    "info",
    "op",
    "step",
    "ok",
    "bytes",
    "path",
    "name",
    "since",
    "clean",
    "seg",
    "ls",
    "lb",
]
_KINDS = ["start", "prog", "ckb", "cke", "phb", "phe", "hang", "alive", "end", "zzz"]


def _base_ledgers() -> list[bytes]:
    book = (
        Book()
        .start(0)
        .steps(1, ramp(10, 5), data_wait=0.5)
        .save(14.2, 14.5, 5)
        .phase("eval", 14.5, 15)
        .steps(6, ramp(16, 5))
        .hang(30, 10, 10)
        .alive(31)
        .start(40, pst=38)
        .load(41, 42, 5)
        .steps(6, ramp(45, 10), data_wait=1.0)
        .save(55, 56, 15)
        .end(57, clean=False)
    )
    ours = b"".join(book.encoded())
    return [(DATA / "v1-run" / LEDGER).read_bytes(), ours]


def _mutate_obj(rng: random.Random, obj: dict[str, object]) -> bytes:
    op = rng.randrange(6)
    key = rng.choice(list(obj)) if obj else "t"
    if op == 0:
        obj[key] = rng.choice(_VALUES)
    elif op == 1:
        obj.pop(key, None)
    elif op == 2:
        obj[rng.choice(_KEYS)] = rng.choice(_VALUES)
    elif op == 3:
        obj["k"] = rng.choice(_KINDS)
    elif op == 4:
        value = obj.get(key)
        if isinstance(value, list) and value:
            value[rng.randrange(len(value))] = rng.choice(_VALUES)
        elif isinstance(value, dict) and value:
            value[rng.choice(list(value))] = rng.choice(_VALUES)
        else:
            obj[key] = [rng.choice(_VALUES) for _ in range(rng.randrange(4))]
    else:
        text = json.dumps(obj, separators=(",", ":")).encode()
        digits = [i for i, c in enumerate(text) if 0x30 <= c <= 0x39]
        if digits:
            i = rng.choice(digits)
            return text[:i] + rng.choice(_LITERALS) + text[i + 1 :]
    return json.dumps(obj, separators=(",", ":")).encode()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")[:-1]
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        op = rng.randrange(10)
        if op < 6:
            try:
                obj = json.loads(lines[i])
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                lines[i] = _mutate_obj(rng, obj)
        elif op == 6:
            cut = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:cut] + bytes([rng.randrange(256)]) + lines[i][cut + 1 :]
        elif op == 7:
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        elif op == 8:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            deep = b"[" * 100_000 + b"]" * 100_000
            nested = lines[i][:-1] + b',"z":' + deep + b"}"  # a deep value in a start or save line
            lines[i] = rng.choice(
                [b"[" * 100_000, deep, nested, b"{}", b"null", b"\x00" * 10, b"\xff\xfe", lines[i][:-3]]
            )
    return b"\n".join(lines) + b"\n"


def _read_everything(run_dir: Path) -> None:
    """What the report, its plot, the node agent and a restarted writer do with a ledger."""
    summary = summarize(run_dir, now=T0 + 10_000.0, keep_points=True)
    text = json.dumps(summary.to_json(), allow_nan=False)  # strict JSON: no NaN or Infinity
    assert text
    acc = summary.totals
    assert acc.productive_us + sum(acc.badput_us.values()) == acc.wall_us
    for inc in summary.timeline.incarnations:
        step_points(inc)
    badput_spans(summary.accountant, now=T0 + 10_000.0)
    completed_checkpoints(run_dir)
    read_saves(run_dir).saves(now=T0 + 10_000.0, abort_after=60.0)
    run_name(run_dir)  # the node agent's sentinel: the run's name, then its saves
    LedgerTail(run_dir / LEDGER).saves(now=T0 + 10_000.0, abort_after=60.0)
    timeline, _ = read_timeline(run_dir / LEDGER, keep_points=False)
    live = Accountant(timeline, settle_seconds=1.0)
    live.totals(now=T0 + 10_000.0, live=True, tail="exclude", hold=True)
    live.window(T0, T0 + 60.0, now=T0 + 10_000.0, live=True)


def test_mutated_ledgers_never_crash_a_reader(tmp_path: Path) -> None:
    seed = int(os.environ.get("BABYSITTER_FUZZ_SEED", "1812"))
    rng = random.Random(seed)
    bases = _base_ledgers()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    crashes: list[tuple[int, str]] = []
    for i in range(MUTATIONS):
        data = _mutate(rng, rng.choice(bases))
        (run_dir / LEDGER).write_bytes(data)
        try:
            _read_everything(run_dir)
        except Exception as exc:
            crashes.append((i, f"{type(exc).__name__}: {exc}"[:200]))
    assert crashes == [], f"seed {seed}: {len(crashes)} of {MUTATIONS} mutated ledgers crashed a reader"


def test_an_out_of_range_step_is_one_skipped_line_not_a_dead_report(tmp_path: Path) -> None:
    """``"s": 2**63`` made the report die with OverflowError and a restarted writer drop the history."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    data = bytearray((DATA / "v1-run" / LEDGER).read_bytes())
    lines = data.split(b"\n")
    prog = next(i for i, line in enumerate(lines) if b'"k":"prog"' in line and i > 20)
    obj = json.loads(lines[prog])
    obj["s"] = 9223372036854775808
    lines[prog] = json.dumps(obj).encode()
    (run_dir / LEDGER).write_bytes(b"\n".join(lines))
    summary = summarize(run_dir)
    assert summary.invalid_lines == 1
    assert summary.totals.restarts == 2
    assert summary.totals.productive_seconds > 0
    writer = LedgerWriter(run_dir, run="v1-compat", flush_interval=0.02)
    try:
        assert writer.wait_loaded(10)
        got = {
            (s.name, s.labels.get("reason", "")): s.value
            for family in writer.metrics(["run"], ["v1-compat"], time.time())
            for s in family.samples
        }
        assert got[(G.RESTARTS.name, "")] == 2  # the history survived
        assert got[(G.GOODPUT.name, "")] > 0
        assert got[(G.LEDGER_SKIPPED_LINES.name, "invalid")] == 1
    finally:
        writer.close(time=time.time(), clean=True)


def test_an_out_of_range_step_from_the_training_loop_is_rejected_and_the_ledger_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BABYSITTER_LEDGER_FLUSH_SECONDS", "0.02")
    run_dir = tmp_path / "run"
    tracker = babysitter.watch(
        run_dir=run_dir, run="big-step", port=-1, registry_dir=tmp_path / "reg", flush_interval=0.02
    )
    try:
        tracker.step(step=1)
        tracker.step(step=2**63)  # not a step any run reaches: rejected, counted
        tracker.step(step=2**53)
        tracker.add_data_wait(float("inf"))  # raised OverflowError into the training loop
        tracker.add_data_wait(1e300)
        time.sleep(0.1)
        for step in range(10, 20):
            tracker.step(step=step)
        assert tracker.rejected.counts().get("step_out_of_range") == 2
        assert tracker.rejected.counts().get("data_wait_invalid") == 2
    finally:
        tracker.close()
    steps = [s for r in read_ledger(run_dir / LEDGER).records if isinstance(r, Progress) for s in r.steps]
    assert steps == [1, 2, 3, *range(10, 20)]
    assert summarize(run_dir).incarnations[0].steps == 13
