"""Hostile user files against every parser of the node agent and the CLI (issue 31, points 3 and 4).

A run directory is written by its user and read by the root node agent's checkpoint sentinel and by
``babysitter report`` and ``babysitter checkpoint verify``. Each test is one attack from the issue,
written as the attack: JSON nested 100,000 deep in a ledger start line, a verdicts file, a
``.safetensors`` header and a Hugging Face index (a ``RecursionError`` every pass on main, so another
run's deleted checkpoint was never reported, and a traceback from the CLI); a FIFO where a checkpoint
file, a manifest, a ledger or a verdicts file should be (``open()`` blocked forever); a 43 MB
``chunk=1`` manifest (+200 MiB in the agent, kept) and a zip directory of 500,000 members (+234 MiB
and 4.8 s of CPU); a chunk larger than a sentinel pass can read (never read, still "verified").
Each fails on main and passes since the parsers are bounded (:mod:`babysitter.jsonin`,
:mod:`babysitter.userfiles`).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import pytest

import babysitter
from babysitter.checkpoints.layouts import structure_problems
from babysitter.checkpoints.manifest import FileEntry, Manifest, ManifestError, manifest_path, parse_manifest
from babysitter.checkpoints.manifest import write_atomic as write_manifest_file
from babysitter.checkpoints.verdicts import VERDICTS_FILE, Verdict, append_verdict, read_verdicts
from babysitter.checkpoints.verify import verify_checkpoint
from babysitter.cli import main
from babysitter.ledger import DEFAULT_FILE_NAME
from babysitter.ledger.records import CheckpointEnd, Start, encode, to_us
from babysitter.node.storage.sentinel import CheckpointSentinelCollector, run_name

DEEP = b"[" * 100_000 + b"]" * 100_000
SRC = str(Path(babysitter.__file__).resolve().parents[1])  # the code under test, for child processes


def _ledger(run_dir: Path, saves: list[tuple[int, Path, bool]], *, extra: bytes = b"") -> None:
    """A ledger of completed saves ``(step, path, manifest promised)``; ``extra`` lines go first."""
    t = time.time() - 100
    lines = [extra] if extra else []
    lines.append(encode(Start(t=to_us(t), pst=to_us(t), id="a1b2c3", host="h", pid=1, run=run_dir.name)))
    for i, (step, path, manifest) in enumerate(saves):
        end = CheckpointEnd(
            t=to_us(t + 10 + i), op="save", step=step, ok=True, nbytes=None, path=str(path), manifest=manifest
        )
        lines.append(encode(end, fence="a1b2"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / DEFAULT_FILE_NAME).write_bytes(b"".join(lines))


def _manifest(
    checkpoint: Path, files: dict[str, bytes], *, chunk: int = 1 << 20, alg: str | None = None
) -> None:
    """Write the manifest of ``checkpoint`` by hand (what a user can put there)."""
    entries = []
    for rel, data in files.items():
        digests: tuple[str, ...] = ()
        if alg is not None:
            digests = tuple(
                hashlib.sha256(data[k : k + chunk]).hexdigest() for k in range(0, max(len(data), 1), chunk)
            )
        entries.append(FileEntry(rel, len(data), digests))
    manifest = Manifest("r", 1, "files", time.time(), "h", alg, chunk, tuple(entries))
    write_manifest_file(manifest_path(checkpoint), manifest.encode())


def _sentinel(run_dirs: list[Path], **options: object) -> CheckpointSentinelCollector:
    settings: dict[str, object] = {"refresh_seconds": 0.0, "walk_seconds": 0.0, "reverify_seconds": 0.0}
    settings.update(options)
    return CheckpointSentinelCollector(run_dirs, **settings)  # type: ignore[arg-type]


def _babysitter(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process (killed at ``timeout``: a reader blocked on a FIFO fails the test)."""
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "babysitter", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


# ------------------------------------------------------------------------------------ deep JSON


def test_deep_json_in_one_ledger_costs_that_line_not_the_sentinel_pass_of_every_run(tmp_path: Path) -> None:
    """An attacker's ledger whose start line (and a checkpoint line) nests 100,000 deep: on main every
    pass died with RecursionError, so the victim's deleted checkpoint was never reported."""
    attacker, victim = tmp_path / "attacker", tmp_path / "victim"
    deep_start = (
        b'{"v":2,"k":"start","t":1,"pst":1,"id":"x","host":"h","pid":1,"run":"a","info":' + DEEP + b"}\n"
    )
    deep_save = b'{"v":2,"k":"cke","t":2,"op":"save","step":1,"ok":true,"path":' + DEEP + b"}\n"
    own = attacker / "ckpt-1"
    _ledger(attacker, [(1, own, False)], extra=deep_start + deep_save)
    own.write_bytes(b"mine")
    gone = victim / "ckpt-5"
    _ledger(victim, [(5, gone, False)])  # the victim's checkpoint was deleted
    assert run_name(attacker) == "attacker"  # the deep start is skipped; the next start names the run
    sentinel = _sentinel([attacker, victim])
    try:
        results = {r.run_dir.name: r for r in sentinel.check_now()}
    finally:
        sentinel.close()
    assert results["victim"].ledger_ok and [(c.step, c.missing) for c in results["victim"].checks] == [
        (5, True)
    ]
    assert results["attacker"].ledger_ok and [(c.step, c.missing) for c in results["attacker"].checks] == [
        (1, False)
    ]
    # The report reads the same ledger: the deep lines are counted as torn, nothing else changes.
    assert main(["report", str(attacker), "--json"]) == 0


def test_deep_json_in_a_safetensors_header_and_an_index_is_a_structure_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``.safetensors`` header and a ``model.safetensors.index.json`` nested 100,000 deep: a clean
    structure problem for ``checkpoint verify``, ``report`` and the sentinel, never RecursionError."""
    run = tmp_path / "run"
    ckpt = run / "hf-7"
    ckpt.mkdir(parents=True)
    header = DEEP
    files = {
        "model.safetensors": struct.pack("<Q", len(header)) + header,
        "model.safetensors.index.json": DEEP,
    }
    for rel, data in files.items():
        (ckpt / rel).write_bytes(data)
    _manifest(ckpt, files)
    _, _, problems = verify_checkpoint(ckpt, digests=False)
    assert {p.file: p.reason for p in problems} == {"model.safetensors": "structure"}
    assert "nested more than 64 deep" in problems[0].detail
    found = dict(structure_problems(ckpt, {rel: len(data) for rel, data in files.items()}))
    assert "nested more than 64 deep" in found["model.safetensors.index.json"]
    assert main(["checkpoint", "verify", str(ckpt)]) == 1
    assert "model.safetensors: the header is not a safetensors header" in capsys.readouterr().out
    _ledger(run, [(7, ckpt, True)])
    assert main(["report", str(run), "--json"]) == 0
    statuses = json.loads(capsys.readouterr().out)["checkpoints"]["statuses"]
    assert [(s["step"], s["status"], s["reason"]) for s in statuses] == [(7, "corrupt", "structure")]
    sentinel = _sentinel([run])
    try:
        (result,) = sentinel.check_now()
    finally:
        sentinel.close()
    assert [(c.corrupt, c.reason) for c in result.checks] == [(True, "structure")]


def test_a_deep_line_in_the_verdicts_file_is_skipped(tmp_path: Path) -> None:
    """The verdicts file sits in the run directory: a deep line there made read_verdicts (report,
    requeue) raise RecursionError; it is one skipped line."""
    verdict = Verdict(t=1.0, step=3, path="ckpt-3", mid="m", ok=False, reason="digest", file="a", detail="d")
    append_verdict(tmp_path, verdict)
    with (tmp_path / VERDICTS_FILE).open("ab") as fh:
        fh.write(DEEP + b"\n" + b'{"step":' + DEEP + b"}\n")
    found = read_verdicts(tmp_path)
    assert list(found) == [(3, "ckpt-3")] and found[(3, "ckpt-3")].reason == "digest"


# ------------------------------------------------------------------------------------ FIFOs


def test_a_fifo_listed_in_a_manifest_blocks_neither_verify_nor_report(tmp_path: Path) -> None:
    """A manifest listing a FIFO named like a torch.save file: root's ``open()`` blocked forever on
    main (the structure check, then the digest reader). Now: not a regular file, exit 1."""
    run = tmp_path / "run"
    ckpt = run / "ckpt-2"
    ckpt.mkdir(parents=True)
    (ckpt / "weights.bin").write_bytes(b"w" * 1000)
    _manifest(ckpt, {"weights.bin": b"w" * 1000, "model.pt": b""}, alg="sha256")
    os.mkfifo(ckpt / "model.pt")
    _ledger(run, [(2, ckpt, True)])
    verify = _babysitter("checkpoint", "verify", str(ckpt))
    assert verify.returncode == 1, verify.stderr
    assert "missing_file: model.pt: listed as a file, on disk not a regular file" in verify.stdout
    report = _babysitter("report", str(run), "--verify", "--json")
    assert report.returncode == 0, report.stderr
    (status,) = json.loads(report.stdout)["checkpoints"]["statuses"]
    assert (status["status"], status["reason"], status["file"]) == ("corrupt", "missing_file", "model.pt")


def test_a_fifo_as_manifest_ledger_or_verdicts_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    """The manifest itself, the verdicts file, the ledger: each a FIFO. Every reader refuses it at
    once with a clear message (main blocked in ``open()``)."""
    run = tmp_path / "run"
    ckpt = run / "ckpt-4"
    ckpt.mkdir(parents=True)
    os.mkfifo(manifest_path(ckpt))
    os.mkfifo(run / VERDICTS_FILE)
    _ledger(run, [(4, ckpt, True)])
    verify = _babysitter("checkpoint", "verify", str(ckpt))
    assert verify.returncode == 2 and "manifest_invalid" in verify.stdout and "FIFO" in verify.stdout
    report = _babysitter("report", str(run), "--json")
    assert report.returncode == 0, report.stderr
    (status,) = json.loads(report.stdout)["checkpoints"]["statuses"]
    assert status["status"] == "corrupt" and status["reason"] == "manifest_invalid"
    (run / DEFAULT_FILE_NAME).unlink()
    os.mkfifo(run / DEFAULT_FILE_NAME)
    report = _babysitter("report", str(run))
    assert report.returncode == 2
    assert "cannot read the ledger" in report.stderr and "a FIFO" in report.stderr
    assert "Traceback" not in report.stderr
    sentinel = _sentinel([run])
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.extend(sentinel.check_now()), daemon=True)
    worker.start()
    worker.join(60)  # main: blocked in run_name's open() of the ledger
    if worker.is_alive():  # release it: a writer that opens and closes is an end of file
        os.close(os.open(run / DEFAULT_FILE_NAME, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
    sentinel.close()
    assert len(results) == 1, "the sentinel's pass was blocked by a FIFO"
    (result,) = results
    assert not result.ledger_ok and "FIFO" in result.detail  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------ budgets


def test_a_chunk_outside_the_documented_range_makes_the_manifest_invalid() -> None:
    """``chunk=1`` (a byte-by-byte oracle, and manifests 64 times the checkpoint's size) and a chunk
    larger than the sentinel reads in a pass are refused when the manifest is read."""
    base = {"format": "babysitter-checkpoint-manifest", "v": 1, "step": 1, "alg": "sha256"}
    digest = hashlib.sha256(b"a").hexdigest()
    with pytest.raises(ManifestError, match="'chunk' must be an integer in"):
        parse_manifest(
            json.dumps({**base, "chunk": 1, "files": [{"path": "a", "size": 1, "chunks": [digest]}]}).encode()
        )
    with pytest.raises(ManifestError, match="'chunk' must be an integer in"):
        parse_manifest(json.dumps({**base, "chunk": 1 << 30, "files": []}).encode())


def test_a_chunk_the_sentinel_never_reads_is_never_verified(tmp_path: Path) -> None:
    """A 17 MiB file under a 32 MiB-chunk manifest, 8 MiB of digests a pass: the pass budget saves up
    to max(budget, 16 MiB), so the chunk never fits and was never read; main called it verified."""
    run = tmp_path / "run"
    ckpt = run / "big.bin"
    run.mkdir()
    data = os.urandom(17 << 20)
    ckpt.write_bytes(data)
    _manifest(ckpt, {"big.bin": data}, chunk=32 << 20, alg="sha256")
    _ledger(run, [(9, ckpt, True)])
    sentinel = _sentinel([run], verify_bytes=8 << 20)
    try:
        for _ in range(4):
            (result,) = sentinel.check_now()
    finally:
        sentinel.close()
    (check,) = result.checks
    assert not check.verified
    assert (check.corrupt, check.reason) == (True, "manifest_invalid")


_RSS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, {src!r})
    {imports}

    def peak():  # this process's own high-water mark (ru_maxrss starts from the parent's at fork)
        with open("/proc/self/status") as fh:
            return int(next(line for line in fh if line.startswith("VmHWM:")).split()[1])

    before = peak()
    try:
        {call}
    except Exception as exc:
        print(type(exc).__name__, str(exc)[:200], file=sys.stderr)
    print((peak() - before) // 1024)
    """
)


def _peak_growth_mib(imports: str, call: str) -> int:
    """How much the peak RSS of a fresh interpreter grows across ``call`` (MiB)."""
    code = _RSS.format(src=SRC, imports=imports, call=call)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return int(done.stdout.split()[-1])


def test_a_43_mb_chunk_1_manifest_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """The issue's manifest: 43 MB of digests of single bytes. Main parsed and kept it (+200 MiB in
    the root agent, each rewrite); now it is refused on its size, before a byte of it is read."""
    digest = hashlib.sha256(b"x").hexdigest()
    per = 64 * 1024
    files = [{"path": f"f{i}", "size": per, "chunks": [digest] * per} for i in range(10)]
    manifest = {"format": "babysitter-checkpoint-manifest", "v": 1, "step": 1, "alg": "sha256", "chunk": 1}
    path = tmp_path / "babysitter-manifest.json"
    path.write_text(json.dumps({**manifest, "files": files}, separators=(",", ":")))
    assert path.stat().st_size > 43_000_000
    growth = _peak_growth_mib(
        "from babysitter.checkpoints.manifest import read_manifest", f"read_manifest(Path({str(path)!r}))"
    )
    assert growth < 8, f"reading the manifest grew the peak RSS by {growth} MiB"


def _zip_with_members(path: Path, members: int) -> None:
    """A ``.pt``-named zip whose central directory lists ``members`` members (zip64 end records, as
    torch.save writes them), each a 0-byte member at offset 0: what ``zipfile`` opens."""
    local = b"PK\x03\x04" + b"\x00" * 26
    entries = []
    for i in range(members):
        name = b"d/%d" % i
        entries.append(
            struct.pack(
                "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0, 0, 0, 0, 0, 0
            )
            + name
        )
    directory = b"".join(entries)
    offset = len(local)
    end64 = offset + len(directory)
    record = b"PK\x06\x06" + struct.pack(
        "<QHHIIQQQQ", 44, 45, 45, 0, 0, members, members, len(directory), offset
    )
    locator = b"PK\x06\x07" + struct.pack("<IQI", 0, end64, 1)
    end = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    path.write_bytes(local + directory + record + locator + end)


def test_a_zip_directory_of_500k_members_is_not_built_into_a_list(tmp_path: Path) -> None:
    """The issue's ``.pt``: 500,000 members. ``zipfile`` built a list of them (+234 MiB, 4.8 s of CPU
    per check on the development VM); now the count in the end record is past the cap and the
    directory is not read."""
    ckpt = tmp_path / "model.pt"
    _zip_with_members(ckpt, 500_000)
    assert len(zipfile.ZipFile(ckpt).infolist()) == 500_000  # a zip archive to zipfile
    size = ckpt.stat().st_size
    growth = _peak_growth_mib(
        "from babysitter.checkpoints.layouts import structure_problems",
        f"print(structure_problems(Path({str(ckpt)!r}), {{'model.pt': {size}}}), file=sys.stderr)",
    )
    assert growth < 8, f"checking the zip directory grew the peak RSS by {growth} MiB"


@pytest.mark.parametrize("how", ["pristine", "prefixed", "truncated", "member past the end", "few members"])
def test_the_zip_directory_reader_agrees_with_zipfile(tmp_path: Path, how: str) -> None:
    """The directory read by hand finds what zipfile finds (every member inside the file)."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "ckpt.pt"
    if how == "few members":
        _zip_with_members(path, 300)
    else:
        torch.save({"w": torch.arange(100)}, path)
    data = path.read_bytes()
    if how == "prefixed":
        data = b"#!/bin/sh\n" + data
    elif how == "truncated":
        data = data[: len(data) - 30]
    elif how == "member past the end":
        at = data.rfind(b"PK\x01\x02")
        data = data[: at + 20] + struct.pack("<I", 1 << 20) + data[at + 24 :]
    path.write_bytes(data)
    try:
        with zipfile.ZipFile(path) as archive:
            fine = all(i.header_offset + i.compress_size <= len(data) for i in archive.infolist())
    except zipfile.BadZipFile:
        fine = False
    problems = structure_problems(path, {"ckpt.pt": len(data)})
    assert (problems == []) == fine, problems


def test_a_flops_config_that_is_deep_or_a_fifo_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``babysitter flops CONFIG`` reads a user's file too: main failed with RecursionError (caught only
    by the CLI's last-resort guard) and blocked on a FIFO."""
    deep = tmp_path / "config.json"
    deep.write_bytes(DEEP)
    assert main(["flops", str(deep), "--seq-len", "128"]) == 1
    assert f"babysitter flops: cannot read {deep}: JSON nested more than 64 deep" in capsys.readouterr().err
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    done = _babysitter("flops", str(fifo), "--seq-len", "128")
    assert done.returncode == 1 and "a FIFO" in done.stderr, done.stderr
