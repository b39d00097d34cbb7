"""The checkpoint sentinel against real ledger files: deleted, truncated and rotated checkpoints, bad ledgers."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.catalog import storage as S
from babysitter.ledger import DEFAULT_FILE_NAME, CheckpointRecord, completed_checkpoints
from babysitter.ledger.records import CheckpointEnd, Start, encode, to_us
from babysitter.ledger.writer import LedgerWriter
from babysitter.node.storage.runcheck import OutOfTime
from babysitter.node.storage.sentinel import CheckpointSentinelCollector, LedgerTail, directory_size
from node_helpers import Scrape, scrape

MISSING = S.CHECKPOINT_MISSING.name
NEWEST_MISSING = S.CHECKPOINT_MISSING_STEP.name
AGE = S.CHECKPOINT_NEWEST_VERIFIED_AGE.name
LEDGER_UP = S.CHECKPOINT_LEDGER_UP.name
T0 = 1_780_000_000.0
NOW = T0 + 10_000.0


def write_ledger(run_dir: Path, run: str, saves: list[tuple[int, float, int | None, str | None]]) -> None:
    """A ledger as the tracker writes it: a start record, then one checkpoint end per save."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [encode(Start(t=to_us(T0), pst=to_us(T0), id="abc", host="node1", pid=1, run=run))]
    for step, t, nbytes, path in saves:
        lines.append(
            encode(CheckpointEnd(t=to_us(t), op="save", step=step, ok=True, nbytes=nbytes, path=path))
        )
    lines.append(encode(CheckpointEnd(t=to_us(T0 + 9000), op="save", step=999, ok=False, nbytes=1, path="x")))
    (run_dir / DEFAULT_FILE_NAME).write_bytes(b"".join(lines))


def file_checkpoint(run_dir: Path, step: int, size: int) -> tuple[int, float, int, str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"step-{step}.pt"
    path.write_bytes(b"\x01" * size)
    return (step, T0 + step, size, str(path))


def missing(s: Scrape, run: str | None = None) -> tuple[float, float | None]:
    """(how many checked checkpoints are missing, the newest missing step or None) of one run."""
    labels = {"run": run} if run is not None else {}
    newest = s.find(NEWEST_MISSING, **labels)
    return s.value(MISSING, **labels), (newest[0] if newest else None)


def checked(c: CheckpointSentinelCollector) -> dict[int, bool | None]:
    """Step -> missing verdict of every checkpoint of the first run the sentinel looked at."""
    return {check.step: check.missing for check in c.check_now()[0].checks}


@pytest.fixture(name="make")
def _make() -> Iterator[object]:
    made: list[CheckpointSentinelCollector] = []

    def make(run_dirs: list[Path], **kwargs: object) -> CheckpointSentinelCollector:
        kwargs.setdefault("refresh_seconds", 0.0)
        kwargs.setdefault("wait_seconds", 10.0)
        kwargs.setdefault("clock", lambda: NOW)
        collector = CheckpointSentinelCollector(run_dirs, **kwargs)  # type: ignore[arg-type]
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.close()


@pytest.fixture(name="run_dir")
def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "llama-7b-try3"
    run_dir.mkdir(parents=True)
    return run_dir


class TestFiles:
    def test_last_k_verified_and_age_of_newest(self, run_dir: Path, make) -> None:
        saves = [file_checkpoint(run_dir, step, 1000 + step) for step in (100, 200, 300, 400)]
        write_ledger(run_dir, "llama-7b", saves)
        c = make([run_dir], keep_last=3)
        s = scrape(c)
        assert missing(s, "llama-7b") == (0, None)
        # Not 100 (older than the last 3), not 999 (a failed save is not a checkpoint).
        assert checked(c) == {200: False, 300: False, 400: False}
        assert s.value(AGE, run="llama-7b") == NOW - (T0 + 400)
        assert s.value(LEDGER_UP, run="llama-7b") == 1

    def test_two_series_per_run_whatever_keep_last(self, run_dir: Path, make) -> None:
        """Ten checkpoints checked, three gone: one count (3) and one newest missing step, not a series
        per step (the host's series budget)."""
        saves = [file_checkpoint(run_dir, step, 8) for step in range(10, 110, 10)]
        write_ledger(run_dir, "r", saves)
        for step in (30, 70, 50):
            (run_dir / f"step-{step}.pt").unlink()
        s = scrape(make([run_dir], keep_last=10))
        assert len(s.find(MISSING)) == 1 and len(s.find(NEWEST_MISSING)) == 1
        assert missing(s, "r") == (3, 70)

    def test_deleted_checkpoint_flagged_at_the_next_scrape_once_logged(
        self, run_dir: Path, make, caplog
    ) -> None:
        saves = [file_checkpoint(run_dir, step, 4096) for step in (100, 200, 300)]
        write_ledger(run_dir, "llama-7b", saves)
        c = make([run_dir])
        assert missing(scrape(c)) == (0, None)
        (run_dir / "step-200.pt").unlink()
        with caplog.at_level(logging.INFO, logger="babysitter.node.storage.sentinel"):
            for _ in range(3):
                s = scrape(c)
        assert missing(s, "llama-7b") == (1, 200)
        assert s.value(AGE, run="llama-7b") == NOW - (T0 + 300)
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert "step 200" in lines[0]
        assert "does not exist" in lines[0]

    def test_newest_deleted_age_falls_back_to_the_newest_that_exists(self, run_dir: Path, make) -> None:
        saves = [file_checkpoint(run_dir, step, 10) for step in (100, 200, 300)]
        write_ledger(run_dir, "r", saves)
        (run_dir / "step-300.pt").unlink()
        s = scrape(make([run_dir]))
        assert missing(s) == (1, 300)
        assert s.value(AGE, run="r") == NOW - (T0 + 200)

    def test_truncated_is_missing_grown_is_fine(self, run_dir: Path, make) -> None:
        saves = [file_checkpoint(run_dir, step, 1000) for step in (1, 2)]
        write_ledger(run_dir, "r", saves)
        (run_dir / "step-1.pt").write_bytes(b"\x01" * 999)
        (run_dir / "step-2.pt").write_bytes(b"\x01" * 1001)
        c = make([run_dir])
        assert missing(scrape(c)) == (1, 1)
        assert checked(c) == {1: True, 2: False}

    def test_relative_paths_unknown_size_urls_and_no_path(self, run_dir: Path, make, caplog) -> None:
        (run_dir / "ckpt").mkdir()
        (run_dir / "ckpt" / "a.pt").write_bytes(b"x" * 10)
        (run_dir / "ckpt" / "b.pt").write_bytes(b"x" * 10)
        write_ledger(
            run_dir,
            "r",
            [
                (1, T0 + 1, 10, "ckpt/a.pt"),  # relative to the run directory
                (2, T0 + 2, None, "ckpt/b.pt"),  # no size: existence only
                (3, T0 + 3, 10, "s3://bucket/run/step-3"),
                (4, T0 + 4, 10, None),
            ],
        )
        with caplog.at_level(logging.WARNING, logger="babysitter.node.storage.sentinel"):
            c = make([run_dir], keep_last=4)
            s = scrape(c)
        assert missing(s) == (0, None)
        assert checked(c) == {1: False, 2: False, 3: None, 4: None}
        assert s.value(AGE, run="r") == NOW - (T0 + 2)
        messages = " | ".join(r.getMessage() for r in caplog.records)
        assert "a URL" in messages
        assert "no path" in messages

    def test_step_saved_again_after_restart_is_one_series_with_the_newest_record(
        self, run_dir: Path, make
    ) -> None:
        old = run_dir / "old.pt"
        new = run_dir / "new.pt"
        new.write_bytes(b"x" * 5)
        write_ledger(run_dir, "r", [(500, T0 + 1, 5, str(old)), (500, T0 + 2, 5, str(new))])
        c = make([run_dir])
        assert missing(scrape(c)) == (0, None)
        assert checked(c) == {500: False}


class TestDirectories:
    def test_sharded_checkpoint_directory(self, run_dir: Path, make) -> None:
        ckpt = run_dir / "global_step_1000"
        (ckpt / "shards").mkdir(parents=True)
        for rank in range(4):
            (ckpt / "shards" / f"rank{rank}.distcp").write_bytes(b"\x00" * 250)
        (ckpt / "latest").symlink_to(ckpt / "shards" / "rank0.distcp")  # not counted twice
        assert directory_size(ckpt) == 1000
        write_ledger(run_dir, "r", [(1000, T0 + 1000, 1000, str(ckpt))])
        c = make([run_dir], walk_seconds=0.0)
        assert missing(scrape(c)) == (0, None)
        (ckpt / "eval_results.json").write_text("{}")  # added after the save: fine
        assert missing(scrape(c)) == (0, None)
        (ckpt / "shards" / "rank3.distcp").unlink()  # a shard lost
        assert missing(scrape(c)) == (1, 1000)
        shutil.rmtree(ckpt)
        assert missing(scrape(c)) == (1, 1000)

    def test_a_walk_stops_at_its_deadline_and_empty_directories_count(self, tmp_path: Path) -> None:
        tree = tmp_path / "tree"
        for k in range(10):
            (tree / f"d{k}" / "e").mkdir(parents=True)
        with pytest.raises(OutOfTime):
            directory_size(tree, deadline=0.0)
        assert directory_size(tree) == 0
        assert directory_size(tree, limit=15) is None  # 20 directories and not a file among them

    def test_directory_walks_are_cached_but_a_deleted_directory_is_seen_at_once(
        self, run_dir: Path, make
    ) -> None:
        ckpt = run_dir / "global_step_5"
        (ckpt / "shards").mkdir(parents=True)
        for rank in range(4):
            (ckpt / "shards" / f"rank{rank}.distcp").write_bytes(b"\x00" * 10)
        write_ledger(run_dir, "r", [(5, T0 + 5, 40, str(ckpt))])
        c = make([run_dir], walk_seconds=3600.0)
        for _ in range(3):
            assert missing(scrape(c)) == (0, None)
        assert c.walks == 1  # the run's worker walked it once (its size cache lives there)
        (ckpt / "shards" / "rank3.distcp").unlink()  # deep inside: seen at the next walk, not now
        assert missing(scrape(c)) == (0, None)
        shutil.rmtree(ckpt)  # the whole checkpoint: seen at once
        assert missing(scrape(c)) == (1, 5)


class TestLedgerTail:
    def test_same_answer_as_completed_checkpoints_while_the_ledger_grows(self, run_dir: Path) -> None:
        ledger = run_dir / DEFAULT_FILE_NAME
        tail = LedgerTail(ledger)
        with pytest.raises(FileNotFoundError):
            tail.read()
        write_ledger(run_dir, "r", [(1, T0 + 1, 10, "a"), (2, T0 + 2, 20, "b")])
        assert tail.read() == completed_checkpoints(run_dir)
        with ledger.open("ab") as fh:  # a torn write: half a line, then the rest
            line = encode(CheckpointEnd(t=to_us(T0 + 3), op="save", step=3, ok=True, nbytes=30, path="c"))
            fh.write(line[:20])
        assert tail.read() == completed_checkpoints(run_dir)
        assert [r.step for r in tail.read()] == [1, 2]
        with ledger.open("ab") as fh:
            fh.write(line[20:])
            fh.write(b'{"v":1,"k":"cke", not json\n')  # a torn line a later writer terminated
            fh.write(encode(CheckpointEnd(t=to_us(T0 + 4), op="load", step=3, ok=True, nbytes=30, path="c")))
        assert tail.read() == completed_checkpoints(run_dir)
        assert [r.step for r in tail.read()] == [1, 2, 3]

    def test_replaced_ledger_is_read_from_the_start(self, run_dir: Path) -> None:
        write_ledger(run_dir, "r", [(1, T0 + 1, 10, "a"), (2, T0 + 2, 20, "b")])
        tail = LedgerTail(run_dir / DEFAULT_FILE_NAME)
        assert len(tail.read()) == 2
        write_ledger(run_dir, "r", [(7, T0 + 7, 70, "z")])  # rewritten in place: shorter
        assert tail.read() == completed_checkpoints(run_dir)
        assert [r.step for r in tail.read()] == [7]
        # rewritten in place and grown past where we were: the bytes before our offset differ
        write_ledger(run_dir, "r2", [(s, T0 + s, s, f"p{s}") for s in (8, 9, 10, 11)])
        assert [r.step for r in tail.read()] == [8, 9, 10, 11]
        assert tail.read() == completed_checkpoints(run_dir)

    def test_a_ledger_larger_than_a_passs_time_is_read_across_passes(self, run_dir: Path) -> None:
        """Past its deadline the tail stops after a chunk and the next call goes on from there: a huge
        ledger is caught up with over several passes instead of being read from zero by every worker the
        time budget kills."""
        write_ledger(run_dir, "r", [(1, T0 + 1, 10, "a")])
        filler = b'{"v":1,"k":"step","t":1,"pad":"' + b"x" * 1000 + b'"}\n'
        with (run_dir / DEFAULT_FILE_NAME).open("ab") as fh:
            fh.write(filler * (17 << 10))  # more than one 16 MiB chunk
            fh.write(encode(CheckpointEnd(t=to_us(T0 + 2), op="save", step=2, ok=True, nbytes=20, path="b")))
        tail = LedgerTail(run_dir / DEFAULT_FILE_NAME)
        with pytest.raises(OutOfTime):
            tail.saves(deadline=0.0)
        assert [r.step for r in tail.read()] == [1, 2]
        assert tail.read() == completed_checkpoints(run_dir)


class TestLedgers:
    def test_unreadable_ledger_reported_other_runs_still_checked(self, tmp_path: Path, make, caplog) -> None:
        bad, good = tmp_path / "bad", tmp_path / "good"
        (bad / DEFAULT_FILE_NAME).mkdir(parents=True)  # read_bytes() fails: IsADirectoryError
        write_ledger(good, "good-run", [file_checkpoint(good, 1, 8)])
        with caplog.at_level(logging.WARNING, logger="babysitter.node.storage.sentinel"):
            c = make([bad, good])
            scrape(c)
            s = scrape(c)
        assert s.value(LEDGER_UP, run="bad") == 0
        assert s.value(LEDGER_UP, run="good-run") == 1
        assert missing(s, "good-run") == (0, None)
        assert [r.getMessage() for r in caplog.records if "cannot read the ledger" in r.getMessage()] != []
        assert len(caplog.records) == 1

    def test_no_ledger_in_directory(self, tmp_path: Path, make) -> None:
        s = scrape(make([tmp_path / "typo"]))
        assert s.value(LEDGER_UP, run="typo") == 0

    def test_two_directories_with_one_run_name_stay_apart(self, tmp_path: Path, make) -> None:
        a, b = tmp_path / "a", tmp_path / "b"
        write_ledger(a, "same", [file_checkpoint(a, 1, 8)])
        write_ledger(b, "same", [file_checkpoint(b, 1, 8)])
        s = scrape(make([a, b]))
        assert s.value(LEDGER_UP, run="same") == 1
        assert s.value(LEDGER_UP, run=str(b)) == 1

    def test_written_by_the_real_ledger_writer(self, run_dir: Path, make) -> None:
        writer = LedgerWriter(run_dir, run="writer-run", flush_interval=0.05)
        writer.incarnation_start(time=T0, info={})
        for step in (10, 20):
            _, t, size, path = file_checkpoint(run_dir, step, 64)
            writer.checkpoint_begin(kind="save", step=step, time=t - 0.5, path=path)
            writer.checkpoint_end(kind="save", step=step, time=t, ok=True, nbytes=size, path=path)
        writer.close(time=T0 + 30, clean=True)
        (run_dir / "step-10.pt").unlink()
        s = scrape(make([run_dir]))
        assert missing(s, "writer-run") == (1, 10)


def test_hung_storage_does_not_hang_the_scrape(run_dir: Path, make, tmp_path: Path) -> None:
    """A hung mount cannot be made here; a ledger reader that blocks stands in for one. It runs in the
    run's worker process, so it counts its calls in a file and blocks while another file exists."""
    calls, hang = tmp_path / "calls", tmp_path / "hang"

    def read(path: Path) -> list[CheckpointRecord]:
        with calls.open("a") as fh:
            fh.write(f"{path}\n")
        deadline = time.monotonic() + 30
        while hang.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return [CheckpointRecord(step=1, path=None, nbytes=None, time=T0)]

    c = make([run_dir], read_ledger=read, run_timeout=20.0)
    assert scrape(c).value(LEDGER_UP, run="llama-7b-try3") == 1  # the first pass, waited for
    # From now on a scrape waits 0.2 s for a pass (set after the first: forking the worker and its
    # first pass took longer than that on a loaded CI machine, and that scrape had nothing to serve).
    c._wait = 0.2
    hang.touch()
    started = time.monotonic()
    s = scrape(c)  # the second check hangs: served from the first
    assert time.monotonic() - started < 5
    assert s.value(LEDGER_UP, run="llama-7b-try3") == 1
    scrape(c)  # still hung: no second pass piles up
    assert calls.read_text().splitlines() == [str(run_dir)] * 2
    hang.unlink()


@pytest.mark.parametrize(
    "kwargs",
    [{"keep_last": 0}, {"refresh_seconds": -1.0}, {"run_timeout": 0.0}, {"run_memory": 1 << 20}],
)
def test_bad_configuration_fails_at_setup(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        CheckpointSentinelCollector([tmp_path], **kwargs)
    with pytest.raises(ValueError, match="at least one"):
        CheckpointSentinelCollector([])
