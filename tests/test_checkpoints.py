"""Checkpoints that verify: real saves of a small CPU model in every first-class layout (torch.save,
safetensors, Hugging Face save_pretrained with shards and an index, torch.distributed.checkpoint), each
with the manifest the tracker writes after it; then each broken the way storage and crashes break
them (a truncated shard, one flipped byte in the middle of a shard, a missing manifest, a shard gone,
a save killed half-way) and found by one sentinel pass, named by step and file, while a good
checkpoint is never flagged. The report and remediate's requeue name the newest that verifies.

The saves are made once (module fixture, ~5 s, most of it importing transformers); each case copies
them and breaks its copy.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import babysitter
from babysitter.catalog import integrity as I
from babysitter.catalog import storage as S
from babysitter.checkpoints import build_manifest, checkpoint_statuses, read_manifest, resume_point
from babysitter.checkpoints.manifest import MANIFEST_NAME, ManifestError, manifest_path, parse_manifest
from babysitter.checkpoints.verdicts import VERDICTS_FILE, read_verdicts
from babysitter.checkpoints.verify import ChunkVerifier
from babysitter.cli import main
from babysitter.ledger import DEFAULT_FILE_NAME
from babysitter.ledger.records import CheckpointEnd, CheckpointManifest, Start, decode, encode, to_us
from babysitter.ledger.saves import SaveLog
from babysitter.node.storage.sentinel import CheckpointSentinelCollector
from node_helpers import Scrape, scrape

torch = pytest.importorskip("torch")

CORRUPT, CORRUPT_STEP = S.CHECKPOINT_CORRUPT.name, S.CHECKPOINT_CORRUPT_STEP.name
READ, BUDGET = S.CHECKPOINT_VERIFY_READ.name, S.CHECKPOINT_VERIFY_BUDGET.name
RUN = "ckpt-run"


def _model() -> object:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with four saves made through the tracker: torch.save (step 10), safetensors
    (20), save_pretrained sharded (30), DCP (40); each manifest written in the background."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    run = tmp_path_factory.mktemp("pristine") / "run"
    model = _model()
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32))
    tracker = babysitter.watch(run=RUN, port=-1, run_dir=run, hang_timeout=None, flush_interval=0.05)
    try:
        saves = {
            10: (run / "ckpt-10.pt", lambda p: torch.save(model.state_dict(), p)),
            20: (run / "ckpt-20.safetensors", lambda p: save_file(model.state_dict(), str(p))),
            30: (run / "hf-30", lambda p: hf.save_pretrained(p, max_shard_size="40KB")),
            40: (run / "dcp-40", lambda p: dcp.save({"model": model.state_dict()}, checkpoint_id=str(p))),
        }
        for step, (path, save) in saves.items():
            tracker.step(loss=1.0, step=step)
            with tracker.checkpoint_save(step=step, path=str(path)):
                save(path)
        assert tracker.checkpoint_observer is not None
        assert tracker.checkpoint_observer.wait_idle(30)
    finally:
        tracker.close()
    return run


@pytest.fixture(name="run")
def _run(pristine: Path, tmp_path: Path) -> Path:
    """A copy of the pristine run directory (its ledger's paths are relative: the copy checks its own)."""
    run = tmp_path / "run"
    shutil.copytree(pristine, run, symlinks=True)
    (run / f"{DEFAULT_FILE_NAME}.lock").unlink(missing_ok=True)
    return run


@pytest.fixture(name="sentinel")
def _sentinel() -> Iterator[object]:
    made: list[CheckpointSentinelCollector] = []

    def make(run: Path, **kwargs: object) -> CheckpointSentinelCollector:
        options: dict[str, object] = {"keep_last": 10, "refresh_seconds": 0.0, "wait_seconds": 20.0}
        options.update(reverify_seconds=0.0, walk_seconds=0.0)
        options.update(kwargs)
        collector = CheckpointSentinelCollector([run], **options)  # type: ignore[arg-type]
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.close()


def corrupt_of(s: Scrape, run: str = RUN) -> tuple[float, dict[str, str] | None]:
    """(how many fail verification, the labels and step of the newest failing one)."""
    worst = [x for x in s.samples if x.name == CORRUPT_STEP]
    labels = {**worst[0].labels, "step": f"{worst[0].value:g}"} if worst else None
    return s.value(CORRUPT, run=run), labels


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def truncate_half(path: Path) -> None:
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


def test_every_layout_gets_a_manifest_and_a_good_checkpoint_is_never_flagged(run: Path, sentinel) -> None:
    layouts = {}
    for step, name in ((10, "ckpt-10.pt"), (20, "ckpt-20.safetensors"), (30, "hf-30"), (40, "dcp-40")):
        manifest, _mid = read_manifest(manifest_path(run / name))
        assert manifest.step == step and manifest.run == RUN and manifest.alg == "sha256"
        layouts[manifest.layout] = sorted(f.path for f in manifest.files)
    assert set(layouts) == {"torch", "safetensors", "hf", "dcp"}
    hf_files = layouts["hf"]
    assert "model.safetensors.index.json" in hf_files and "config.json" in hf_files
    assert len([f for f in hf_files if f.endswith(".safetensors")]) >= 2  # sharded
    assert layouts["dcp"] == [".metadata", "__0_0.distcp"]
    records = [json.loads(line) for line in (run / DEFAULT_FILE_NAME).read_text().splitlines()]
    assert [r["step"] for r in records if r["k"] == "cke" and r.get("man")] == [10, 20, 30, 40]
    assert [(r["step"], r["ok"]) for r in records if r["k"] == "ckv"] == [(s, True) for s in (10, 20, 30, 40)]
    c = sentinel(run)
    total = sum(
        read_manifest(manifest_path(run / n))[0].nbytes
        for n in os.listdir(run)
        if "-" in n and ".json" not in n
    )
    for _ in range(3):  # a digest sweep of everything every pass (reverify_seconds=0): never a flag
        s = scrape(c)
        assert corrupt_of(s) == (0, None)
        assert s.value(S.CHECKPOINT_MISSING.name, run=RUN) == 0
    assert s.value(READ) == 3 * total  # every byte read back, each pass, within the 1 GiB budget
    assert s.value(BUDGET) == 1 << 30
    verdicts = read_verdicts(run)
    assert sorted(step for step, _ in verdicts) == [10, 20, 30, 40] and all(v.ok for v in verdicts.values())
    statuses = checkpoint_statuses(run)
    assert [(x.step, x.status) for x in statuses] == [(s, "verified") for s in (10, 20, 30, 40)]
    assert resume_point(statuses).step == 40  # type: ignore[union-attr]
    assert main(["checkpoint", "verify", str(run / "hf-30")]) == 0


CASES = {
    # case: (checkpoint, what to break, how) -> the step, file and reason the sentinel must name
    "truncated DCP shard": ("dcp-40", "__0_0.distcp", truncate_half, (40, "__0_0.distcp", "size")),
    "flipped byte in a DCP shard": (
        "dcp-40",
        "__0_0.distcp",
        flip_middle_byte,
        (40, "__0_0.distcp", "digest"),
    ),
    "flipped byte in a HF shard": (
        "hf-30",
        "model-00002-of-00002.safetensors",
        flip_middle_byte,
        (30, "model-00002-of-00002.safetensors", "digest"),
    ),
    "truncated safetensors file": (
        "",
        "ckpt-20.safetensors",
        truncate_half,
        (20, "ckpt-20.safetensors", "size"),
    ),
    "flipped byte in a torch.save file": ("", "ckpt-10.pt", flip_middle_byte, (10, "ckpt-10.pt", "digest")),
    "missing manifest": ("dcp-40", MANIFEST_NAME, Path.unlink, (40, "-", "no_manifest")),
    "a DCP shard deleted": ("dcp-40", "__0_0.distcp", Path.unlink, (40, "__0_0.distcp", "missing_file")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_sentinel_pass_names_the_broken_checkpoint_step_and_file(
    case: str, run: Path, sentinel, caplog: pytest.LogCaptureFixture
) -> None:
    where, name, breaks, (step, file, reason) = CASES[case]
    target = run / where / name if where else run / name
    if where == "hf-30":
        shards = sorted((run / where).glob("model-*.safetensors"))
        target, file = shards[-1], shards[-1].name  # the last shard, whatever the count
    breaks(target)
    with caplog.at_level(logging.WARNING, logger="babysitter.node.storage.sentinel"):
        s = scrape(sentinel(run))
    count, labels = corrupt_of(s)
    assert count == 1, (case, [x for x in s.samples if x.name.startswith("checkpoint_")])  # nothing else
    assert labels is not None
    assert (labels["step"], labels["file"], labels["reason"]) == (str(step), file, reason)
    logged = [r.getMessage() for r in caplog.records if f"step {step}" in r.getMessage()]
    assert logged and RUN in logged[0] and (file == "-" or file in logged[0]), logged
    statuses = {x.step: x for x in checkpoint_statuses(run)}
    assert statuses[step].status in ("corrupt", "incomplete"), statuses[step]
    assert all(x.status == "verified" for k, x in statuses.items() if k != step)
    assert resume_point(list(statuses.values())).step == (30 if step == 40 else 40)  # type: ignore[union-attr]


def test_a_digest_mismatch_found_by_the_sentinel_reaches_the_report_and_the_requeue(
    run: Path, sentinel, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sizes and headers cannot see a flipped byte; the sentinel's verdict file carries it to
    ``babysitter report`` and to remediate's note, which then name the checkpoint before it."""
    from babysitter.remediate.alerts import Alert
    from babysitter.remediate.engine import Remediation
    from babysitter.remediate.runs import note

    flip_middle_byte(run / "dcp-40" / "__0_0.distcp")
    assert resume_point(checkpoint_statuses(run)).step == 40  # type: ignore[union-attr]  # unseen yet
    scrape(sentinel(run))
    assert (run / VERDICTS_FILE).exists()
    assert main(["report", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checkpoints"]["resume"]["step"] == 30
    bad = next(x for x in out["checkpoints"]["statuses"] if x["step"] == 40)
    assert (bad["status"], bad["reason"], bad["file"]) == ("corrupt", "digest", "__0_0.distcp")
    alert = Alert("firing", {"alertname": "GpuXidCritical", "instance": "n1"}, {}, 1.0, None, "fp")
    line = note(Remediation(2.0, "requeue", "12", "n1", "n1", alert, "x", False, (RUN,)), RUN, run)
    assert (line["resume_step"], line["resume_verified"]) == (30, True)
    assert line["resume_skipped"] == [
        {"step": 40, "status": "corrupt", "reason": "digest", "file": "__0_0.distcp"}
    ]
    assert main(["checkpoint", "verify", str(run / "dcp-40")]) == 1
    assert "digest: __0_0.distcp: bytes" in capsys.readouterr().out


KILLED = """
import os, signal, sys
import babysitter
run, half = sys.argv[1], sys.argv[2]

class Never:
    def done(self):
        return False

t = babysitter.watch(run="killed", port=-1, run_dir=run, hang_timeout=None, flush_interval=0.05)
with t.checkpoint_save(step=1, path=os.path.join(run, "ckpt-1.bin")):
    open(os.path.join(run, "ckpt-1.bin"), "wb").write(b"\\x01" * 5000)
t.checkpoint_observer.wait_idle(10)
# Step 2: the save's block ends, its manifest waits for an asynchronous save that never finishes.
with t.checkpoint_save(step=2, path=os.path.join(run, "ckpt-2")) as c:
    os.makedirs(os.path.join(run, "ckpt-2"))
    open(os.path.join(run, "ckpt-2", "shard-0"), "wb").write(b"\\x02" * 5000)
    c.manifest_after(Never())
# Step 3: killed half-way through writing.
with t.checkpoint_save(step=3, path=half):
    os.makedirs(half)
    open(os.path.join(half, "shard-0"), "wb").write(b"\\x03" * 5000)
    t._events.flush(durable=True)
    import time; time.sleep(0.5)  # the begin record reaches the file
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_saves_killed_half_way_are_flagged_and_never_resumed_from(tmp_path: Path, sentinel) -> None:
    run = tmp_path / "run"
    half = run / "ckpt-3"
    done = subprocess.run([sys.executable, "-c", KILLED, str(run), str(half)], timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL
    c = sentinel(run, manifest_grace=0.5, abort_after=0.5)
    time.sleep(0.6)
    s = scrape(c)
    checks = {check.step: check for check in c.check_now()[0].checks}
    assert checks[1].verified
    assert (checks[2].corrupt, checks[2].reason) == (True, "no_manifest")  # promised, never committed
    assert (checks[3].corrupt, checks[3].reason) == (True, "incomplete")  # began, never ended
    assert "never ended" in checks[3].detail
    labels = [x.labels for x in s.samples if x.name == CORRUPT_STEP]
    assert s.value(CORRUPT, run="killed") == 2 and labels[0]["reason"] == "incomplete"
    statuses = checkpoint_statuses(run, now=time.time() + 7200)  # long after: nothing is still pending
    assert [(x.step, x.status) for x in statuses] == [(1, "verified"), (2, "incomplete"), (3, "incomplete")]
    assert resume_point(statuses).step == 1  # type: ignore[union-attr]


def test_an_incomplete_save_gets_no_manifest_and_a_blocking_manifest_is_there_when_the_block_ends(
    tmp_path: Path, sentinel
) -> None:
    """The manifest thread checks the structure first: a safetensors file shorter than its header
    says (a short write the save did not notice) gets no manifest, the ledger says why, the sentinel
    says incomplete. ``manifest="blocking"`` hashes inside the save's timed block."""
    from safetensors.torch import save_file

    run = tmp_path / "run"
    state = {"w": torch.arange(4096, dtype=torch.float32)}
    t = babysitter.watch(run="short", port=-1, run_dir=run, hang_timeout=None, flush_interval=0.05)
    try:
        short = run / "short.safetensors"
        with t.checkpoint_save(step=5, path=str(short)):
            save_file(state, str(short))
            truncate_half(short)
        good = run / "good.safetensors"
        with t.checkpoint_save(step=6, path=str(good), manifest="blocking"):
            save_file(state, str(good))
        assert manifest_path(good).exists()  # before the next line runs: the block waited for it
        assert t.checkpoint_observer.wait_idle(10)  # type: ignore[union-attr]
    finally:
        t.close()
    assert not manifest_path(short).exists()
    ckv = [decode(json.loads(x)) for x in (run / DEFAULT_FILE_NAME).read_text().splitlines() if '"ckv"' in x]
    # Step 5's manifest is made in the background, step 6's inside its block: either may come first.
    assert sorted((r.step, r.ok) for r in ckv) == [(5, False), (6, True)]  # type: ignore[union-attr]
    short_record = next(r for r in ckv if r.step == 5)  # type: ignore[union-attr]
    assert "short.safetensors" in short_record.why and "indexes" in short_record.why  # type: ignore[union-attr]
    checks = {check.step: check for check in sentinel(run).check_now()[0].checks}
    assert (checks[5].corrupt, checks[5].reason) == (True, "incomplete") and checks[6].verified


def test_sampled_digests_stay_within_the_budget_and_find_a_flip(tmp_path: Path, sentinel) -> None:
    """64 KiB chunks of a 1 MiB checkpoint, 128 KiB of digests per pass: each pass reads exactly two
    chunks, a full sweep takes 8 passes, a flipped byte anywhere is found within one sweep."""
    run = tmp_path / "run"
    run.mkdir()
    ckpt = run / "big.bin"
    ckpt.write_bytes(os.urandom(1 << 20))
    assert build_manifest(ckpt, run="big", step=7, chunk=64 << 10).kind == "manifest"
    lines = [
        encode(
            Start(t=to_us(time.time() - 10), pst=to_us(time.time() - 10), id="a1", host="h", pid=1, run="big")
        ),
        encode(
            CheckpointEnd(
                t=to_us(time.time() - 5),
                op="save",
                step=7,
                ok=True,
                nbytes=1 << 20,
                path=str(ckpt),
                manifest=True,
            )
        ),
    ]
    (run / DEFAULT_FILE_NAME).write_bytes(b"".join(lines))
    c = sentinel(run, verify_bytes=128 << 10, reverify_seconds=3600.0, walk_seconds=0.0)
    reads = []
    for _ in range(8):
        reads.append(scrape(c).value(READ))
    assert [b - a for a, b in zip([0.0, *reads[:-1]], reads, strict=True)] == [128 << 10] * 8
    assert scrape(c).value(READ) == 1 << 20  # swept: nothing read until the next sweep is due
    # A new sweep after a flip at a random place: found within 8 passes, each within the budget.
    manifest, mid = read_manifest(manifest_path(ckpt))
    order = ChunkVerifier(ckpt, manifest, seed=mid).order
    chunk = order[5][1]  # the sixth chunk of the sweep: found on the third pass
    data = bytearray(ckpt.read_bytes())
    data[chunk * (64 << 10) + 100] ^= 0x01
    ckpt.write_bytes(bytes(data))
    c.close()  # a sentinel whose sweeps are due at once starts a new sweep, in the same order
    c = sentinel(run, verify_bytes=128 << 10, reverify_seconds=0.0, walk_seconds=0.0)
    passes = 0
    while passes < 8:
        passes += 1
        s = scrape(c)
        if corrupt_of(s, "big")[0]:
            break
    assert passes == 3
    assert corrupt_of(s, "big")[1]["reason"] == "digest"  # type: ignore[index]


def test_ledger_saves_and_manifest_records() -> None:
    """``ckv`` round-trips; a save left open is aborted by the next incarnation or an end; a promised
    manifest its process never committed is 'closed'."""
    record = CheckpointManifest(
        t=5, step=3, path="/c", ok=False, files=2, nbytes=9, alg="sha256", mid="ab", why="x"
    )
    assert decode(json.loads(encode(record, fence="f"))) == record
    saves = SaveLog()
    start = Start(t=1, pst=1, id="i1", host="h", pid=1, run="r")
    saves.add(start)
    saves.add(CheckpointEnd(t=2_000_000, op="save", step=1, ok=True, nbytes=1, path="/a", manifest=True))
    from babysitter.ledger.records import CheckpointBegin, End

    saves.add(CheckpointBegin(t=3_000_000, op="save", step=2, path="/b"))
    assert [s.state for s in saves.saves()] == ["completed"]  # the open save is under way
    assert [s.state for s in saves.saves(now=10.0, abort_after=5.0)] == ["completed", "aborted"]
    saves.add(Start(t=4_000_000, pst=4_000_000, id="i2", host="h", pid=2, run="r"))
    got = {s.step: s for s in saves.saves()}
    assert got[2].state == "aborted" and got[1].closed and got[1].manifest_ok is None
    saves.add(CheckpointBegin(t=5_000_000, op="save", step=3, path="/c"))
    saves.add(End(t=6_000_000, clean=False))
    assert {s.step: s.state for s in saves.saves()}[3] == "aborted"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"files": [{"path": "../etc/passwd", "size": 1, "chunks": []}], "alg": None}, "inside"),
        ({"files": [{"path": "/abs", "size": 1, "chunks": []}], "alg": None}, "inside"),
        ({"files": [{"path": "a", "size": 1, "chunks": ["00"]}]}, "digest per"),
        ({"files": [{"path": "a", "size": -1, "chunks": []}], "alg": None}, "size"),
        ({"alg": "md5"}, "unknown digest"),
        ({"v": 9}, "version"),
        ({"chunk": 1}, "'chunk' must be an integer in \\[65536, 16777216\\]"),
        ({"chunk": 32 << 20}, "'chunk' must be an integer in \\[65536, 16777216\\]"),
    ],
)
def test_a_manifest_from_shared_storage_is_read_strictly(change: dict[str, object], match: str) -> None:
    base = {
        "format": "babysitter-checkpoint-manifest",
        "v": 1,
        "step": 1,
        "alg": "sha256",
        "chunk": 1 << 20,
        "files": [],
    }
    with pytest.raises(ManifestError, match=match):
        parse_manifest(json.dumps({**base, **change}).encode())


def test_manifest_metrics_and_options(tmp_path: Path) -> None:
    """The tracker exports what its manifest thread did; bad options fail at setup; 'off' writes none."""
    with pytest.raises(ValueError, match="checkpoint_manifest"):
        babysitter.watch(run="x", port=-1, hang_timeout=None, checkpoint_manifest="sometimes")
    t = babysitter.watch(run="m", port=-1, hang_timeout=None, flush_interval=0.05)
    try:
        with pytest.raises(ValueError, match="manifest"):
            t.checkpoint_save(step=1, path=str(tmp_path / "x"), manifest="later")
        with t.checkpoint_save(step=1, path=str(tmp_path / "a.bin")):
            (tmp_path / "a.bin").write_bytes(b"a")
        with t.checkpoint_save(step=2, path=str(tmp_path / "b.bin"), manifest=False):
            (tmp_path / "b.bin").write_bytes(b"b")
        with t.checkpoint_save(step=3, path=str(tmp_path / "gone.bin")):
            pass  # nothing written: the manifest thread says so
        assert t.checkpoint_observer.wait_idle(10)  # type: ignore[union-attr]
        s = Scrape(t.event_metrics(["run", "rank"], ["m", "0"]))
        assert s.value(I.CKPT_MANIFESTS.name, result="manifest") == 1
        assert s.value(I.CKPT_MANIFESTS.name, result="failed") == 1
        assert s.find(I.CKPT_MANIFEST_SECONDS.name)
    finally:
        t.close()
    assert manifest_path(tmp_path / "a.bin").exists() and not manifest_path(tmp_path / "b.bin").exists()


def test_the_checkpoint_command_writes_and_verifies_a_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """For checkpoints saved without the tracker: ``manifest`` writes one, ``verify`` exits 0 when it
    matches, 1 with each problem when it does not, 2 when there is no manifest to verify against."""
    ckpt = tmp_path / "step-5"
    ckpt.mkdir()
    torch.save({"w": torch.ones(1000)}, ckpt / "model.pt")
    (ckpt / "optim.bin").write_bytes(os.urandom(3000))
    assert main(["checkpoint", "verify", str(ckpt)]) == 2
    assert main(["checkpoint", "manifest", str(ckpt), "--step", "5", "--run", "r"]) == 0
    assert main(["checkpoint", "verify", str(ckpt), "--json"]) == 0
    capsys.readouterr()
    truncate_half(ckpt / "model.pt")
    assert main(["checkpoint", "verify", str(ckpt), "--sizes-only"]) == 1
    out = capsys.readouterr().out
    assert "size: model.pt:" in out and "(truncated)" in out


def test_a_path_saved_again_in_place_is_never_flagged(tmp_path: Path, sentinel) -> None:
    """``latest.pt`` overwritten by the next save while the previous one's manifest is still being
    made: that manifest is abandoned (its bytes are being replaced), the newer save's is committed,
    and the sentinel checks the path once, against the newest save."""
    import concurrent.futures

    run = tmp_path / "run"
    latest = run / "latest.pt"
    t = babysitter.watch(run="latest", port=-1, run_dir=run, hang_timeout=None, flush_interval=0.05)
    gate: concurrent.futures.Future[None] = concurrent.futures.Future()
    try:
        with t.checkpoint_save(step=1, path=str(latest)) as c:
            torch.save({"w": torch.zeros(4096)}, latest)
            c.manifest_after(gate)  # its hashing waits until the next save has begun
        with t.checkpoint_save(step=2, path=str(latest)):
            gate.set_result(None)
            torch.save({"w": torch.ones(4096)}, latest)
        assert t.checkpoint_observer.wait_idle(10)  # type: ignore[union-attr]
        counts = dict(t.checkpoint_observer.results)  # type: ignore[union-attr]
    finally:
        t.close()
    assert counts == {"skipped": 1, "manifest": 1}
    assert read_manifest(manifest_path(latest))[0].step == 2
    c = sentinel(run)
    checks = c.check_now()[0].checks
    assert [(x.step, x.verified) for x in checks] == [(2, True)]
    assert [(x.step, x.status) for x in checkpoint_statuses(run)] == [(2, "verified")]
