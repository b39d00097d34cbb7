"""The registration directory is shared by every user of a host: hostile entries are refused.

Layout: <dir> (1777, like /tmp) / <uid> (0755, that user's) / <pid>-<port>.json (0644). Tests that
need a second user run code as nobody (uid 65534), and skip, saying why, where that is impossible.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter import registration
from unpriv import NOBODY, public_tmp, run_as_nobody


@pytest.fixture(name="public_tmp")
def _public_tmp() -> Iterator[Path]:
    yield from public_tmp()


def _endpoint(
    url: str = "http://127.0.0.1:9450/metrics", run: str = "run", rank: int = 0
) -> registration.Endpoint:
    pid = os.getpid()
    return registration.Endpoint(pid, registration.process_start_time(pid), url, run, rank, 0)


def _scan(directory: Path, **kwargs: object) -> tuple[list[registration.Registered], dict[str, int]]:
    scanner = registration.Scanner(directory, **kwargs)  # type: ignore[arg-type]
    found = scanner.scan()
    return found, scanner.skipped()


def test_live_endpoint_round_trips(tmp_path: Path) -> None:
    """What a tracker registers is what the agent lists, in <dir>/<uid>/, with the owner's uid."""
    path = registration.register(tmp_path / "reg", _endpoint())
    assert path.parent == tmp_path / "reg" / str(os.geteuid())
    assert path.stat().st_mode & 0o777 == 0o644
    assert path.parent.stat().st_mode & 0o777 == 0o755
    assert stat.S_IMODE((tmp_path / "reg").stat().st_mode) == 0o1777
    assert registration.list_endpoints(tmp_path / "reg") == [_endpoint()]
    found, skipped = _scan(tmp_path / "reg")
    assert [(r.endpoint, r.owner_uid, r.path) for r in found] == [(_endpoint(), os.geteuid(), path)]
    assert skipped == {}


def test_fifo_symlink_and_foreign_urls_are_skipped_without_blocking(tmp_path: Path) -> None:
    """A FIFO (which would block a plain open), a link to another file and a non-loopback URL are
    skipped; the one good registration is still found."""
    own = registration.register(tmp_path, _endpoint()).parent
    os.mkfifo(own / "1-1.json")
    secret = tmp_path.parent / "secret.json"
    secret.write_text(json.dumps({"schema": 1, **_endpoint("http://127.0.0.1:1/metrics").__dict__}))
    (own / "2-2.json").symlink_to(secret)
    foreign = {"schema": 1, **_endpoint("http://10.0.0.1:9450/metrics").__dict__}
    (own / "3-3.json").write_text(json.dumps(foreign))
    result: list[tuple[list[registration.Registered], dict[str, int]]] = []
    worker = threading.Thread(target=lambda: result.append(_scan(tmp_path)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "listing blocked on the FIFO"
    found, skipped = result[0]
    assert [r.endpoint for r in found] == [_endpoint()]
    assert skipped == {"not_regular": 2, "forbidden_target": 1}


def test_configured_network_is_allowed(tmp_path: Path) -> None:
    """A pod-network endpoint is served only when its network is configured."""
    registration.register(tmp_path, _endpoint("http://10.1.2.3:9450/metrics"))
    assert _scan(tmp_path)[1] == {"forbidden_target": 1}
    found, skipped = _scan(tmp_path, networks=[ipaddress.ip_network("10.0.0.0/8")])
    assert len(found) == 1
    assert skipped == {}


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1/metrics", "explicit port"),
        ("http://127.1:80/metrics", "not an IP address"),
        ("http://evil.example:80/metrics", "not an IP address"),
        ("http://127.0.0.1:80/metrics?x=1", "query"),
        ("http://u:p@127.0.0.1:80/metrics", "user info"),
        ("ftp://127.0.0.1:80/metrics", "scheme"),
        ("http://127.0.0.1:99999/metrics", "port"),
        ("http://127.0.0.1:80/met rics", "path"),
    ],
)
def test_registration_urls_are_strict(url: str, problem: str) -> None:
    """A URL is a literal address (or localhost) with an explicit port and a plain path, nothing else."""
    with pytest.raises(ValueError, match=problem):
        registration.parse_target(url)


def test_localhost_and_mapped_addresses_are_what_is_checked() -> None:
    """localhost means 127.0.0.1 without any lookup; an IPv4-mapped IPv6 address is checked as IPv4."""
    assert str(registration.parse_target("http://localhost:80/metrics").address) == "127.0.0.1"
    mapped = registration.parse_target("http://[::ffff:10.0.0.1]:80/metrics").address
    assert str(mapped) == "10.0.0.1"
    assert not mapped.is_loopback


def test_dead_process_registrations_are_pruned(tmp_path: Path) -> None:
    """A registration whose process is gone (or whose pid was reused) is dropped and, with prune, deleted."""
    stale = registration.Endpoint(os.getpid(), 1.0, "http://127.0.0.1:9/metrics", "old", 0, 0)
    path = registration.register(tmp_path, stale)
    assert registration.list_endpoints(tmp_path, prune=True) == []
    assert not path.exists()


def test_tracker_removes_its_own_users_dead_registrations(tmp_path: Path) -> None:
    """An agent that may not delete (a dynamic user) relies on the user's next tracker to clean up."""
    stale = registration.register(
        tmp_path, registration.Endpoint(os.getpid(), 1.0, "http://127.0.0.1:9/metrics", "old", 0, 0)
    )
    registration.register(tmp_path, _endpoint())
    assert not stale.exists()


def test_limits_per_user_and_in_all(tmp_path: Path) -> None:
    """At most max_per_user registrations of one user, and max_endpoints in all, are served."""
    for port in (9001, 9002, 9003):
        registration.register(tmp_path, _endpoint(f"http://127.0.0.1:{port}/metrics", rank=port))
    found, skipped = _scan(tmp_path, max_per_user=2)
    assert len(found) == 2
    assert skipped == {"too_many": 1}
    found, skipped = _scan(tmp_path, max_endpoints=1)
    assert len(found) == 1
    assert skipped == {"too_many": 2}


def test_same_run_and_rank_twice_keeps_the_earlier_process(tmp_path: Path) -> None:
    """Two live processes of one user claiming the same run and rank: the one started first is served."""
    registration.register(tmp_path, _endpoint("http://127.0.0.1:9001/metrics"))
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        registration.register(
            tmp_path,
            registration.Endpoint(
                later.pid,
                registration.process_start_time(later.pid),
                "http://127.0.0.1:9002/metrics",
                "run",
                0,
                0,
            ),
        )
        found, skipped = _scan(tmp_path)
    finally:
        later.kill()
        later.wait()
    assert [r.endpoint.pid for r in found] == [os.getpid()]
    assert skipped == {"conflict": 1}


def test_symlinked_directory_is_refused(tmp_path: Path) -> None:
    """A registration directory that is a symbolic link (to somewhere a user controls) is not used."""
    real = tmp_path / "real"
    registration.register(real, _endpoint())
    link = tmp_path / "link"
    link.symlink_to(real)
    assert _scan(link)[0] == []
    with pytest.raises(NotADirectoryError, match="symbolic link"):
        registration.register(link, _endpoint())


_FORGE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from babysitter import registration
    shared, victim_pid, victim_start = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    # nobody registers root's process (pid and start time are public in /proc) in its own directory
    own = registration.register(shared, registration.Endpoint(
        os.getpid(), registration.process_start_time(os.getpid()), "http://127.0.0.1:1/metrics", "mine", 0, 0)).parent
    forged = {"schema": 1, "pid": victim_pid, "start_time": victim_start,
              "url": "http://127.0.0.1:2/metrics", "run": "forged", "rank": 0, "local_rank": 0}
    (own / "9-9.json").write_text(json.dumps(forged))
    # and squats on the directory name of uid 4242
    (shared / "4242").mkdir()
    # nobody cannot touch root's directory
    try:
        (shared / "0" / "x.json").write_text("{}")
        print("wrote into root's directory")
    except PermissionError:
        print("refused")
    """
)


def test_other_users_cannot_forge_or_squat(public_tmp: Path) -> None:
    """As nobody: a registration naming root's process is skipped (wrong_owner, checked in /proc), a
    directory squatting on another uid's name is skipped and refused to that user's tracker, and root's
    own directory cannot be written."""
    shared = public_tmp / "registry"
    registration.register(shared, _endpoint())
    proc = run_as_nobody(
        _FORGE, str(shared), str(os.getpid()), str(registration.process_start_time(os.getpid()))
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "refused"
    found, skipped = _scan(shared)
    assert [r.endpoint.run for r in found] == ["run"]  # nobody's own "mine" process has exited
    assert skipped == {"wrong_owner": 2, "dead": 1}
    squatted = shared / "4242"
    assert squatted.stat().st_uid == NOBODY
    os.seteuid(4242)  # the user whose directory name nobody took
    try:
        with pytest.raises(PermissionError, match="belongs to uid 65534"):
            registration.register(shared, _endpoint())
    finally:
        os.seteuid(0)


def test_proc_reader_agrees_with_psutil() -> None:
    """The agent's /proc reader gives psutil's create_time() and uids, which registrations store,
    for this process and a child; a pid that exited is ProcessLookupError (counted as dead)."""
    import psutil

    from babysitter.registration._proc import Procfs

    proc = Procfs()
    boot = proc.boot_time()
    assert boot == psutil.boot_time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for pid in (os.getpid(), child.pid, 1):
            assert proc.start_time(pid, boot) == psutil.Process(pid).create_time()
            uids = psutil.Process(pid).uids()
            assert proc.uids(pid) == (uids.real, uids.effective)
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ProcessLookupError):
        proc.start_ticks(child.pid)
    with pytest.raises(ProcessLookupError):
        proc.uids(child.pid)


def _fake_proc(root: Path, pid: int, *, stat_line: str, status: str, btime: str = "btime 1000\n") -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu  1 2 3 4\ncpu0 1 2 3 4\nintr 5 6 7\nctxt 9\n" + btime + "processes 3\n")
    (root / str(pid) / "stat").write_text(stat_line)
    (root / str(pid) / "status").write_text(status)


def test_scanner_judges_the_process_from_proc(tmp_path: Path) -> None:
    """Through a procfs root the test writes: the start tick (after the last ")", whatever the command
    name holds) against the registered start; the Uid line against the directory's uid; garbage,
    a missing line or an unreadable file is "unreadable", never served and never raised."""
    from babysitter.registration._proc import CLOCK_TICKS, Procfs

    pid, uid = 4242, os.geteuid()
    ticks = 500 * CLOCK_TICKS  # 500 s after a boot at 1000 s
    start = 1000.0 + ticks / CLOCK_TICKS
    fields = ["S", "1"] + ["0"] * 17 + [str(ticks)] + ["0"] * 30
    good_stat = f"{pid} (a) b) c) {' '.join(fields)}\n"
    good_status = f"Name:\ta\nUmask:\t0022\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n"
    ep = registration.Endpoint(pid, start, "http://127.0.0.1:9450/metrics", "run", 0, 0)
    reg = tmp_path / "reg"
    own = reg / str(uid)  # written by hand: register() would prune it, as pid 4242 is not alive here
    own.mkdir(parents=True)
    (own / ep.name).write_text(json.dumps({"schema": 1, **ep.__dict__}))
    proc = tmp_path / "proc"

    def judge(**fake: str) -> tuple[list[registration.Registered], dict[str, int]]:
        _fake_proc(proc, pid, **{"stat_line": good_stat, "status": good_status, **fake})
        return _scan(reg, procfs=Procfs(str(proc)))

    found, skipped = judge()
    assert [r.endpoint for r in found] == [ep] and skipped == {}
    later = good_stat.replace(f" {ticks} ", f" {ticks + 2 * CLOCK_TICKS} ")
    assert judge(stat_line=later) == ([], {"dead": 1})
    other = good_status.replace(f"Uid:\t{uid}\t{uid}", f"Uid:\t{uid + 1}\t{uid + 1}")
    assert judge(status=other) == ([], {"wrong_owner": 1})
    effective = good_status.replace(f"Uid:\t{uid}\t{uid}", f"Uid:\t{uid + 1}\t{uid}")
    assert [r.endpoint for r in judge(status=effective)[0]] == [ep]
    for broken in (
        {"stat_line": "4242 (a) S 1\n"},
        {"stat_line": good_stat.replace(str(ticks), "x")},
        {"status": "Name:\ta\n"},
        {"status": "Name:\ta\nUid:\t\n"},
        {"btime": ""},
    ):
        assert judge(**broken) == ([], {"unreadable": 1}), broken
    judge()
    (proc / str(pid) / "status").unlink()
    (proc / str(pid) / "status").mkdir()  # read() fails: EISDIR
    assert _scan(reg, procfs=Procfs(str(proc))) == ([], {"unreadable": 1})
    (proc / str(pid) / "status").rmdir()
    (proc / str(pid) / "stat").unlink()
    assert _scan(reg, procfs=Procfs(str(proc))) == ([], {"dead": 1})
