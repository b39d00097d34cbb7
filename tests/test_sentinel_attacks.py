"""The checkpoint sentinel attacked by the users whose run directories it checks (issue 31, points 1
and 3), each attack written as the attack: the agent runs as root (as these tests do), the attacker's
run directory and files belong to uid 65534, the secrets are root's (0600 files in 0700 directories)
or another user's (uid 65533).

Before the fix the sentinel read, as root, whatever a ledger or a manifest pointed at: a root-only
file's size and whether a guessed digest of it was right, its bytes one by one, a root-only
directory's size through ``checkpoint_missing``, another user's checkpoint names and sizes in the
attacker's own verdicts file; and a FIFO, a hung read or a ``RecursionError`` in one run directory
stopped the checks of every other run. Each test fails on that code (run it with
``PYTHONPATH=<checkout>/src``: options the old sentinel lacks are left out, so the attack runs
unbounded there) and passes now.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.catalog import storage as S
from babysitter.checkpoints import build_manifest
from babysitter.checkpoints.manifest import FileEntry, Manifest, manifest_path
from babysitter.checkpoints.verdicts import VERDICTS_FILE
from babysitter.ledger import DEFAULT_FILE_NAME, completed_checkpoints
from babysitter.ledger.records import CheckpointEnd, Start, encode, to_us
from babysitter.node.storage.sentinel import CheckpointSentinelCollector
from node_helpers import Scrape, scrape
from unpriv import NOBODY, public_tmp

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks need separate uids: run as root")

ATTACKER = NOBODY
OTHER = 65533  # a second unprivileged user, with no passwd entry
SECRET = b"s3cr3t-42"
T0 = time.time() - 3600
MISSING, NEWEST_MISSING = S.CHECKPOINT_MISSING.name, S.CHECKPOINT_MISSING_STEP.name
CORRUPT, CORRUPT_STEP = S.CHECKPOINT_CORRUPT.name, S.CHECKPOINT_CORRUPT_STEP.name
AGE, LEDGER_UP = S.CHECKPOINT_NEWEST_VERIFIED_AGE.name, S.CHECKPOINT_LEDGER_UP.name
FAILING, UNCHECKED = "checkpoint_check_failing", "checkpoint_unchecked"
LOGGER = "babysitter.node.storage"


@pytest.fixture(name="tmp")
def _tmp() -> Iterator[Path]:
    yield from public_tmp()


@pytest.fixture(name="sentinel")
def _sentinel() -> Iterator[object]:
    made: list[CheckpointSentinelCollector] = []

    def make(run_dirs: list[Path], **kwargs: object) -> CheckpointSentinelCollector:
        options: dict[str, object] = {"refresh_seconds": 0.0, "wait_seconds": 20.0, "run_timeout": 5.0}
        options.update(kwargs)
        known = inspect.signature(CheckpointSentinelCollector).parameters
        collector = CheckpointSentinelCollector(run_dirs, **{k: v for k, v in options.items() if k in known})  # type: ignore[arg-type]
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.close()


def own(path: Path, uid: int, gid: int | None = None) -> None:
    """``chown -hR uid:gid path`` (links themselves, not what they point at)."""
    gid = uid if gid is None else gid
    os.lchown(path, uid, gid)
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirs, files in os.walk(path):
            for name in dirs + files:
                os.lchown(os.path.join(dirpath, name), uid, gid)


def vault(tmp: Path) -> Path:
    """Root's: a 0700 directory holding a 0600 file of 9 secret bytes and 5000 bytes of others."""
    root = tmp / "vault"
    root.mkdir(mode=0o700)
    (root / "secret.bin").write_bytes(SECRET)
    (root / "notes").mkdir(mode=0o700)
    (root / "notes" / "a").write_bytes(b"x" * 3000)
    (root / "notes" / "b").write_bytes(b"y" * (5000 - 3000 - len(SECRET)))
    for path in (root / "secret.bin", root / "notes" / "a", root / "notes" / "b"):
        path.chmod(0o600)
    return root


def ledger(
    run_dir: Path, run: str, saves: list[tuple[int, str, int | None, bool]], *, start: bytes = b""
) -> None:
    """A ledger as the tracker writes it: (step, path, nbytes, manifest promised) per completed save."""
    lines = [start or encode(Start(t=to_us(T0), pst=to_us(T0), id="i1", host="h", pid=1, run=run))]
    for step, path, nbytes, promised in saves:
        end = CheckpointEnd(
            t=to_us(T0 + step), op="save", step=step, ok=True, nbytes=nbytes, path=path, manifest=promised
        )
        lines.append(encode(end))
    (run_dir / DEFAULT_FILE_NAME).write_bytes(b"".join(lines))


def attacker_run(tmp: Path, name: str) -> Path:
    run = tmp / name
    run.mkdir()
    return run


def write_manifest(
    checkpoint: Path, step: int, files: list[FileEntry], *, chunk: int, alg: str | None
) -> None:
    manifest = Manifest(
        run="evil", step=step, layout="files", created=T0, host="h", alg=alg, chunk=chunk, files=tuple(files)
    )
    manifest_path(checkpoint, is_dir=checkpoint.is_dir()).write_bytes(manifest.encode())


def everything_said(run_dir: Path, s: Scrape, caplog: pytest.LogCaptureFixture) -> str:
    """What the attacker can read: the verdicts file in their run directory, every metric sample, and
    (more than they can read) every log line of the sentinel."""
    verdicts = run_dir / VERDICTS_FILE
    text = verdicts.read_text() if verdicts.exists() else ""
    samples = "\n".join(f"{x.name} {json.dumps(x.labels, sort_keys=True)} {x.value}" for x in s.samples)
    logs = "\n".join(r.getMessage() for r in caplog.records)
    return "\n".join((text, samples, logs))


def series(s: Scrape, run: str) -> list[tuple[str, str, float]]:
    """A run's samples without its name: (metric, other labels, value)."""
    return sorted(
        (x.name, json.dumps({k: v for k, v in x.labels.items() if k != "run"}, sort_keys=True), x.value)
        for x in s.samples
        if x.labels.get("run") == run
    )


def test_a_manifest_naming_a_link_to_a_root_only_file_learns_nothing_of_it(
    tmp: Path, sentinel, caplog: pytest.LogCaptureFixture
) -> None:
    """Inside the attacker's own checkpoints, ``weights.bin`` links to root's secret. Step 1 guesses its
    size (1 byte); step 2 guesses all of it right (its SHA-256); step 3 guesses it wrong. Before: "9
    bytes, the manifest says 1", ``ok: true`` for the right guess, and (with ``chunk=1`` manifests,
    which the manifest reader now refuses: ``tests/test_parsing_bounds.py``) which byte differs."""
    secret = vault(tmp) / "secret.bin"
    run = attacker_run(tmp, "evil")
    right = [hashlib.sha256(SECRET).hexdigest()]
    wrong = [hashlib.sha256(b"?" * len(SECRET)).hexdigest()]
    guesses = {1: (1, [hashlib.sha256(b"s").hexdigest()]), 2: (len(SECRET), right), 3: (len(SECRET), wrong)}
    for step, (size, digests) in guesses.items():
        checkpoint = run / f"ckpt-{step}"
        checkpoint.mkdir()
        (checkpoint / "weights.bin").symlink_to(secret)
        write_manifest(
            checkpoint, step, [FileEntry("weights.bin", size, tuple(digests))], chunk=1 << 16, alg="sha256"
        )
    ledger(run, "evil", [(step, f"ckpt-{step}", None, True) for step in guesses])
    own(run, ATTACKER)
    c = sentinel([run], keep_last=3)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        s = scrape(c)
    said = everything_said(run, s, caplog)
    assert '"ok":true' not in said.replace(" ", "")  # the right guess is not confirmed
    assert "9 bytes" not in said and "differ" not in said  # neither the size nor which byte is wrong
    checks = {x.step: x for x in c.check_now()[0].checks}
    assert not any(x.verified for x in checks.values())
    assert not s.find(AGE, run="evil")
    assert not [x for x in s.samples if x.name == CORRUPT_STEP and x.labels["reason"] in ("size", "digest")]
    # The right guess, the wrong one and the wrong size get the same answer: nothing to tell them apart.
    assert len({(x.missing, x.corrupt, x.reason, x.detail) for x in checks.values()}) == 1
    assert checks[2].missing is None and "cannot be checked" in checks[2].detail
    assert s.value(UNCHECKED, run="evil") == 3


def test_a_ledger_path_outside_the_run_directory_is_refused_and_no_size_leaks(
    tmp: Path, sentinel, caplog: pytest.LogCaptureFixture
) -> None:
    """The ledger names root's directory and file by absolute path, by ``..`` and through a link in the
    run directory, with ``nbytes`` guessing their size exactly (run lo) and one byte more (run hi).
    Before: ``checkpoint_missing`` 0 for lo and 2 for hi: the directory's total size to the byte, by
    bisection."""
    secret_dir = vault(tmp)
    runs = {}
    for name, extra in (("lo", 0), ("hi", 1)):
        run = attacker_run(tmp, name)
        (run / "peek").symlink_to(secret_dir)
        ledger(
            run,
            name,
            [
                (1, str(secret_dir), 5000 + extra, False),
                (2, str(secret_dir / "secret.bin"), len(SECRET) + extra, False),
                (3, f"../{secret_dir.name}/notes", 3000 + extra, False),
                (4, "peek/notes", 3000 + extra, False),
            ],
        )
        own(run, ATTACKER)
        runs[name] = run
    c = sentinel(list(runs.values()), keep_last=4)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            s = scrape(c)
    assert series(s, "lo") == series(s, "hi")  # the guess changes nothing the attacker can see
    assert not s.find(MISSING, run="lo")  # nothing checked, nothing counted
    assert s.value(UNCHECKED, run="lo") == 4
    for result in c.check_now():
        assert [x.detail for x in result.checks] == ["cannot be checked: outside the run directory"] * 4
    refused = [r.getMessage() for r in caplog.records if "outside the run directory" in r.getMessage()]
    assert len(refused) == 8, refused  # once per checkpoint of each run, not once per pass


def test_another_users_checkpoint_never_reaches_the_attackers_verdicts(
    tmp: Path, sentinel, caplog: pytest.LogCaptureFixture
) -> None:
    """The attacker's ledger names root's private checkpoint (its manifest says what it holds) by
    absolute path and through a link. Before: the verdict root wrote into the attacker's directory
    named the victim's files and their sizes."""
    victim = tmp / "victim"
    victim.mkdir(mode=0o700)
    checkpoint = victim / "ckpt-7"
    checkpoint.mkdir()
    (checkpoint / "optimizer-shard-07.bin").write_bytes(os.urandom(4096))
    (checkpoint / "model-private-name.bin").write_bytes(os.urandom(1000))
    assert build_manifest(checkpoint, run="victim", step=7).kind == "manifest"
    with (checkpoint / "optimizer-shard-07.bin").open("r+b") as fh:
        fh.truncate(2048)  # so a verdict would name the file and both sizes
    for path in checkpoint.iterdir():
        path.chmod(0o600)
    run = attacker_run(tmp, "evil")
    (run / "mirror").symlink_to(checkpoint)
    ledger(run, "evil", [(7, str(checkpoint), None, True), (8, "mirror", None, True)])
    own(run, ATTACKER)
    c = sentinel([run])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        s = scrape(c)
        scrape(c)
    said = everything_said(run, s, caplog)
    for leak in ("optimizer-shard-07", "model-private-name", "2048", "4096"):
        assert leak not in said, leak
    assert not (run / VERDICTS_FILE).exists()
    assert s.value(UNCHECKED, run="evil") == 2


def test_verdicts_are_written_as_the_runs_owner(tmp: Path, sentinel) -> None:
    """The verdicts file in a user's run directory is theirs (before: root's, 0644, in their directory)."""
    run = attacker_run(tmp, "mine")
    (run / "ckpt-1.bin").write_bytes(os.urandom(3000))
    assert build_manifest(run / "ckpt-1.bin", run="mine", step=1).kind == "manifest"
    ledger(run, "mine", [(1, "ckpt-1.bin", 3000, True)])
    own(run, ATTACKER)
    c = sentinel([run])
    s = scrape(c)
    assert s.value(CORRUPT, run="mine") == 0 and s.find(AGE, run="mine")
    verdicts = run / VERDICTS_FILE
    assert json.loads(verdicts.read_text())["ok"] is True
    assert (verdicts.stat().st_uid, verdicts.stat().st_gid) == (ATTACKER, ATTACKER)


def _fifo(path: Path) -> Path:
    os.mkfifo(path, 0o644)
    return path


def _victim(tmp: Path) -> Path:
    """Another user's honest run (uid 65533, private files): two checkpoints, the newest deleted later."""
    run = tmp / "victim"
    run.mkdir(mode=0o700)
    for step in (1, 2):
        (run / f"step-{step}.pt").write_bytes(b"\x01" * 100)
        (run / f"step-{step}.pt").chmod(0o600)
    ledger(run, "victim", [(1, "step-1.pt", 100, False), (2, "step-2.pt", 100, False)])
    own(run, OTHER)
    return run


@contextlib.contextmanager
def _releasing(fifos: list[Path]) -> Iterator[None]:
    """On the way out, open each FIFO for writing and close it: releases a reader the old sentinel left
    blocked in ``open`` (it never returns otherwise)."""
    try:
        yield
    finally:
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))


def test_fifos_cost_their_own_run_and_a_victims_deleted_checkpoint_is_still_reported(
    tmp: Path, sentinel
) -> None:
    """Three runs of the attacker: the ledger is a FIFO; a manifest lists a FIFO; a checkpoint path is
    a FIFO and another's manifest is one. Before: the sentinel blocked in ``open`` for good, and the
    victim's deleted checkpoint was never reported."""
    a, b, c_ = (attacker_run(tmp, name) for name in ("fifo-ledger", "fifo-listed", "fifo-paths"))
    fifos = [_fifo(a / DEFAULT_FILE_NAME)]
    (b / "ckpt-1").mkdir()
    fifos.append(_fifo(b / "ckpt-1" / "a.bin"))
    write_manifest(
        b / "ckpt-1",
        1,
        [FileEntry("a.bin", 0, (hashlib.sha256(b"").hexdigest(),))],
        chunk=1 << 16,
        alg="sha256",
    )
    ledger(b, "fifo-listed", [(1, "ckpt-1", 0, True)])
    fifos.append(_fifo(c_ / "ckpt-1.pt"))
    (c_ / "ckpt-2.pt").write_bytes(b"x" * 10)
    fifos.append(_fifo(manifest_path(c_ / "ckpt-2.pt", is_dir=False)))
    ledger(c_, "fifo-paths", [(1, "ckpt-1.pt", 10, False), (2, "ckpt-2.pt", 10, True)])
    for run in (a, b, c_):
        own(run, ATTACKER)
    victim = _victim(tmp)
    with _releasing(fifos):
        c = sentinel([a, b, c_, victim], wait_seconds=15.0, run_timeout=3.0)
        s = scrape(c)
        assert (s.value(MISSING, run="victim"), s.find(NEWEST_MISSING, run="victim")) == (0, [])
        (victim / "step-2.pt").unlink()
        s = scrape(c)  # the next pass
        assert (s.value(MISSING, run="victim"), s.find(NEWEST_MISSING, run="victim")) == (1, [2.0])
        # Each attacker's run shows what it did, and only to itself.
        assert s.value(LEDGER_UP, run="fifo-ledger") == 0
        assert s.value(UNCHECKED, run="fifo-listed") == 1 and not s.find(AGE, run="fifo-listed")
        assert s.value(MISSING, run="fifo-paths") == 1  # a FIFO is not a checkpoint
        assert s.value(CORRUPT, run="fifo-paths") == 1  # nor a manifest
        [bad] = [x.labels for x in s.samples if x.name == CORRUPT_STEP and x.labels["run"] == "fifo-paths"]
        assert bad["reason"] == "manifest_invalid"
        ledger_detail = next(r.detail for r in c.check_now() if r.run == "fifo-ledger")
        assert "a FIFO" in ledger_detail


def _hook(hostile: Path, action: str) -> object:
    """A ``read_ledger`` that does ``action`` for ``hostile`` and reads the others' ledgers: the test
    hook stands in for an input that hangs (a hung mount) or allocates without bound."""

    def read(run_dir: Path) -> object:
        if run_dir == hostile:
            if action == "hang":
                time.sleep(3600)
            elif action == "allocate":
                blob = bytearray(256 << 20)  # past a 64 MiB budget
                return [blob]
        return completed_checkpoints(run_dir)

    return read


@pytest.mark.parametrize(("action", "reason"), [("hang", "timeout"), ("allocate", "memory")])
def test_a_run_past_its_time_or_memory_budget_fails_alone(
    tmp: Path, sentinel, action: str, reason: str
) -> None:
    hostile = attacker_run(tmp, "hostile")
    (hostile / "a.pt").write_bytes(b"a")
    ledger(hostile, "hostile", [(1, "a.pt", 1, False)])
    own(hostile, ATTACKER)
    victim = _victim(tmp)
    c = sentinel(
        [hostile, victim],
        read_ledger=_hook(hostile, action),
        run_timeout=2.0,
        run_memory=64 << 20,
        wait_seconds=15.0,
    )
    s = scrape(c)
    (victim / "step-2.pt").unlink()
    s = scrape(c)
    assert (s.value(MISSING, run="victim"), s.find(NEWEST_MISSING, run="victim")) == (1, [2.0])
    failing = [x.labels["reason"] for x in s.samples if x.name == FAILING]
    assert failing == [reason], failing
    assert s.find(FAILING, run="hostile") and not s.find(FAILING, run="victim")


def test_a_worker_its_owner_stops_fails_its_run_alone_and_restarts(tmp: Path, sentinel) -> None:
    """The run's owner can signal the worker that runs as them: ``kill -STOP`` it. Only that run's
    checks fail, the victim's deleted checkpoint is reported, and the stopped worker is killed and
    replaced after a backoff."""
    hostile = attacker_run(tmp, "hostile")
    (hostile / "a.pt").write_bytes(b"a")
    ledger(hostile, "hostile", [(1, "a.pt", 1, False)])
    own(hostile, ATTACKER)
    victim = _victim(tmp)
    c = sentinel([hostile, victim], run_timeout=2.0, wait_seconds=15.0)
    s = scrape(c)
    assert s.value(MISSING, run="hostile") == 0
    pid = c.worker_pids()[0]
    stop = [
        "setpriv",
        f"--reuid={ATTACKER}",
        f"--regid={ATTACKER}",
        "--clear-groups",
        "kill",
        "-STOP",
        str(pid),
    ]
    subprocess.run(stop, check=True, timeout=30)
    (victim / "step-2.pt").unlink()
    s = scrape(c)
    assert (s.value(MISSING, run="victim"), s.find(NEWEST_MISSING, run="victim")) == (1, [2.0])
    assert [x.labels["reason"] for x in s.samples if x.name == FAILING] == ["timeout"]
    assert s.value(MISSING, run="hostile") == 0  # its last complete check is still served
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    time.sleep(1.1)  # the first backoff: one pass interval, at least a second
    s = scrape(c)
    assert not s.find(FAILING) and c.worker_pids()[0] != pid


def test_json_nested_too_deep_in_one_ledger_stops_no_other_run(tmp: Path, sentinel) -> None:
    """A start record nested 100,000 deep. Before: RecursionError on every pass, so no run's result
    was ever published and the victim's deleted checkpoint never reported."""
    hostile = attacker_run(tmp, "deep")
    (hostile / "a.pt").write_bytes(b"a")
    deep = b'{"v":1,"k":"start","run":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    ledger(hostile, "deep", [(1, "a.pt", 1, False)], start=deep)
    own(hostile, ATTACKER)
    victim = _victim(tmp)
    c = sentinel([hostile, victim])
    scrape(c)
    (victim / "step-2.pt").unlink()
    s = scrape(c)
    assert (s.value(MISSING, run="victim"), s.find(NEWEST_MISSING, run="victim")) == (1, [2.0])
    assert s.value(MISSING, run="deep") == 0  # named after its directory; its checkpoint checked


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def test_a_run_directory_linked_to_roots_is_checked_as_the_user_who_placed_the_link(
    tmp: Path, sentinel
) -> None:
    """The configured run directory is in the attacker's home; they replace it with a link to a run
    directory of root's. Before: root read it (its name, its checkpoints) into the public metrics."""
    private = tmp / "private"
    private.mkdir(mode=0o700)
    roots = private / "root-run"
    roots.mkdir()
    (roots / "step-1.pt").write_bytes(b"x" * 10)
    ledger(roots, "roots-secret-run", [(1, "step-1.pt", 10, False)])
    home = tmp / "home"
    home.mkdir()
    (home / "run").symlink_to(roots)
    own(home, ATTACKER)
    c = sentinel([home / "run"])
    s = scrape(c)
    assert not [x for x in s.samples if x.labels.get("run") == "roots-secret-run"]
    assert s.value(LEDGER_UP, run="run") == 0
    [pid] = c.worker_pids()
    assert _uid(pid) == ATTACKER


def test_who_a_worker_runs_as_and_what_it_holds(
    tmp: Path, sentinel, caplog: pytest.LogCaptureFixture
) -> None:
    """A private run directory is checked as its owner, one writable by everyone as nobody (anyone could
    have put its ledger there), and one whose checkpoint directory is writable by everyone has that
    checkpoint unchecked. The workers hold no descriptor of the agent's and cannot be ptraced by the
    user they run as (their /proc memory and environment stay root's)."""
    private, shared = tmp / "private", tmp / "shared"
    for run in (private, shared):
        run.mkdir()
        (run / "ckpt-1").mkdir()
        (run / "ckpt-1" / "w.bin").write_bytes(b"w" * 100)
        assert build_manifest(run / "ckpt-1", run=run.name, step=1).kind == "manifest"
        ledger(run, run.name, [(1, "ckpt-1", 100, True)])
        own(run, OTHER)
    shared.chmod(0o777)
    open_dir = tmp / "open-ckpt"
    shutil.copytree(private, open_dir, symlinks=True)
    ledger(open_dir, "open-ckpt", [(1, "ckpt-1", 100, True)])
    own(open_dir, OTHER)
    (open_dir / "ckpt-1").chmod(0o777)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        c = sentinel([private, shared, open_dir])
        s = scrape(c)
    assert s.value(CORRUPT, run="private") == 0 and s.find(AGE, run="private")
    assert s.value(UNCHECKED, run="open-ckpt") == 1
    uids = [_uid(pid) for pid in c.worker_pids()]
    assert uids == [OTHER, NOBODY, OTHER]
    assert any(
        "as nobody" in r.getMessage() and "writable by everyone" in r.getMessage() for r in caplog.records
    )
    for pid in c.worker_pids():
        fds = sorted(os.listdir(f"/proc/{pid}/fd"), key=int)
        assert len(fds) == 4, fds  # /dev/null three times and its socket
        # Not dumpable: its memory (a copy of the agent's) is not the user's to read or ptrace.
        assert os.stat(f"/proc/{pid}/mem").st_uid == 0 and os.stat(f"/proc/{pid}/environ").st_uid == 0
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o755


def test_a_directory_of_another_user_reached_through_the_attackers_is_checked_as_nobody(
    tmp: Path, sentinel, caplog: pytest.LogCaptureFixture
) -> None:
    """The attacker links their configured run directory to another user's. Checked as the attacker it
    would let them direct what is read in the other's name; checked as the other user it would read as
    them on the attacker's say. Two users control that path: the worker runs as nobody."""
    other = tmp / "other-run"
    other.mkdir()
    (other / "step-1.pt").write_bytes(b"x" * 10)
    ledger(other, "other-run", [(1, "step-1.pt", 10, False)])
    own(other, OTHER)
    home = tmp / "home"
    home.mkdir()
    (home / "run").symlink_to(other)
    own(home, ATTACKER)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        c = sentinel([home / "run"])
        s = scrape(c)
    [pid] = c.worker_pids()
    assert _uid(pid) == NOBODY
    assert s.value(MISSING, run="other-run") == 0  # what everyone may read is still checked
    said = " | ".join(r.getMessage() for r in caplog.records)
    assert "as nobody" in said and f"{OTHER}, {ATTACKER}" in said


def _garbage(hostile: Path, frame: bytes) -> object:
    """A ``read_ledger`` that, in the hostile run's worker, writes ``frame`` to the agent itself: what a
    worker taken over through some parser bug could answer."""

    agent = os.getpid()

    def read(run_dir: Path) -> object:
        if run_dir == hostile and os.getpid() != agent:  # only ever in a worker, never the test's process
            # The worker keeps one fd, its socket to the agent; its number is the test process's
            # next free one, above 63 in a CI worker that has run many tests before this one.
            sock = next(
                fd for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")) if fd > 2 and _is_socket(fd)
            )
            os.write(sock, frame)
            time.sleep(3600)
        return completed_checkpoints(run_dir)

    return read


def _is_socket(fd: int) -> bool:
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False


@pytest.mark.parametrize(
    "frame",
    [
        (5).to_bytes(4, "big") + b"[1,2]",  # not an object
        (1 << 30).to_bytes(4, "big"),  # a gigabyte announced
        (60).to_bytes(4, "big") + b'{"ok":true,"ledger_ok":true,"checks":[{"step":"1"}],"x":"..."}'[:60],
    ],
    ids=["not-an-object", "too-large", "bad-check"],
)
def test_a_worker_that_answers_garbage_fails_its_run_alone(tmp: Path, sentinel, frame: bytes) -> None:
    hostile = attacker_run(tmp, "hostile")
    (hostile / "a.pt").write_bytes(b"a")
    ledger(hostile, "hostile", [(1, "a.pt", 1, False)])
    own(hostile, ATTACKER)
    victim = _victim(tmp)
    c = sentinel([hostile, victim], read_ledger=_garbage(hostile, frame), run_timeout=3.0)
    s = scrape(c)
    assert s.value(MISSING, run="victim") == 0
    assert [x.labels["reason"] for x in s.samples if x.name == FAILING] == ["crashed"]


AGENT_WITHOUT_SETUID = """
import json, sys
from pathlib import Path
from babysitter.node.storage.sentinel import CheckpointSentinelCollector
c = CheckpointSentinelCollector([Path(sys.argv[1])], refresh_seconds=0.0, run_timeout=10.0)
try:
    [result] = c.check_now()
    print(json.dumps([result.failure, result.failure_detail, result.complete]))
finally:
    c.close()
"""


def test_an_agent_that_cannot_take_the_owners_credentials_refuses_to_read_as_root(tmp: Path) -> None:
    """uid 0 without CAP_SETUID/CAP_SETGID (a container that drops them) still reads root's files: the
    worker refuses instead of checking a user's run with root's uid, and the run is failing
    (``privileges``)."""
    run = attacker_run(tmp, "evil")
    (run / "a.pt").write_bytes(b"a")
    ledger(run, "evil", [(1, "a.pt", 1, False)])
    own(run, ATTACKER)
    argv = ["setpriv", "--bounding-set=-setuid,-setgid", sys.executable, "-c", AGENT_WITHOUT_SETUID, str(run)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    failure, detail, complete = json.loads(done.stdout.strip().splitlines()[-1])
    assert (failure, complete) == ("privileges", False), detail


CHECK_ONE_RUN = """
import json, os, sys
from pathlib import Path
from babysitter.node.storage.sentinel import CheckpointSentinelCollector
c = CheckpointSentinelCollector([Path(sys.argv[1])], refresh_seconds=0.0, run_timeout=30.0)
try:
    [result] = c.check_now()
    uids = [int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0]) for pid in c.worker_pids()]
    pids = c.worker_pids()
    print(json.dumps({"failure": result.failure, "detail": result.failure_detail,
                      "verified": [x.step for x in result.checks if x.verified], "uids": uids}))
finally:
    c.close()
print(json.dumps({"left": [p for p in pids if os.path.exists(f"/proc/{p}")]}))
"""


def _verifiable_run(tmp: Path, name: str) -> Path:
    """A run of uid 65534 whose checkpoints need every reader the worker has: a torch.save zip, a
    safetensors header, digests, a verdict to write."""
    import zipfile

    run = attacker_run(tmp, name)
    with zipfile.ZipFile(run / "ckpt-1.pt", "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    header = json.dumps({"w": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}}).encode()
    (run / "ckpt-2.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    for step, path in ((1, run / "ckpt-1.pt"), (2, run / "ckpt-2.safetensors")):
        assert build_manifest(path, run=name, step=step).kind == "manifest"
    ledger(run, name, [(1, "ckpt-1.pt", None, True), (2, "ckpt-2.safetensors", None, True)])
    own(run, ATTACKER)
    return run


def test_a_worker_needs_nothing_its_user_cannot_read(tmp: Path) -> None:
    """CI clones into a 0700 directory, deployments install under /root: the worker, forked and then
    running as the run's owner, must never import or open the agent's code again. The agent here runs
    from a copy of the package in a directory only root may enter; the worker still verifies everything
    (zip and safetensors headers, digests, its verdicts), and is gone once the sentinel is closed."""
    hidden = tmp / "hidden"
    hidden.mkdir(mode=0o700)
    shutil.copytree(Path(__file__).resolve().parent.parent / "src" / "babysitter", hidden / "babysitter")
    run = _verifiable_run(tmp, "mine")
    env = {**os.environ, "PYTHONPATH": str(hidden)}
    done = subprocess.run(
        [sys.executable, "-c", CHECK_ONE_RUN, str(run)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert (first["failure"], first["verified"], first["uids"]) == ("", [1, 2], [ATTACKER]), first
    assert second == {"left": []}
    assert (run / VERDICTS_FILE).stat().st_uid == ATTACKER


def test_an_agent_that_is_not_root_checks_as_itself(tmp: Path) -> None:
    """Not root, the agent cannot change whose rights its workers have: they keep its own."""
    from unpriv import run_as_nobody

    run = _verifiable_run(tmp, "mine")
    done = run_as_nobody(CHECK_ONE_RUN, str(run))
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert (first["failure"], first["verified"], first["uids"]) == ("", [1, 2], [NOBODY]), first
    assert second == {"left": []}
