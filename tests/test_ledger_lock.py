"""The ledger's writer lock: one writer at a time, atomic takeover of a dead lock, no leaked files."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from babysitter.catalog import goodput as G
from babysitter.ledger import LedgerWriter, completed_checkpoints, read_ledger, summarize
from babysitter.ledger.lock import LedgerLockedError, WriterLock, read_lock
from babysitter.ledger.records import Progress, Start
from test_ledger_helpers import Book, ramp
from test_ledger_writer import wait_for

LEDGER = "babysitter-ledger.jsonl"


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def _dead_lock(path: Path, pid: int) -> None:
    info = {
        "v": 1,
        "host": socket.gethostname(),
        "pid": pid,
        "pst": time.time() - 5,
        "token": "dead",
        "heartbeat": time.time(),
        "run": "r",
    }
    path.write_text(json.dumps(info))


def test_racing_takeovers_of_a_dead_lock_leave_exactly_one_owner(tmp_path: Path) -> None:
    """Four writers find the same dead lock at the same instant, 40 times: one wins each time."""
    pid = _dead_pid()
    path = tmp_path / "ledger.lock"
    doubles = []
    for trial in range(40):
        _dead_lock(path, pid)
        locks = [WriterLock(path, run="r", stale_after=60.0) for _ in range(4)]
        barrier = threading.Barrier(len(locks))

        def take(lock: WriterLock, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            with contextlib.suppress(LedgerLockedError):
                lock.acquire()

        threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        owners = [lock.token for lock in locks if lock.held]
        owner = read_lock(path)
        if owner is None or owners != [owner.token]:
            doubles.append(trial)
        for lock in locks:
            lock.release()
    assert doubles == [], f"{len(doubles)} of 40 trials did not end with exactly one owner"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temp or grave files left behind


def test_a_racer_with_an_old_reading_spares_a_fresh_lock_on_the_same_inode(tmp_path: Path) -> None:
    """The interleaving behind 1 of 40 racing trials ending with two owners in a CI run: racer B reads
    the dead lock, another racer removes it, racer D's new lock gets the inode number just freed
    (ext4 and tmpfs reuse it at once), and B, holding the breaker with its old reading, must not take
    D's lock for the dead one."""
    path = tmp_path / "ledger.lock"
    _dead_lock(path, _dead_pid())
    late = WriterLock(path, run="r", stale_after=60.0)
    stale = read_lock(path)
    assert stale is not None and stale.token == "dead"  # noqa: S105 - not a password
    os.unlink(path)  # the first breaker's removal
    fresh = WriterLock(path, run="r", stale_after=60.0)
    fresh.acquire()
    now = read_lock(path)
    assert now is not None and now.token == fresh.token
    if now.ident != stale.ident:
        pytest.skip("this file system did not hand the freed inode number to the next file")
    tmp = late._write_temp()
    try:
        late._break(tmp, stale)  # what acquire() does with its old reading once it has the breaker
    finally:
        os.unlink(tmp)
    after = read_lock(path)
    assert after is not None and after.token == fresh.token
    assert fresh.refresh() == "ok"
    with pytest.raises(LedgerLockedError):
        late.acquire()
    fresh.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_heartbeat_on_a_reused_inode_knows_the_lock_is_lost(tmp_path: Path) -> None:
    """Our lock removed (a takeover from another host) and a new writer's lock on the same inode
    number: the heartbeat must report it lost, not touch the other writer's lock."""
    path = tmp_path / "ledger.lock"
    mine = WriterLock(path, run="r", stale_after=60.0)
    mine.acquire()
    os.unlink(path)
    other = WriterLock(path, run="r", stale_after=60.0)
    other.acquire()
    info = read_lock(path)
    assert info is not None
    if info.ident != mine.ident:
        pytest.skip("this file system did not hand the freed inode number to the next file")
    assert mine.refresh() == "lost"
    assert not mine.held
    mine.release()
    assert read_lock(path) is not None and read_lock(path).token == other.token  # type: ignore[union-attr]
    other.release()


def test_a_full_disk_leaks_no_lock_temp_files(tmp_path: Path) -> None:
    """Writes that fail (here: RLIMIT_FSIZE 0, the kernel refuses every byte, as on a full disk) must
    not leave one temp file per heartbeat behind."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = f"""
import resource, signal, time
from pathlib import Path
from babysitter.ledger import LedgerWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
w = LedgerWriter(Path({str(run_dir)!r}), run="r", flush_interval=0.02, heartbeat_interval=0.05,
                 stale_after=1.0)
w.incarnation_start(time=time.time(), info={{}})
time.sleep(1.0)
assert w.write_errors >= 5, w.write_errors
w.close(time=time.time(), clean=True)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    left = sorted(p.name for p in run_dir.iterdir() if p.name.endswith(".lock") is False)
    assert [name for name in left if ".lock." in name] == []


def _other_host_lock(path: Path, *, age: float = 0.0) -> None:
    """The lock a writer on another host left: its heartbeat ``age`` seconds ago."""
    info = {
        "v": 1,
        "host": "other-host",
        "pid": 1,
        "pst": 0.0,
        "token": "t",
        "heartbeat": time.time() - age,
        "run": "r",
    }
    path.write_text(json.dumps(info))
    os.utime(path, (time.time() - age, time.time() - age))


def _state(writer: LedgerWriter) -> str:
    states = [
        s.labels["state"]
        for family in writer.metrics(["run"], ["r"], time.time())
        for s in family.samples
        if s.name == G.LEDGER_WRITER_STATE.name and s.value == 1
    ]
    assert len(states) == 1, states
    return states[0]


def test_a_restart_on_another_host_waits_for_the_dead_hosts_lock_and_then_writes_everything(
    tmp_path: Path,
) -> None:
    """The crashed host's lock is younger than ``stale_after``: the new writer neither raises nor gives
    up; it keeps the records, says it is waiting, and takes over once the lock is provably stale."""
    lock = tmp_path / (LEDGER + ".lock")
    _other_host_lock(lock)
    w = LedgerWriter(tmp_path, run="r", flush_interval=0.02, heartbeat_interval=0.1, stale_after=1.5)
    try:
        assert w.wait_loaded(10)
        t0 = time.time()
        w.incarnation_start(time=t0, info={})
        for k in range(20):
            w.progress(
                boundaries=[(k + 1, t0 + 0.01 * k)], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None
            )
        time.sleep(0.3)
        assert _state(w) == "waiting"
        assert not (tmp_path / LEDGER).exists()
        wait_for(lambda: _state(w) == "writing", timeout=10)
        wait_for(lambda: (tmp_path / LEDGER).exists() and len(read_ledger(tmp_path / LEDGER).records) >= 2)
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    finally:
        w.close(time=time.time(), clean=True)
    records = read_ledger(tmp_path / LEDGER).records
    assert isinstance(records[0], Start)
    assert [s for r in records if isinstance(r, Progress) for s in r.steps] == list(range(1, 21))


def test_a_writer_whose_lock_was_taken_over_stops_writing_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer A (on "host-a", heartbeat every 30 s) is judged dead by writer B (stale after 0.5 s): from
    B's takeover on, none of A's records may land in B's incarnation."""
    with monkeypatch.context() as m:
        m.setattr(socket, "gethostname", lambda: "host-a")
        a = LedgerWriter(tmp_path, run="r", flush_interval=0.02, heartbeat_interval=30.0, stale_after=90.0)
        assert a.wait_loaded(10)
        a.incarnation_start(time=time.time(), info={})
    b: LedgerWriter | None = None
    try:
        t = time.time()
        for k in range(1, 6):
            a.progress(
                boundaries=[(k, t + k * 0.01)], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None
            )
        wait_for(lambda: len(read_ledger(tmp_path / LEDGER).records) >= 2)
        time.sleep(0.6)  # A's lock is now older than B's stale_after
        b = LedgerWriter(tmp_path, run="r", flush_interval=0.02, heartbeat_interval=0.1, stale_after=0.5)
        assert b.wait_loaded(10)
        b.incarnation_start(time=time.time(), info={})
        wait_for(lambda: _state(b) == "writing")  # type: ignore[arg-type]
        for k in range(6, 30):
            now = time.time()
            a.progress(boundaries=[(1000 + k, now)], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None)
            b.progress(boundaries=[(k, now)], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None)
            time.sleep(0.01)
        wait_for(lambda: _state(a) == "fenced")
    finally:
        a.close(time=time.time(), clean=True)
        if b is not None:
            b.close(time=time.time(), clean=True)
    summary = summarize(tmp_path)
    incs = summary.timeline.incarnations
    assert len(incs) == 2
    assert list(incs[1].steps) == list(range(6, 30))
    assert all(s < 1000 for s in incs[0].steps)


def test_a_fenced_writers_lines_after_the_takeover_are_dropped_by_readers(tmp_path: Path) -> None:
    """The race a check before each write cannot close (a writer paused between its check and its
    write): every line carries its writer's tag, and a line of an earlier writer after a later
    writer's start is dropped and counted."""
    book = Book().start(0).steps(1, ramp(1, 5)).start(10).load(10.5, 11, 5)
    book.steps(6, ramp(12, 3))
    book.as_writer(1).steps(6, ramp(12.5, 4)).save(17, 18, 9).as_writer(2)
    book.steps(9, ramp(15, 2)).end(20)
    book.write(tmp_path / LEDGER)
    summary = summarize(tmp_path)
    assert summary.fenced_lines == 3
    incs = summary.timeline.incarnations
    assert list(incs[1].steps) == [6, 7, 8, 9, 10]
    assert summary.checkpoints_ok == 0  # the fenced writer's save is not the run's
    assert completed_checkpoints(tmp_path) == []
    assert summary.to_json()["skipped_lines"] == {"torn": 0, "invalid": 0, "fenced": 3}
