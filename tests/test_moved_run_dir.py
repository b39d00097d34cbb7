"""A moved run directory tells the truth where it is now; a copied one never vouches for the original
(issue 32, point 3).

The ledger stored absolute checkpoint paths: moved, a run directory reported "no checkpoint of this run
verifies" next to its checkpoints; copied, the copy checked (and called verified) the original's. Paths
inside the run directory are now stored relative to it, and every reader resolves them through
:func:`babysitter.ledger.paths.resolve` (old ledgers too). These tests make a real run with the
tracker (torch.save checkpoints with their manifests), then move or copy its directory.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import babysitter
from babysitter.checkpoints import checkpoint_statuses, resume_point
from babysitter.cli import main
from babysitter.ledger import DEFAULT_FILE_NAME
from babysitter.ledger.paths import OUTSIDE, ledger_path, resolve
from babysitter.ledger.records import CheckpointEnd, Start, encode, to_us
from babysitter.node.storage.sentinel import CheckpointSentinelCollector
from unpriv import public_tmp

torch = pytest.importorskip("torch")

NOW = 2.0e9  # report --now: after every save, so nothing is "pending"


def _train(run_dir: Path, registry: Path, steps: tuple[int, ...] = (2, 4)) -> None:
    """A short run that saves a torch.save checkpoint (with its manifest) at each of ``steps``."""
    tracker = babysitter.watch(
        run="moved", port=-1, run_dir=run_dir, registry_dir=registry, hang_timeout=None, flush_interval=0.02
    )
    try:
        for step in range(1, max(steps) + 1):
            tracker.step(loss=1.0, step=step)
            if step in steps:
                path = run_dir / "ckpt" / f"step-{step}.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                with tracker.checkpoint_save(step=step, path=str(path)):
                    torch.save({"w": torch.full((256,), float(step))}, path)
        assert tracker.checkpoint_observer is not None
        assert tracker.checkpoint_observer.wait_idle(30)
    finally:
        tracker.close()


def _report(run_dir: Path, capsys: pytest.CaptureFixture[str], *more: str) -> dict[str, object]:
    assert main(["report", str(run_dir), "--json", "--now", str(NOW), *more]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def _statuses(report: dict[str, object]) -> dict[int, tuple[str, str]]:
    checkpoints = report["checkpoints"]
    assert isinstance(checkpoints, dict)
    return {s["step"]: (s["status"], s["path"]) for s in checkpoints["statuses"]}


def _without_paths(report: dict[str, object]) -> dict[str, object]:
    """The report with the checkpoints' paths (and the ledger's own) left out: every number."""
    text = json.dumps(report, sort_keys=True)
    out: dict[str, object] = json.loads(text)
    checkpoints = out.pop("checkpoints")
    assert isinstance(checkpoints, dict)
    out["statuses"] = [{k: v for k, v in s.items() if k != "path"} for s in checkpoints["statuses"]]
    out.pop("ledger", None)
    return out


@pytest.fixture(name="trained")
def _trained(tmp_path: Path) -> Path:
    run = tmp_path / "first" / "run"
    _train(run, tmp_path / "reg")
    return run


def test_the_ledger_stores_paths_inside_the_run_directory_relative_to_it(trained: Path) -> None:
    text = (trained / DEFAULT_FILE_NAME).read_text()
    starts = [json.loads(line) for line in text.splitlines() if '"k":"start"' in line]
    assert [s["dir"] for s in starts] == [str(trained)]
    saves = [json.loads(line) for line in text.splitlines() if '"k":"ck' in line]
    assert {s["path"] for s in saves} == {"ckpt/step-2.pt", "ckpt/step-4.pt"}
    assert str(trained) not in text.replace(f'"dir":"{trained}"', "")


def test_a_moved_run_directory_verifies_where_it_is_now(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Moved: main said "no checkpoint of this run verifies / step 4 is missing" next to them."""
    before = _report(trained, capsys)
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(trained, moved)
    after = _report(moved, capsys)
    assert _statuses(after) == {
        2: ("verified", str(moved / "ckpt" / "step-2.pt")),
        4: ("verified", str(moved / "ckpt" / "step-4.pt")),
    }
    assert _without_paths(after) == _without_paths(before)  # every number the same
    resume = resume_point(checkpoint_statuses(moved, now=NOW))  # what remediate's requeue names
    assert resume is not None and resume.path == str(moved / "ckpt" / "step-4.pt")
    sentinel = CheckpointSentinelCollector([moved], refresh_seconds=0.0, walk_seconds=0.0)
    try:
        (result,) = sentinel.check_now()
    finally:
        sentinel.close()
    assert [(c.step, c.verified) for c in result.checks] == [(2, True), (4, True)]


def test_a_copied_run_directory_never_vouches_for_the_original(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Copied: each directory speaks for its own checkpoints. Truncate the copy's newest and the copy
    says so (main checked the original's: verified); delete the original's and only the original
    says it is missing."""
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    (copy / f"{DEFAULT_FILE_NAME}.lock").unlink(missing_ok=True)
    with (copy / "ckpt" / "step-4.pt").open("r+b") as fh:
        fh.truncate(100)
    assert _statuses(_report(copy, capsys))[4][0] == "corrupt"
    assert _statuses(_report(trained, capsys))[4][0] == "verified"
    (trained / "ckpt" / "step-2.pt").unlink()
    assert _statuses(_report(trained, capsys))[2][0] == "missing"
    assert _statuses(_report(copy, capsys))[2] == ("verified", str(copy / "ckpt" / "step-2.pt"))


def _old_ledger(run_dir: Path, paths: list[Path]) -> None:
    """A ledger as trackers wrote it before: absolute paths, no ``dir`` in the start record."""
    t = time.time() - 1000
    lines = [encode(Start(t=to_us(t), pst=to_us(t), id="0ld1d", host="h", pid=7, run="old"))]
    for i, path in enumerate(paths):
        end = CheckpointEnd(
            to_us(t + 10 * (i + 1)), "save", 10 * (i + 1), True, None, str(path), manifest=True
        )
        lines.append(encode(end, fence="0ld1"))
    assert b'"dir"' not in lines[0]
    (run_dir / DEFAULT_FILE_NAME).write_bytes(b"".join(lines))


def test_an_old_ledger_with_absolute_paths_still_reads_moved_and_copied(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written by hand in the old format: read in place; moved, its checkpoints are found where they
    are now; copied, a checkpoint the copy lacks is "outside this run directory", never the
    original's vouched for (main: verified, the original's)."""
    checkpoints = [trained / "ckpt" / "step-2.pt", trained / "ckpt" / "step-4.pt"]
    _old_ledger(trained, checkpoints)
    assert set(_statuses(_report(trained, capsys)).values()) == {("verified", str(p)) for p in checkpoints}
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    (copy / "ckpt" / "step-4.pt").unlink()
    got = _statuses(_report(copy, capsys))
    assert got[10] == ("verified", str(copy / "ckpt" / "step-2.pt"))  # its own, found by its tail
    statuses = {s.step: s for s in checkpoint_statuses(copy, now=NOW)}
    assert (statuses[20].status, statuses[20].reason) == ("unknown", "outside")
    assert statuses[20].detail.startswith(OUTSIDE) and statuses[20].ledger_path == str(checkpoints[1])
    moved = tmp_path / "moved"
    shutil.move(trained, moved)
    assert _statuses(_report(moved, capsys)) == {
        10: ("verified", str(moved / "ckpt" / "step-2.pt")),
        20: ("verified", str(moved / "ckpt" / "step-4.pt")),
    }


def test_a_checkpoint_stored_outside_the_run_directory_on_purpose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Saved to a sibling directory (``..``): stored absolute, verified for the run's owner wherever
    the run directory moves; never looked at by a reader with more rights than the owner."""
    run = tmp_path / "runs" / "a"
    outside = tmp_path / "runs" / "shared-ckpt"
    tracker = babysitter.watch(
        run="out", port=-1, run_dir=run, registry_dir=tmp_path / "reg", hang_timeout=None, flush_interval=0.02
    )
    try:
        tracker.step(loss=1.0, step=1)
        path = run / ".." / "shared-ckpt" / "step-1.pt"
        outside.mkdir(parents=True)
        with tracker.checkpoint_save(step=1, path=str(path)):
            torch.save({"w": torch.ones(8)}, path)
        assert tracker.checkpoint_observer is not None and tracker.checkpoint_observer.wait_idle(30)
    finally:
        tracker.close()
    assert f'"path":"{outside}/step-1.pt"' in (run / DEFAULT_FILE_NAME).read_text()
    moved = tmp_path / "moved-a"
    shutil.move(run, moved)
    assert _statuses(_report(moved, capsys)) == {1: ("verified", str(outside / "step-1.pt"))}
    (refused,) = checkpoint_statuses(moved, now=NOW, privileged=True)
    assert (refused.status, refused.reason) == ("unknown", "outside")
    assert "not checked for another user" in refused.detail


@pytest.mark.parametrize(
    ("raw", "origin", "expect"),
    [
        (None, None, None),
        ("s3://bucket/ckpt", None, None),
        ("ckpt/a.pt", None, "RUN/ckpt/a.pt"),
        ("./ckpt/../ckpt/a.pt", None, "RUN/ckpt/a.pt"),
        ("../elsewhere/a.pt", None, "RUN/../elsewhere/a.pt"),
        ("/gone/run/ckpt/a.pt", "/gone/run", "RUN/ckpt/a.pt"),  # recorded: moved with the directory
        ("/data/ckpt/a.pt", "/gone/run", "/data/ckpt/a.pt"),  # recorded as outside: used as it is
        ("RUN/ckpt/a.pt", None, "RUN/ckpt/a.pt"),  # an old ledger, not moved
        ("/gone/run/ckpt/a.pt", None, "RUN/ckpt/a.pt"),  # an old ledger, moved: found by its tail
        ("/gone/run/ckpt/b.pt", None, "/gone/run/ckpt/b.pt"),  # not here either: where it was
    ],
)
def test_the_one_rule(tmp_path: Path, raw: str | None, origin: str | None, expect: str | None) -> None:
    run = tmp_path / "run"
    (run / "ckpt").mkdir(parents=True)
    (run / "ckpt" / "a.pt").write_bytes(b"x")
    raw = None if raw is None else raw.replace("RUN", str(run))
    got = resolve(raw, run, origin=origin)
    assert (None if got.path is None else str(got.path)) == (
        None if expect is None else expect.replace("RUN", str(run))
    )
    privileged = resolve(raw, run, origin=origin, privileged=True)
    if expect is None or not expect.startswith("RUN") or ".." in expect or got.inferred:
        assert privileged.path is None and privileged.why  # absolute, climbing out or inferred: refused
    else:
        assert privileged.path == got.path


def test_ledger_path_relative_inside_absolute_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    link = tmp_path / "link"
    link.symlink_to(run)
    assert ledger_path(run / "ckpt" / "a.pt", run) == "ckpt/a.pt"
    assert ledger_path(link / "ckpt" / "a.pt", run) == "ckpt/a.pt"  # the run directory through a link
    assert ledger_path(run / ".." / "x.pt", run) == str(tmp_path / "x.pt")
    assert ledger_path("s3://b/x", run) == "s3://b/x" and ledger_path(None, run) is None
    assert ledger_path(run, run) == "."
    monkeypatch.chdir(tmp_path)
    assert ledger_path("run/a.pt", "run") == "a.pt"


@pytest.fixture
def public() -> Iterator[Path]:
    """A temp directory uid 65534 can traverse (the sentinel checks its run as that user)."""
    yield from public_tmp()


def test_the_sentinel_checking_another_users_run_looks_at_nothing_outside_it(public: Path) -> None:
    """Root checking a run directory owned by uid 65534 whose ledger names an absolute path outside it
    (a root-only file) and one climbing out with ``..``: neither is stat'ed or read (main checked
    both with root's rights); a checkpoint inside the directory is checked as before."""
    if os.geteuid() != 0:
        pytest.skip("needs root to check a run directory of another user")
    tmp_path = public
    run = tmp_path / "user-run"
    run.mkdir()
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "key").write_bytes(b"s" * 4096)
    (run / "mine.pt").write_bytes(b"m" * 10)
    t = time.time() - 100
    lines = [
        encode(Start(t=to_us(t), pst=to_us(t), id="u5er1", host="h", pid=1, run="u", directory=str(run)))
    ]
    for step, path in ((1, str(secret / "key")), (2, "../root-only/key"), (3, "mine.pt")):
        lines.append(encode(CheckpointEnd(to_us(t + step), "save", step, True, 4096, path), fence="u5er"))
    (run / DEFAULT_FILE_NAME).write_bytes(b"".join(lines))
    os.chown(run, 65534, 65534)
    sentinel = CheckpointSentinelCollector([run], refresh_seconds=0.0, walk_seconds=0.0, keep_last=5)
    try:
        (result,) = sentinel.check_now()
    finally:
        sentinel.close()
    checks = {c.step: c for c in result.checks}
    for step in (1, 2):
        assert checks[step].missing is None and "outside the run directory" in checks[step].detail
    assert (checks[3].missing, checks[3].detail) == (True, "10 bytes, ledger says 4096")


def test_a_copy_condemned_by_the_originals_verdict_is_cleared_by_reading_its_own_bytes(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy carries the original's verdicts file: a digest mismatch the node agent found in the
    original makes the copy's report say corrupt too (it does not vouch); ``--verify`` reads the
    copy's own bytes and says verified."""
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    original = trained / "ckpt" / "step-4.pt"
    data = bytearray(original.read_bytes())
    data[len(data) // 2] ^= 0x01
    original.write_bytes(bytes(data))
    sentinel = CheckpointSentinelCollector([trained], refresh_seconds=0.0, walk_seconds=0.0)
    try:
        sentinel.check_now()
    finally:
        sentinel.close()
    shutil.copy(trained / "babysitter-verdicts.jsonl", copy / "babysitter-verdicts.jsonl")
    assert _statuses(_report(trained, capsys))[4][0] == "corrupt"
    assert _statuses(_report(copy, capsys))[4][0] == "corrupt"
    assert _statuses(_report(copy, capsys, "--verify"))[4][0] == "verified"
    assert _statuses(_report(trained, capsys, "--verify"))[4][0] == "corrupt"
