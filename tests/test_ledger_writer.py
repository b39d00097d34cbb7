"""LedgerWriter: batching, the single-writer lock, continuing across restarts, failing storage."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import babysitter
from babysitter.catalog import goodput as G
from babysitter.ledger import LedgerWriter, read_ledger, summarize
from babysitter.ledger.records import CheckpointEnd, End, Progress, Start
from test_ledger_helpers import T0, Book, ramp

LEDGER = "babysitter-ledger.jsonl"


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def samples(writer: LedgerWriter, now: float | None = None) -> dict[tuple[str, str], float]:
    out = {}
    for family in writer.metrics(["run"], ["r"], time.time() if now is None else now):
        for s in family.samples:
            labels = s.labels
            key = labels.get("cause") or labels.get("op") or labels.get("reason") or labels.get("state") or ""
            out[(s.name, key)] = s.value
    return out


@pytest.fixture
def writers() -> Iterator[list[LedgerWriter]]:
    made: list[LedgerWriter] = []
    yield made
    for w in made:
        w.close(time=time.time(), clean=True, timeout=2.0)


def make(writers: list[LedgerWriter], run_dir: Path, **kw: object) -> LedgerWriter:
    w = LedgerWriter(run_dir, run="r", flush_interval=0.02, **kw)  # type: ignore[arg-type]
    writers.append(w)
    assert w.wait_loaded(10)
    return w


def drive(w: LedgerWriter, t0: float, first: int, n: int, dt: float = 0.1, *, wait: float = 0.0) -> float:
    """``n`` steps of ``dt`` seconds from ``first`` on, ``wait`` seconds of data wait in each."""
    for k in range(n):
        w.progress(
            boundaries=[(first + k, t0 + (k + 1) * dt)],
            data_wait_seconds=wait,
            model_flops=1e9,
            peak_flops=1e12,
            data_waits=[wait],
        )
    return t0 + n * dt


def test_events_reach_the_file_in_batches_and_metrics_match_the_report(
    tmp_path: Path, writers: list[LedgerWriter]
) -> None:
    w = make(writers, tmp_path)
    t0 = time.time() - 100
    w.incarnation_start(time=t0, info={"world_size": 2})
    end = drive(w, t0 + 5, 1, 200)
    w.checkpoint_begin(kind="save", step=200, time=end, path="/ck/200")
    w.checkpoint_end(kind="save", step=200, time=end + 2, ok=True, nbytes=10, path="/ck/200")
    w.phase_begin(name="eval", time=end + 2)
    w.phase_end(name="eval", time=end + 3)
    w.close(time=end + 4, clean=True)
    ledger = read_ledger(tmp_path / LEDGER)
    progress = [r for r in ledger.records if isinstance(r, Progress)]
    assert sum(len(p.steps) for p in progress) == 200
    assert len(progress) < 200  # batched: far fewer lines than steps
    assert isinstance(ledger.records[-1], End)
    summary = summarize(tmp_path)
    assert summary.state == "ended"
    assert summary.totals.badput_seconds["checkpoint_save"] == 2.0
    assert summary.totals.badput_seconds["eval"] == 1.0
    live = samples(w, now=end + 4)
    assert live[(G.PRODUCTIVE_SECONDS.name, "")] == summary.totals.productive_seconds
    assert live[(G.BADPUT_SECONDS.name, "startup")] == summary.totals.badput_seconds["startup"]
    assert oct((tmp_path / LEDGER).stat().st_mode & 0o777) == oct(0o644)


def test_a_second_live_writer_waits_with_a_clear_message_and_takes_over_when_the_first_ends(
    tmp_path: Path, writers: list[LedgerWriter], caplog: pytest.LogCaptureFixture
) -> None:
    first = make(writers, tmp_path)
    first.incarnation_start(time=time.time(), info={})
    with caplog.at_level(logging.WARNING, logger="babysitter.ledger.writer"):
        second = make(writers, tmp_path)
    assert any(
        f"pid {os.getpid()} on host '{socket.gethostname()}'" in r.getMessage() for r in caplog.records
    )
    second.incarnation_start(time=time.time(), info={})
    time.sleep(0.1)
    assert samples(second)[(G.LEDGER_WRITER_STATE.name, "waiting")] == 1
    assert len(read_ledger(tmp_path / LEDGER).records) == 1  # only the first one's start
    first.close(time=time.time(), clean=True)
    wait_for(lambda: samples(second).get((G.LEDGER_WRITER_STATE.name, "writing")) == 1)
    wait_for(lambda: len(read_ledger(tmp_path / LEDGER).records) == 3)
    assert [type(r) for r in read_ledger(tmp_path / LEDGER).records] == [Start, End, Start]


def _lock(path: Path, **fields: object) -> None:
    base = {
        "v": 1,
        "host": "other-host",
        "pid": 1,
        "pst": 0.0,
        "token": "t",
        "heartbeat": time.time(),
        "run": "r",
    }
    path.write_text(json.dumps({**base, **fields}))


def test_lock_of_another_host_is_live_until_its_heartbeat_goes_stale(
    tmp_path: Path, writers: list[LedgerWriter]
) -> None:
    lock = tmp_path / (LEDGER + ".lock")
    _lock(lock, heartbeat=time.time() - 5)
    waiting = make(writers, tmp_path, stale_after=60)
    assert waiting.state == "waiting"
    waiting.close(time=time.time(), clean=False)
    assert json.loads(lock.read_text())["host"] == "other-host"  # not taken, not removed
    _lock(lock, heartbeat=time.time() - 600)
    os.utime(lock, (time.time() - 600, time.time() - 600))  # the heartbeat is the file's mtime
    w = make(writers, tmp_path, stale_after=60)
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert w.write_errors == 0


def test_lock_of_a_dead_process_on_this_host_is_taken_over(
    tmp_path: Path, writers: list[LedgerWriter]
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    _lock(tmp_path / (LEDGER + ".lock"), host=socket.gethostname(), pid=int(proc.stdout), pst=time.time() - 1)
    make(writers, tmp_path)


def test_a_restarted_writer_continues_the_counters(tmp_path: Path, writers: list[LedgerWriter]) -> None:
    # A previous incarnation (killed) wrote 10 steps with a checkpoint at 5, relative to T0.
    book = Book().start(0).steps(1, ramp(10, 10)).save(14, 14.5, 5).alive(19.5)
    book.write(tmp_path / LEDGER)
    w = make(writers, tmp_path)
    got = samples(w, now=T0 + 19.5)
    assert got[(G.RESTARTS.name, "")] == 0
    # Steps 2..5 are covered by the checkpoint; 6..10 are held back until something resumes.
    assert got[(G.PRODUCTIVE_SECONDS.name, "")] == 4.0
    assert got[(G.BADPUT_SECONDS.name, "startup")] == 10.0
    # The gauge counts the uncovered steps (the report's view): 8.5 s of 19 s (the tail is pending).
    assert got[(G.GOODPUT.name, "")] == pytest.approx(8.5 / 19.0)
    w.incarnation_start(time=T0 + 30, info={})
    w.checkpoint_begin(kind="load", step=5, time=T0 + 31, path=None)
    w.checkpoint_end(kind="load", step=5, time=T0 + 32, ok=True, nbytes=None, path=None)
    drive(w, T0 + 33, 6, 5, dt=1.0)
    w.flush()
    wait_for(lambda: samples(w, now=T0 + 38)[(G.BADPUT_SECONDS.name, "lost_progress")] > 0)
    got = samples(w, now=T0 + 38)
    assert got[(G.RESTARTS.name, "")] == 1
    assert got[(G.BADPUT_SECONDS.name, "lost_progress")] == 5.0  # steps 6..10 and the tail of the first
    assert got[(G.BADPUT_SECONDS.name, "checkpoint_load")] == 1.0
    assert got[(G.BADPUT_SECONDS.name, "downtime")] > 0
    assert got[(G.PRODUCTIVE_SECONDS.name, "")] == 4.0  # never took back: steps 7..10 are pending again


def test_counters_never_decrease_while_the_run_goes_on(tmp_path: Path, writers: list[LedgerWriter]) -> None:
    w = make(writers, tmp_path, settle_seconds=0.5)
    t0 = time.time()
    w.incarnation_start(time=t0, info={})
    prev: dict[tuple[str, str], float] = {}
    t = t0
    for round_ in range(8):
        t = drive(w, t, 1 + round_ * 10, 10, dt=0.05)
        if round_ == 3:
            w.checkpoint_begin(kind="save", step=40, time=t + 0.01, path=None)
        if round_ == 4:
            w.checkpoint_end(kind="save", step=40, time=t - 0.2, ok=True, nbytes=1, path=None)
        w.flush()
        wait_for(lambda: not w._inbox)
        time.sleep(0.03)
        cur = samples(w, now=t + 0.03)
        for key, value in cur.items():
            if key[0].endswith("_total") and key in prev:
                assert value >= prev[key] - 1e-9, key
        prev = cur


def test_torn_last_line_is_skipped_reported_and_the_next_writer_starts_a_fresh_line(
    tmp_path: Path, writers: list[LedgerWriter]
) -> None:
    book = Book().start(0).steps(1, ramp(1, 3))
    path = book.write(tmp_path / LEDGER)
    with path.open("ab") as f:
        f.write(b'{"v":1,"k":"prog","t":17000')  # SIGKILL mid-write
    w = make(writers, tmp_path)
    assert samples(w)[(G.LEDGER_SKIPPED_LINES.name, "torn")] == 1
    w.incarnation_start(time=time.time(), info={})
    w.close(time=time.time(), clean=True)
    ledger = read_ledger(path)
    assert ledger.torn_lines == 1
    assert [type(r) for r in ledger.records] == [Start, Progress, Start, End]


def test_full_disk_training_goes_on_errors_counted_one_warning_records_retried(
    tmp_path: Path, writers: list[LedgerWriter], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / LEDGER
    caplog.set_level(logging.WARNING, logger="babysitter.ledger.writer")
    w = make(writers, tmp_path)
    t0 = time.time()
    w.incarnation_start(time=t0, info={})
    wait_for(path.exists)
    path.unlink()
    path.symlink_to("/dev/full")  # from now on every write fails with ENOSPC, like a full file system
    t = t0
    for _ in range(5):
        t = drive(w, t, 1 + _ * 10, 10, dt=0.01)
        w.flush(durable=True)
        time.sleep(0.05)
    wait_for(lambda: w.write_errors >= 3)
    got = samples(w)
    assert got[(G.LEDGER_WRITE_ERRORS.name, "write")] >= 3
    assert got[(G.LEDGER_PENDING_BYTES.name, "")] > 0
    assert got[(G.BADPUT_SECONDS.name, "startup")] > 0  # goodput still computed from memory
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # The swap of the file for /dev/full is seen (once), the failing writes are logged once.
    assert len(warnings) == 2
    assert "deleted or replaced" in warnings[0]
    assert "write failed" in warnings[1]
    assert "ENOSPC" in warnings[1] or "No space" in warnings[1]
    # The disk recovers: the kept records land in the ledger, after one continuation start.
    path.unlink()
    wait_for(lambda: samples(w)[(G.LEDGER_PENDING_BYTES.name, "")] == 0)
    records = read_ledger(path).records
    assert isinstance(records[0], Start) and records[0].segment == 1
    assert [r for r in records if isinstance(r, Start)] == [records[0]]
    steps = [s for r in records if isinstance(r, Progress) for s in r.steps]
    assert steps == list(range(1, 51))


def test_unusable_run_dir_never_raises_and_recovers(tmp_path: Path, writers: list[LedgerWriter]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    # mkdir, the lock and every open fail with ENOTDIR.
    w = make(writers, blocker / "run", heartbeat_interval=0.05, stale_after=1.0)
    w.incarnation_start(time=time.time(), info={})
    drive(w, time.time(), 1, 5)
    w.flush(durable=True)
    wait_for(lambda: w.write_errors >= 3)
    got = samples(w)
    assert got[(G.LEDGER_WRITE_ERRORS.name, "lock")] >= 1
    assert got[(G.LEDGER_PENDING_BYTES.name, "")] > 0
    # The storage comes back: the writer takes the lock and writes what it kept.
    blocker.unlink()
    blocker.mkdir()
    (blocker / "run").mkdir()
    wait_for(lambda: samples(w)[(G.LEDGER_PENDING_BYTES.name, "")] == 0)
    records = read_ledger(blocker / "run" / LEDGER).records
    assert isinstance(records[0], Start)
    assert [s for r in records if isinstance(r, Progress) for s in r.steps] == [1, 2, 3, 4, 5]


def test_pending_buffer_is_bounded_while_storage_fails_and_keeps_the_records_that_matter(
    tmp_path: Path, writers: list[LedgerWriter]
) -> None:
    path = tmp_path / LEDGER
    path.symlink_to("/dev/full")
    w = make(writers, tmp_path, max_pending_bytes=1 << 16)
    t0 = time.time()
    w.incarnation_start(time=t0, info={})
    for i in range(40):
        drive(w, t0 + i, 1 + i * 2000, 2000, dt=0.0001)
        if i == 20:
            w.checkpoint_begin(kind="save", step=42_000, time=t0 + i + 0.5, path=None)
            w.checkpoint_end(kind="save", step=42_000, time=t0 + i + 0.6, ok=True, nbytes=1, path=None)
        w.flush()
        time.sleep(0.005)
    wait_for(lambda: samples(w)[(G.LEDGER_DROPPED_RECORDS.name, "")] > 0)
    assert samples(w)[(G.LEDGER_PENDING_BYTES.name, "")] <= 1 << 16
    path.unlink()  # the storage recovers
    wait_for(lambda: samples(w)[(G.LEDGER_PENDING_BYTES.name, "")] == 0)
    records = read_ledger(path).records
    assert isinstance(records[0], Start)  # progress lines were dropped first, never the start
    assert any(isinstance(r, CheckpointEnd) and r.step == 42_000 for r in records)
    assert sum(len(r.steps) for r in records if isinstance(r, Progress)) < 80_000


def test_bad_input_is_skipped_and_nothing_raises(tmp_path: Path, writers: list[LedgerWriter]) -> None:
    w = make(writers, tmp_path)
    w.incarnation_start(time=time.time(), info={"obj": object(), "nan": float("nan")})
    w.progress(
        boundaries=[(1, float("nan")), ("x", 1.0), (2, time.time())],  # type: ignore[list-item]
        data_wait_seconds=float("inf"),
        model_flops=float("nan"),
        peak_flops=-1.0,
    )
    w.hang(time=time.time(), step=2, seconds_since_step=float("nan"))
    w.close(time=time.time(), clean=True)
    records = read_ledger(tmp_path / LEDGER).records
    prog = [r for r in records if isinstance(r, Progress)]
    assert [p.steps for p in prog] == [(2,)]
    assert prog[0].model_flops == 0.0
    assert prog[0].peak_flops is None


def test_bad_options_fail_at_setup(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="file name"):
        LedgerWriter(tmp_path, run="r", file_name="../x")
    with pytest.raises(ValueError, match="run"):
        LedgerWriter(tmp_path, run="")
    with pytest.raises(ValueError, match="flush_interval"):
        LedgerWriter(tmp_path, run="r", flush_interval=0)


def test_the_docs_name_the_metric_that_counts_a_full_disk(
    tmp_path: Path, writers: list[LedgerWriter]
) -> None:
    """Issue 12.15: the README and watch()'s docstring said a full disk is counted in
    babysitter_internal_errors_total; the ledger counts it in babysitter_ledger_write_errors_total."""
    (tmp_path / LEDGER).symlink_to("/dev/full")
    w = make(writers, tmp_path)
    w.incarnation_start(time=time.time(), info={})
    wait_for(lambda: w.write_errors >= 1)
    counted = {name for (name, _), value in samples(w).items() if name.endswith("errors_total") and value}
    assert counted == {G.LEDGER_WRITE_ERRORS.name}
    # The README's paragraph moved to its longer tour, docs/guide.md, when issue 22 cut the README.
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    for where, text in (("docs/guide.md", guide), ("watch()", babysitter.watch.__doc__ or "")):
        named = re.search(r"full disk[^`]*`+(babysitter_\w+)", text.replace("\n", " "))
        assert named is not None, where
        assert named.group(1) == G.LEDGER_WRITE_ERRORS.name, where
