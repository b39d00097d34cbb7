"""The sysfs reader keeps the files it reads every scrape open, and never serves a stale value for it.

Files are read again from their start on a kept descriptor; one deleted, replaced or turned into a
directory is opened again by its path, and what that finds is what counts. Descriptors are bounded
per process, closed at the end of a scrape that did not read them, and all closed with the collector.
"""

from __future__ import annotations

import gc
import os
import socket
import tempfile
from pathlib import Path

import pytest

from babysitter.node import sysfs
from babysitter.node.fabric.fake import FakeSysfs
from babysitter.node.fabric.infiniband import InfinibandCollector
from babysitter.node.fabric.pcie import PcieCollector
from babysitter.node.host.edac import EdacCollector
from babysitter.node.host.thermal import CpuThermalCollector
from babysitter.node.sysfs import SysfsReader


def _open_under(root: Path | str) -> int:
    """Descriptors of this process open on a file under ``root`` (other tests' threads open theirs)."""
    prefix, found = os.path.realpath(root) + os.sep, 0
    for name in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{name}").startswith(prefix)
        except OSError:
            continue  # closed meanwhile
    return found


@pytest.fixture(autouse=True)
def _room(monkeypatch: pytest.MonkeyPatch) -> None:
    """Room in the process-wide budget whatever readers other tests of this process keep."""
    monkeypatch.setattr(sysfs, "KEEP_OPEN", sysfs._kept + 4096)


def test_a_kept_file_is_read_afresh_and_a_gone_one_is_not_served(tmp_path: Path) -> None:
    r = SysfsReader(tmp_path, "test")
    (tmp_path / "a").write_text("1\n")
    assert r.integer("a") == 1 and r.kept_open == 1
    with open(tmp_path / "a", "r+") as fh:  # rewritten in place, as sysfs attributes keep their inode
        fh.write("22\n")
    assert r.integer("a") == 22
    (tmp_path / "b").write_text("3\n")
    os.replace(tmp_path / "b", tmp_path / "a")  # replaced by another file
    assert r.integer("a") == 3
    (tmp_path / "a").unlink()  # deleted: the kept descriptor still reads "3", which must not count
    assert r.integer("a") is None and r.problems()["vanished"] == 1 and r.kept_open == 0
    (tmp_path / "a").mkdir()  # a directory now: unreadable
    assert r.integer("a") is None and r.problems()["unreadable"] == 1
    (tmp_path / "a").rmdir()
    (tmp_path / "a").write_text("4\n")
    assert r.integer("a") == 4 and r.kept_open == 1
    r.close()
    assert r.kept_open == 0


def test_unread_files_are_closed_at_the_scrape_end_and_the_budget_is_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in "abc":
        (tmp_path / name).write_text(f"{ord(name)}\n")
    monkeypatch.setattr(sysfs, "KEEP_OPEN", sysfs._kept + 2)
    first, second = SysfsReader(tmp_path, "one"), SysfsReader(tmp_path, "two")
    assert [first.integer("a"), second.integer("b"), second.integer("c")] == [97, 98, 99]
    assert (first.kept_open, second.kept_open) == (1, 1), "two kept in all; the third read and closed"
    assert _open_under(tmp_path) == 2
    assert second.integer("c") == 99  # read fine without a descriptor to keep
    first.release_unread()  # "a" was read since the last release: kept
    assert first.kept_open == 1
    first.release_unread()  # not read since: closed, which makes room for another
    assert first.kept_open == 0
    assert second.integer("c") == 99 and second.kept_open == 2
    unkept = SysfsReader(tmp_path, "rescans", keep_open=False)
    assert unkept.integer("a") == 97 and unkept.kept_open == 0
    first.close()
    second.close()
    assert _open_under(tmp_path) == 0
    dropped = SysfsReader(tmp_path, "never closed")
    assert dropped.integer("a") == 97 and _open_under(tmp_path) == 1
    kept = sysfs._kept
    del dropped  # a collector nobody closed: its reader gives the files back when it goes
    gc.collect()
    assert _open_under(tmp_path) == 0 and sysfs._kept == kept - 1


def test_real_sysfs_values_are_fresh_through_a_kept_descriptor() -> None:
    """On the kernel's own sysfs: loopback's byte counter, read through a kept descriptor, moves with
    the traffic sent between two reads."""
    path = "class/net/lo/statistics/rx_bytes"
    if not os.path.exists(f"/sys/{path}"):
        pytest.skip("no /sys/class/net/lo here")
    r = SysfsReader("/sys", "test")
    before = r.integer(path)
    assert before is not None and r.kept_open == 1
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            client.sendall(b"x" * 100_000)
            conn, _ = server.accept()
            got = 0
            while got < 100_000:
                got += len(conn.recv(65536))
            conn.close()
    after = r.integer(path)
    assert after is not None and after >= before + 100_000
    r.close()


def test_collectors_hold_descriptors_only_while_they_run() -> None:
    """Every hardware collector of an HGX-like host: a scrape keeps its files open, a second reads the
    same ones (no more), and close() leaves none open."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeSysfs(Path(tmp) / "sys", Path(tmp) / "proc")
        fake.dgx(8, memory_controllers=2, packages=2, cores=8)
        collectors = [
            InfinibandCollector(fake.root),
            PcieCollector(fake.root),
            EdacCollector(fake.root),
            CpuThermalCollector(fake.root),
        ]
        first = [list(c.collect()) for c in collectors]
        held = _open_under(tmp)
        assert held >= 8 * 20, "the ports' counters are kept open"
        assert [list(c.collect()) for c in collectors] == first
        assert _open_under(tmp) == held
        for c in collectors:
            c.close()
        assert _open_under(tmp) == 0


def test_integers_read_and_count_what_integer_does(tmp_path: Path) -> None:
    """The batched read gives each file's integer() and counts the same problems, through kept
    descriptors and not: good values, garbage, N/A (no PMA), a negative, a missing file, one deleted
    while kept, one turned garbage while kept and good again."""
    files = {"a": "5\n", "b": "x\n", "c": "N/A (no PMA)\n", "d": "-3\n", "e": "7\n", "f": "9\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    paths = [str(tmp_path / n) for n in ("a", "b", "c", "d", "e", "f", "missing")]
    one, batched = SysfsReader(tmp_path, "one"), SysfsReader(tmp_path, "batched")
    steps = [
        lambda: None,
        (tmp_path / "e").unlink,
        lambda: (tmp_path / "f").write_text("junk\n"),
        lambda: (tmp_path / "f").write_text("10\n"),
        lambda: (tmp_path / "e").write_text("8\n"),
    ]
    for step in steps:
        step()
        assert batched.integers(paths) == [one.integer(p) for p in paths]
        assert batched.problems() == one.problems()
        assert batched.kept_open == one.kept_open
    assert one.problems() == {
        "unreadable": 0,
        "vanished": 2,
        "garbage": 3,
        "unavailable": 1,
        "not_regular": 0,
    }
    one.close()
    batched.close()


def test_only_regular_files_are_read_and_each_other_kind_costs_its_own_value(tmp_path: Path) -> None:
    """A socket, a FIFO and a symbolic link (even to a good file) where an attribute should be: each is
    None and counted not_regular once, without blocking; a regular file next to them reads fine, and a
    FIFO that becomes a file again is read."""
    (tmp_path / "good").write_text("5\n")
    (tmp_path / "link").symlink_to(tmp_path / "good")
    os.mkfifo(tmp_path / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    r = SysfsReader(tmp_path, "test")
    try:
        for _ in range(2):
            assert [r.integer(n) for n in ("good", "link", "sock")] == [5, None, None]
            assert r.text("link", listed=False) is None
            assert r.integer("fifo") is None  # the code before blocked here, in open(), for good
        assert r.problems()["not_regular"] == 3
        (tmp_path / "fifo").unlink()
        (tmp_path / "fifo").write_text("6\n")
        assert r.integer("fifo") == 6 and r.kept_open == 2
    finally:
        server.close()
        r.close()
