"""The ledger file or the whole run directory deleted under a live writer (issue 12.7): the writer sees
that its file is gone (the open path's inode changed), starts a fresh, self-describing segment, counts
it, and the report accounts for what exists."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.catalog import goodput as G
from babysitter.cli import main
from babysitter.ledger import LedgerWriter, read_ledger, summarize
from babysitter.ledger.records import Progress, Start
from test_ledger_helpers import Book, nonzero, ramp
from test_ledger_writer import LEDGER, drive, make, samples, wait_for


@pytest.fixture
def writers() -> Iterator[list[LedgerWriter]]:
    made: list[LedgerWriter] = []
    yield made
    for w in made:
        w.close(time=time.time(), clean=True, timeout=2.0)


def _steps(path: Path) -> list[int]:
    return [s for r in read_ledger(path).records if isinstance(r, Progress) for s in r.steps]


def _run_and_delete(w: LedgerWriter, run_dir: Path, delete: str) -> float:
    """Steps 1..10 (1 s each after a 5 s startup), the file or directory deleted, steps 11..20."""
    path = run_dir / LEDGER
    t0 = time.time() - 40
    w.incarnation_start(time=t0, info={"world_size": 8})
    w.checkpoint_begin(kind="save", step=5, time=t0 + 10.2, path="/ck/5")
    w.checkpoint_end(kind="save", step=5, time=t0 + 10.4, ok=True, nbytes=1, path="/ck/5")
    drive(w, t0 + 5, 1, 10, dt=1.0)
    w.flush()
    wait_for(lambda: _steps(path)[-1:] == [10])
    if delete == "file":
        path.unlink()
    else:
        shutil.rmtree(run_dir)
    end = drive(w, t0 + 15, 11, 10, dt=1.0, wait=0.1)  # waits: lines in their "dd" form
    w.flush()
    wait_for(lambda: path.exists() and _steps(path)[-1:] == [20])
    return end


@pytest.mark.parametrize("delete", ["file", "run_dir"])
def test_deleted_ledger_continues_in_a_new_segment_that_the_report_uses(
    tmp_path: Path, writers: list[LedgerWriter], delete: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    w = make(writers, run_dir)
    end = _run_and_delete(w, run_dir, delete)
    got = samples(w, now=end)
    assert got[(G.LEDGER_WRITE_ERRORS.name, "file_lost")] == 1
    closed = time.time() + 1
    w.close(time=closed, clean=True)
    records = read_ledger(run_dir / LEDGER).records
    first = records[0]
    assert isinstance(first, Start)
    assert first.segment == 1  # a continuation of the incarnation, not a restart
    assert first.info["world_size"] == 8
    assert first.last_step == 10  # the last boundary the lost file held
    assert first.last_end == round((end - 10) * 1e6)
    summary = summarize(run_dir)
    assert summary.state == "ended"
    acc = summary.totals
    assert acc.restarts == 0
    assert acc.productive_us + sum(acc.badput_us.values()) == acc.wall_us
    # What the new file holds: steps 11..20 (step 11 measured from step 10's end, carried over), each
    # 1 s with 0.1 s of data wait, and the time after the last step until the clean end.
    assert acc.productive_seconds == pytest.approx(9.0)
    assert acc.badput_seconds["data_stall"] == pytest.approx(1.0)
    assert acc.badput_seconds["startup"] == 0
    assert acc.badput_seconds["other"] == pytest.approx(closed - end, abs=1e-5)
    inc = summary.incarnations[0]
    assert (inc.first_step, inc.last_step, inc.steps) == (11, 20, 10)
    assert inc.resumed_from == 0
    assert summary.partial  # the report says the file does not start at the run's start
    assert main(["report", str(run_dir)]) == 0
    assert "starts in the middle of the run" in capsys.readouterr().out


def test_the_lock_comes_back_with_the_run_directory(tmp_path: Path, writers: list[LedgerWriter]) -> None:
    """The run directory went with the lock in it: the writer takes a fresh lock, so a second writer
    is still kept out."""
    run_dir = tmp_path / "run"
    w = make(writers, run_dir, heartbeat_interval=0.1, stale_after=0.5)
    _run_and_delete(w, run_dir, "run_dir")
    wait_for((run_dir / (LEDGER + ".lock")).exists)
    other = LedgerWriter(run_dir, run="r", flush_interval=0.02, heartbeat_interval=0.1, stale_after=0.5)
    try:
        time.sleep(0.3)
        assert samples(other)[(G.LEDGER_WRITER_STATE.name, "waiting")] == 1
    finally:
        other.close(time=time.time(), clean=False)


def test_a_file_replaced_by_an_older_copy_keeps_the_copy_and_counts_the_missing_steps() -> None:
    """The copy holds steps 1..5 of the incarnation; the continuation says step 9 ended at 12 s. The
    stretch in between is one long step standing for steps 6..9 (productive: nothing resumed before it),
    and the count stays exact."""
    book = Book().start(0).steps(1, ramp(1, 5)).segment(14, last_step=9, last_end=12).steps(10, ramp(13, 3))
    book.end(16)
    acc = book.account()
    assert nonzero(acc) == {"startup": 1.0, "other": 1.0, "productive": 14.0}
    inc = book.timeline().incarnations[0]
    assert inc.step_count == 12
    assert inc.segments == 1
    assert acc.restarts == 0


def test_a_continuation_at_the_head_of_a_file_starts_at_its_carried_boundary() -> None:
    book = Book().start(0).steps(1, ramp(5, 20)).segment(30, last_step=20, last_end=24)
    book.steps(21, ramp(26, 4)).end(31)
    del book.records[:2], book.tags[:2]  # the file lost the start and the first steps
    acc = book.account()
    assert nonzero(acc) == {"other": 2.0, "productive": 5.0}  # step 21 from 24 s to 26 s, 22..24
    inc = book.timeline().incarnations[0]
    assert inc.continued
    assert inc.resume_step() == 0
