"""The checkpoint sentinel: are the checkpoints the ledger says completed still there, and still what
was written?

Providers delete files (quota sweeps, expired scratch, a wrong ``rm``), storage truncates and flips
bits, and a save can die half-way; a run only learns it when it restarts from such a checkpoint, which
is worse than a deleted one: it fails late or trains on garbage. For each configured run directory the
sentinel reads the ledger's saves (:class:`babysitter.ledger.saves.SaveLog`), takes the last
``keep_last`` distinct steps that completed, and checks each path:

- **exists**: a file must exist and be at least ``nbytes`` long; a directory's regular files (walked
  without following symlinks) must sum to at least ``nbytes``. Larger is fine: frameworks and eval
  jobs add files to checkpoint directories after the save. Without a recorded ``nbytes`` only
  existence is checked; a record without a path, or with a URL (``s3://...``), cannot be checked here
  and is skipped (one log line). A checkpoint that fails this is *missing*.
- **verifies** (where the tracker writes manifests, :mod:`babysitter.checkpoints`): its manifest is
  there (a save whose tracker promised one and whose process ended without committing it, or whose
  manifest thread found it incomplete, did not complete; one still being hashed gets
  ``manifest_grace`` seconds); every listed file has exactly its recorded size (every pass for the
  newest checkpoint, every ``walk_seconds`` for older ones); the headers check out (safetensors,
  ``torch.save`` zip, Hugging Face index; once per manifest); and the chunk digests match, read
  back within ``verify_bytes`` per pass (cached pages dropped first so the bytes come from the
  storage), newest checkpoint first, in a fixed random order per checkpoint (small files first), a
  sweep of each checkpoint every ``reverify_seconds``. A checkpoint that fails this is *corrupt*,
  with the file and the reason. So is a save that began and never ended (its process died, or was
  followed by another) whose path is there: a framework resuming from "the newest directory" would
  pick it.

Relative paths are taken relative to the run directory. The agent must see checkpoint paths where the
trainer wrote them (same mount points).

**Retention.** ``keep_last`` must not exceed how many checkpoints the training job keeps (Lightning's
``save_top_k``, HF's ``save_total_limit``): a checkpoint the job rotated away on purpose looks exactly
like one the provider deleted.

Exports ``checkpoint_missing{run}`` (how many of the checked ones are missing or too small),
``checkpoint_missing_newest_step{run}`` (the newest of those, while there is one),
``checkpoint_corrupt{run}`` and ``checkpoint_corrupt_newest_step{run,file,reason}`` (the same for
checkpoints that fail verification), ``checkpoint_newest_verified_age_seconds{run}``,
``checkpoint_ledger_up{run}``, and the digest I/O it spends: ``checkpoint_verify_read_bytes_total``
against its stated ``checkpoint_verify_budget_bytes`` per pass. ``run`` is the name in the ledger's
first start record, or the directory's name when there is none. Each change of a verdict is also
appended to the run directory's ``babysitter-verdicts.jsonl`` (:mod:`babysitter.checkpoints.verdicts`)
for ``babysitter report`` and requeues.

The file system work runs on a worker thread that ``collect()`` wakes when the last check is older
than ``refresh_seconds``; ``collect()`` waits for it at most ``wait_seconds`` and otherwise serves the
previous result, so a hung mount never hangs the agent's scrape.

**Load on shared storage.** Each pass reads only the ledger bytes appended since the last one
(:class:`LedgerTail`), stats each checkpoint path, and walks a checkpoint directory again only when
its top-level entry changed or ``walk_seconds`` (300 s) passed: a deleted checkpoint (file or whole
directory) is flagged at the next pass, a shard lost inside a directory within ``walk_seconds``.
Digest reads stay within ``verify_bytes`` per pass (1 GiB by default: 34 MB/s at the default 30 s
pass; 0 turns them off), or one 16 MiB chunk per few passes when the budget is smaller than that; an
idle pass saves nothing up. One sentinel per run is enough; running it on every node of a job
multiplies that load.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from prometheus_client.core import Metric

from babysitter.catalog import storage as S
from babysitter.checkpoints.digest import CHUNK
from babysitter.checkpoints.manifest import Manifest, manifest_path
from babysitter.checkpoints.verdicts import Verdict, append_verdict
from babysitter.checkpoints.verify import ChunkVerifier, Problem, check_sizes, check_structure, load_manifest
from babysitter.labels import sanitize_value
from babysitter.ledger import DEFAULT_FILE_NAME, CheckpointRecord
from babysitter.ledger.reader import SAVE_KINDS
from babysitter.ledger.records import SchemaError, decode
from babysitter.ledger.saves import SaveLog, SaveRecord

__all__ = [
    "CheckpointCheck",
    "CheckpointSentinelCollector",
    "LedgerTail",
    "RunCheck",
    "directory_size",
    "run_name",
    "verify",
]

log = logging.getLogger(__name__)

_MAX_WALK = 200_000  # files summed per checkpoint directory; beyond, only existence is checked
_NAME_PROBE_BYTES = 1 << 20  # the run's name is in the ledger's first start record, near the top
_TAIL_CHUNK = 16 << 20  # bytes of new ledger read at a time
_MAX_CACHED_DIRS = 256


class _Record(Protocol):
    """What the sentinel needs of :class:`babysitter.ledger.CheckpointRecord`."""

    @property
    def step(self) -> int: ...
    @property
    def path(self) -> str | None: ...
    @property
    def nbytes(self) -> int | None: ...
    @property
    def time(self) -> float: ...


@dataclass(frozen=True)
class CheckpointCheck:
    """The verdict on one checkpoint: ``missing`` is None when it could not be checked; ``corrupt`` is
    None when it has no manifest to verify against (or was missing), else whether it fails, with the
    ``reason`` and the ``file``."""

    step: int
    path: str
    time: float
    missing: bool | None
    detail: str = ""
    corrupt: bool | None = None
    reason: str = ""
    file: str = ""
    #: The save promised a manifest that is not there yet (still being hashed): not verified yet.
    pending: bool = False
    mid: str = ""

    @property
    def verified(self) -> bool:
        """It is there with its size and, where it has a manifest, matches it (so far)."""
        return self.missing is False and self.corrupt is not True and not self.pending


@dataclass
class RunCheck:
    """The result of checking one run directory."""

    run_dir: Path
    run: str
    ledger_ok: bool
    detail: str = ""
    checks: list[CheckpointCheck] = field(default_factory=list)

    def newest_verified(self) -> CheckpointCheck | None:
        verified = [c for c in self.checks if c.verified]
        return max(verified, key=lambda c: c.time) if verified else None


def directory_size(path: Path, limit: int = _MAX_WALK) -> int | None:
    """Sum of regular file sizes under ``path`` (symlinks not followed); None past ``limit`` files."""
    total = 0
    seen = 0
    stack = [str(path)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    seen += 1
                    if seen > limit:
                        return None
                    total += entry.stat(follow_symlinks=False).st_size
    return total


#: ``size(path, stat_result)`` of a checkpoint directory, None when too large to sum.
DirectorySizer = Callable[[Path, os.stat_result], "int | None"]


def verify(run_dir: Path, record: _Record, dir_size: DirectorySizer | None = None) -> CheckpointCheck:
    """Check one ledger record's checkpoint on disk (see the module doc for the rules)."""
    raw = record.path
    if not raw:
        return CheckpointCheck(record.step, "", record.time, None, "the ledger has no path for it")
    if "://" in raw:
        return CheckpointCheck(record.step, raw, record.time, None, "a URL, not a path on this host")
    path = Path(raw) if os.path.isabs(raw) else run_dir / raw
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            size = dir_size(path, st) if dir_size is not None else directory_size(path)
        elif stat.S_ISREG(st.st_mode):
            size = st.st_size
        else:
            return CheckpointCheck(record.step, raw, record.time, True, "neither a file nor a directory")
    except (FileNotFoundError, NotADirectoryError):
        return CheckpointCheck(record.step, raw, record.time, True, "does not exist")
    except OSError as exc:  # permission, I/O, stale handle: cannot tell whether it is gone
        return CheckpointCheck(record.step, raw, record.time, None, f"cannot check: {exc.strerror or exc}")
    expected = record.nbytes
    if expected is not None and size is not None and size < expected:
        return CheckpointCheck(record.step, raw, record.time, True, f"{size} bytes, ledger says {expected}")
    return CheckpointCheck(record.step, raw, record.time, False)


def _ledger_path(run_dir: Path) -> Path:
    return run_dir / DEFAULT_FILE_NAME


class LedgerTail:
    """The run's saves (:class:`~babysitter.ledger.saves.SaveLog`) for a ledger read again and again.

    A month-long ledger is tens of MB and every node of a job may run a sentinel: re-reading it every
    pass would be a steady read load on the shared file system. This reads only what was appended
    since the last pass (complete lines; a torn last line waits for its newline, a line that is not
    JSON is skipped, as the ledger reader does) and starts over when the file is replaced or
    truncated. It keeps the newest save of at most ``max_steps`` steps.
    """

    def __init__(self, path: Path, *, max_steps: int = 4096) -> None:
        self.path = path
        self._max_steps = max_steps
        self._ino: int | None = None
        self._offset = 0
        self._tail = b""  # the last bytes before _offset, to notice a file rewritten in place
        self._log = SaveLog(max_steps=max_steps)

    def read(self) -> list[CheckpointRecord]:
        """Completed saves, oldest first; FileNotFoundError when there is no ledger."""
        return [
            CheckpointRecord(step=s.step, path=s.path, nbytes=s.nbytes, time=s.time)
            for s in self.saves()
            if s.state == "completed"
        ]

    def saves(self, *, now: float | None = None, abort_after: float | None = None) -> list[SaveRecord]:
        """Completed and aborted saves, oldest first; FileNotFoundError when there is no ledger."""
        with self.path.open("rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "the ledger is not a regular file", str(self.path))
            # Replaced (new inode), truncated, or deleted and recreated on a reused inode (the bytes
            # before our offset changed): read it from the start.
            if (
                st.st_ino != self._ino
                or st.st_size < self._offset
                or os.pread(fh.fileno(), len(self._tail), self._offset - len(self._tail)) != self._tail
            ):
                self._ino, self._offset, self._tail = st.st_ino, 0, b""
                self._log = SaveLog(max_steps=self._max_steps)
            fh.seek(self._offset)
            while True:
                data = fh.read(_TAIL_CHUNK)
                end = data.rfind(b"\n")
                if end < 0:
                    break
                self._offset += end + 1
                self._tail = (self._tail + data[: end + 1])[-64:]
                self._parse(data[: end + 1])
                fh.seek(self._offset)
                if len(data) < _TAIL_CHUNK:
                    break
        return self._log.saves(now=now, abort_after=abort_after)

    def _parse(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if not any(kind in line for kind in SAVE_KINDS):
                continue
            try:
                self._log.add(decode(json.loads(line)))
            except (ValueError, SchemaError):
                continue


class _SizeCache:
    """Directory sizes, walked again only when the top directory changed or ``walk_seconds`` passed.

    A sharded checkpoint has thousands of files; walking each of the last K every pass, on every
    node, is a metadata storm on Lustre/NFS. Deleting the whole directory is still seen at once (the
    top-level stat fails); a shard lost deep inside is seen within ``walk_seconds``.
    """

    def __init__(self, walk_seconds: float) -> None:
        self.walk_seconds = walk_seconds
        self.walks = 0
        self._cache: dict[Path, tuple[int, int, float, int | None]] = {}

    def size(self, path: Path, st: os.stat_result) -> int | None:
        now = time.monotonic()
        cached = self._cache.get(path)
        if cached is not None:
            ino, mtime, walked, size = cached
            if ino == st.st_ino and mtime == st.st_mtime_ns and now - walked < self.walk_seconds:
                return size
        size = directory_size(path)
        self.walks += 1
        self._cache[path] = (st.st_ino, st.st_mtime_ns, now, size)
        if len(self._cache) > _MAX_CACHED_DIRS:  # checkpoints that left the last K: forget the oldest
            del self._cache[min(self._cache, key=lambda p: self._cache[p][2])]
        return size


def run_name(run_dir: Path) -> str | None:
    """The run's name from the ledger's first start record; None when there is none (yet)."""
    try:
        with _ledger_path(run_dir).open("rb") as fh:
            head = fh.read(_NAME_PROBE_BYTES)
    except OSError:
        return None
    for line in head.split(b"\n"):
        if b'"k":"start"' not in line.replace(b" ", b""):
            continue
        try:
            name = json.loads(line).get("run")
        except (ValueError, AttributeError):
            continue
        if isinstance(name, str) and name:
            return name
    return None


_UNCHECKED = Problem("", "", "")


@dataclass
class _Manifested:
    """What the sentinel knows of one checkpoint's manifest across passes."""

    key: tuple[int, int, int]  # the manifest file's inode, mtime and size: a new one starts over
    manifest: Manifest | None
    mid: str
    problem: Problem | None  # the manifest itself is unreadable
    verifier: ChunkVerifier | None
    sizes_at: float | None = None
    size_problem: Problem | None = None
    structure: Problem | None = _UNCHECKED
    digest_problem: Problem | None = None
    swept_at: float | None = None


class _Verifications:
    """Manifest checks of the checkpoints being watched, and the digest budget they share."""

    def __init__(
        self, *, verify_bytes: int, reverify_seconds: float, walk_seconds: float, drop_cache: bool
    ) -> None:
        self.budget = verify_bytes
        self.reverify_seconds = reverify_seconds
        self.walk_seconds = walk_seconds
        self.drop_cache = drop_cache
        self.read_bytes = 0
        self._credit = 0
        self._states: dict[Path, _Manifested] = {}
        self._seen: set[Path] = set()
        self._starved = False

    def begin_pass(self) -> None:
        # Budget a pass could not spend (its next chunk did not fit) carries over up to one chunk, so a
        # chunk larger than the budget still gets read, and no pass reads more than max(budget, chunk).
        self._credit = min(self._credit + self.budget, max(self.budget, CHUNK)) if self.budget > 0 else 0
        self._seen = set()
        self._starved = False

    def end_pass(self) -> None:
        if not self._starved:
            self._credit = 0  # nothing was left to read: idle passes save up nothing
        for path in [p for p in self._states if p not in self._seen]:
            del self._states[path]  # left the last K: forget it (bounded memory)

    def _state(self, path: Path) -> _Manifested | None:
        try:
            st = os.stat(manifest_path(path))
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        state = self._states.get(path)
        if state is None or state.key != key:
            manifest, mid, problem = load_manifest(path)
            verifier = None
            if manifest is not None:
                verifier = ChunkVerifier(path, manifest, seed=mid, drop_cache=self.drop_cache)
            state = _Manifested(key, manifest, mid, problem, verifier)
            self._states[path] = state
        return state

    def check(self, path: Path, *, newest: bool) -> _Manifested | None:
        """The checkpoint's manifest state after this pass's checks; None when it has no manifest."""
        self._seen.add(path)
        state = self._state(path)
        if state is None or state.manifest is None or state.verifier is None:
            return state
        now = time.monotonic()
        if newest or state.sizes_at is None or now - state.sizes_at >= self.walk_seconds:
            state.size_problem = check_sizes(path, state.manifest)
            state.sizes_at = now
            if state.size_problem is not None:
                state.structure = _UNCHECKED  # the files changed: look at their headers again
        if state.size_problem is not None:
            return state
        if state.structure is _UNCHECKED:
            state.structure = check_structure(path, state.manifest)
        if state.structure is not None:
            return state
        verifier = state.verifier
        if verifier.next_length() is None:
            if state.swept_at is not None and now - state.swept_at >= self.reverify_seconds:
                verifier.restart()
                state.swept_at = None
            else:
                return state
        problem, used = verifier.verify(self._credit)
        self._credit -= used
        self.read_bytes += used
        self._starved = self._starved or (problem is None and verifier.next_length() is not None)
        if problem is not None or used:  # a bad chunk stays bad until it was read again
            state.digest_problem = problem
        if verifier.next_length() is None and state.digest_problem is None:
            state.swept_at = now
        return state


def _newest_per_path(saves: Iterable[SaveRecord]) -> list[SaveRecord]:
    """Oldest first, each path's newest save only: a save overwritten in place (``latest.pt``) by a
    later one is gone on purpose, not missing, and its manifest is the later save's."""
    by_path: dict[str, SaveRecord] = {}
    for save in sorted(saves, key=lambda r: r.time):
        by_path[save.path or f"\x00step {save.step}"] = save
    return sorted(by_path.values(), key=lambda r: r.time)


def _problem_of(state: _Manifested) -> Problem | None:
    structure = None if state.structure is _UNCHECKED else state.structure
    return state.problem or state.size_problem or structure or state.digest_problem


class CheckpointSentinelCollector:
    """The ``sentinel`` collector: verifies the last ``keep_last`` checkpoints of each run directory.

    ``read_ledger`` replaces the ledger's saves (for tests and other manifest formats); ``clock`` is
    wall time (ledger times are Unix seconds). ``verify_bytes``: digest bytes read per pass (0: sizes
    and structure only); ``reverify_seconds``: how often a verified checkpoint's digests are swept
    again; ``manifest_grace``: how long a promised manifest may take; ``abort_after``: how long a save
    may stay under way before it counts as aborted; ``verdicts``: append changed verdicts to the run
    directory's ``babysitter-verdicts.jsonl``.
    """

    name = "sentinel"

    def __init__(
        self,
        run_dirs: Sequence[Path],
        *,
        keep_last: int = 3,
        refresh_seconds: float = 30.0,
        wait_seconds: float = 2.0,
        walk_seconds: float = 300.0,
        verify_bytes: int = 1 << 30,
        reverify_seconds: float = 6 * 3600.0,
        manifest_grace: float = 1800.0,
        abort_after: float = 3600.0,
        verdicts: bool = True,
        drop_cache: bool = True,
        read_ledger: Callable[[Path], Sequence[_Record]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if not refresh_seconds >= 0 or not wait_seconds >= 0 or not walk_seconds >= 0:
            raise ValueError("refresh_seconds, wait_seconds and walk_seconds must be >= 0")
        if isinstance(verify_bytes, bool) or not isinstance(verify_bytes, int) or verify_bytes < 0:
            raise ValueError(f"verify_bytes must be an int >= 0, got {verify_bytes!r}")
        if not reverify_seconds >= 0 or not manifest_grace >= 0 or not abort_after > 0:
            raise ValueError("reverify_seconds and manifest_grace must be >= 0, abort_after > 0")
        self.run_dirs = list(dict.fromkeys(Path(p) for p in run_dirs))
        if not self.run_dirs:
            raise ValueError("the checkpoint sentinel needs at least one run directory")
        self.keep_last = keep_last
        self._refresh = float(refresh_seconds)
        self._wait = float(wait_seconds)
        self._read = read_ledger
        self._tails = {d: LedgerTail(_ledger_path(d)) for d in self.run_dirs}
        self.sizes = _SizeCache(float(walk_seconds))
        self.verifications = _Verifications(
            verify_bytes=verify_bytes,
            reverify_seconds=float(reverify_seconds),
            walk_seconds=float(walk_seconds),
            drop_cache=drop_cache,
        )
        self.manifest_grace = float(manifest_grace)
        self.abort_after = float(abort_after)
        self._verdicts = verdicts
        self._verdicts_written: dict[tuple[Path, int], tuple[object, ...]] = {}
        self._verdicts_failed: set[Path] = set()
        self._clock = clock
        self._names: dict[Path, str] = {}
        self._lock = threading.Lock()
        self._results: list[RunCheck] = []
        self._checked_at: float | None = None
        self._busy = False
        self._kick = threading.Event()
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported: dict[tuple[Path, str], str] = {}  # what was last logged per (run dir, subject)
        if verify_bytes:
            per_second = verify_bytes / max(self._refresh, 1.0)
            log.info(
                "babysitter: checkpoint sentinel: verifying digests within %.0f MiB per pass (at most "
                "%.1f MB/s of reads at one pass every %.0f s), a sweep of each checkpoint every %.1f h",
                verify_bytes / (1 << 20),
                per_second / 1e6,
                self._refresh,
                reverify_seconds / 3600,
            )

    def start(self) -> None:
        """Start the worker thread (idempotent; ``collect()`` calls it)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._loop, name="babysitter-checkpoint-sentinel", daemon=True
            )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def collect(self) -> Iterable[Metric]:
        self.start()
        now = time.monotonic()
        with self._lock:
            due = not self._busy and (self._checked_at is None or now - self._checked_at >= self._refresh)
            if due:
                self._busy = True
                self._done.clear()
                self._kick.set()
        if due:
            self._done.wait(self._wait)
        with self._lock:
            results = list(self._results)
        missing = S.CHECKPOINT_MISSING.family()
        missing_step = S.CHECKPOINT_MISSING_STEP.family()
        corrupt = S.CHECKPOINT_CORRUPT.family()
        corrupt_step = S.CHECKPOINT_CORRUPT_STEP.family()
        age = S.CHECKPOINT_NEWEST_VERIFIED_AGE.family()
        ledger_up = S.CHECKPOINT_LEDGER_UP.family()
        read = S.CHECKPOINT_VERIFY_READ.family()
        budget = S.CHECKPOINT_VERIFY_BUDGET.family()
        wall = self._clock()
        for result in results:
            ledger_up.add_metric([result.run], 1.0 if result.ledger_ok else 0.0)  # type: ignore[attr-defined]
            checked = [c for c in result.checks if c.missing is not None]
            gone = [c.step for c in checked if c.missing]
            if checked:
                missing.add_metric([result.run], float(len(gone)))  # type: ignore[attr-defined]
            if gone:
                missing_step.add_metric([result.run], float(max(gone)))  # type: ignore[attr-defined]
            bad = [c for c in result.checks if c.corrupt]
            if checked:
                corrupt.add_metric([result.run], float(len(bad)))  # type: ignore[attr-defined]
            if bad:
                worst = max(bad, key=lambda c: c.step)
                labels = [result.run, sanitize_value(worst.file) or "-", worst.reason or "incomplete"]
                corrupt_step.add_metric(labels, float(worst.step))  # type: ignore[attr-defined]
            newest = result.newest_verified()
            if newest is not None:
                age.add_metric([result.run], max(0.0, wall - newest.time))  # type: ignore[attr-defined]
        read.add_metric([], float(self.verifications.read_bytes))  # type: ignore[attr-defined]
        budget.add_metric([], float(self.verifications.budget))  # type: ignore[attr-defined]
        return [missing, missing_step, corrupt, corrupt_step, age, ledger_up, read, budget]

    def check_now(self) -> list[RunCheck]:
        """Check every run directory on the calling thread (what the worker does)."""
        results: list[RunCheck] = []
        labels: set[str] = set()
        self.verifications.begin_pass()
        for run_dir in self.run_dirs:
            result = self._check(run_dir)
            if result.run in labels:  # two directories with one run name: keep series apart
                result.run = sanitize_value(str(run_dir)) or result.run
            labels.add(result.run)
            results.append(result)
            self._log_changes(result)
            self._write_verdicts(result)
        self.verifications.end_pass()
        return results

    def _loop(self) -> None:
        while True:
            self._kick.wait()
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                results = self.check_now()
            except Exception:  # a bug: keep the previous results, try again next time
                log.exception("babysitter: checkpoint sentinel check failed")
                results = None
            with self._lock:
                if results is not None:
                    self._results = results
                self._checked_at = time.monotonic()
                self._busy = False
            self._done.set()

    def _saves(self, run_dir: Path, wall: float) -> list[SaveRecord]:
        if self._read is None:
            return self._tails[run_dir].saves(now=wall, abort_after=self.abort_after)
        return [
            r if isinstance(r, SaveRecord) else SaveRecord(r.step, r.path, r.nbytes, r.time)
            for r in self._read(run_dir)
        ]

    def _check(self, run_dir: Path) -> RunCheck:
        name = self._names.get(run_dir)
        if name is None:
            found = run_name(run_dir)
            name = sanitize_value(found or run_dir.name) or "run"
            if found:
                self._names[run_dir] = name
        wall = self._clock()
        try:
            saves = self._saves(run_dir, wall)
        except FileNotFoundError:
            return RunCheck(run_dir, name, False, "no ledger in this directory")
        except OSError as exc:
            return RunCheck(run_dir, name, False, f"cannot read the ledger: {exc.strerror or exc}")
        newest: dict[int, SaveRecord] = {}
        for save in saves:  # oldest first; a step saved again after a restart keeps its newest record
            newest[save.step] = save
        ordered = _newest_per_path(newest.values())
        done = [s for s in ordered if s.state == "completed"][-self.keep_last :]
        since = done[0].time if done else 0.0
        aborted = [s for s in ordered if s.state == "aborted" and s.time >= since][-self.keep_last :]
        checks = []
        for i, save in enumerate(reversed(done)):  # newest first: it gets the digest budget first
            checks.append(self._verify(run_dir, save, wall, newest=i == 0))
        checks.reverse()
        checks.extend(c for c in (self._aborted(run_dir, s) for s in aborted) if c is not None)
        return RunCheck(run_dir, name, True, checks=checks)

    def _verify(self, run_dir: Path, save: SaveRecord, wall: float, *, newest: bool) -> CheckpointCheck:
        check = verify(run_dir, save, self.sizes.size)
        if check.missing is not False or not save.path:
            return check
        path = Path(save.path) if os.path.isabs(save.path) else run_dir / save.path
        try:
            state = self.verifications.check(path, newest=newest)
        except OSError as exc:  # the manifest cannot be stat'ed: cannot tell
            return replace(check, detail=f"cannot check its manifest: {exc.strerror or exc}")
        if state is None:
            if not save.manifest:
                return check  # a tracker that writes no manifests: existence and size only
            if save.manifest_ok is False:
                return replace(check, corrupt=True, reason="incomplete", detail=save.why or "incomplete")
            if save.closed or wall - save.time > self.manifest_grace:
                why = (
                    "no manifest: its process ended before committing one (the save did not complete)"
                    if save.closed
                    else f"no manifest {self.manifest_grace:.0f} s after the save (it did not complete, "
                    "or its manifest thread is stuck)"
                )
                return replace(check, corrupt=True, reason="no_manifest", detail=why)
            return replace(check, pending=True, detail="its manifest is still being written")
        problem = _problem_of(state)
        if problem is None:
            return replace(check, corrupt=False, mid=state.mid)
        return replace(
            check,
            corrupt=True,
            reason=problem.reason,
            file=problem.file,
            detail=problem.text(),
            mid=state.mid,
        )

    def _aborted(self, run_dir: Path, save: SaveRecord) -> CheckpointCheck | None:
        """A save that began and never ended: corrupt when its path is there (a half-written checkpoint
        a resume could pick), nothing when it never wrote anything."""
        if not save.path or "://" in save.path:
            return None
        path = Path(save.path) if os.path.isabs(save.path) else run_dir / save.path
        if not os.path.lexists(path):
            return None
        return CheckpointCheck(
            save.step,
            save.path,
            save.time,
            missing=False,
            detail=f"incomplete: the save began at {time.strftime('%H:%M:%S', time.gmtime(save.time))} UTC "
            "and never ended (its process died or moved on); do not resume from it",
            corrupt=True,
            reason="incomplete",
        )

    def _write_verdicts(self, result: RunCheck) -> None:
        """Append each changed verdict to the run directory (for the report and requeues)."""
        if not self._verdicts:
            return
        for check in result.checks:
            if check.corrupt is None:
                continue
            state = (check.corrupt, check.reason, check.file, check.mid)
            key = (result.run_dir, check.step)
            if self._verdicts_written.get(key) == state:
                continue
            verdict = Verdict(
                t=self._clock(),
                step=check.step,
                path=check.path,
                mid=check.mid,
                ok=not check.corrupt,
                reason=check.reason,
                file=check.file,
                detail=check.detail,
            )
            try:
                append_verdict(result.run_dir, verdict)
            except OSError as exc:
                if result.run_dir not in self._verdicts_failed:
                    self._verdicts_failed.add(result.run_dir)
                    log.warning(
                        "babysitter: checkpoint sentinel: cannot write verdicts into %s (%s); the report "
                        "and requeues see only what they check themselves",
                        result.run_dir,
                        exc.strerror or exc,
                    )
                continue
            self._verdicts_written[key] = state
        if len(self._verdicts_written) > 4096:
            self._verdicts_written.clear()

    def _log_changes(self, result: RunCheck) -> None:
        self._report(result.run_dir, "ledger", "" if result.ledger_ok else result.detail, result.run)
        current = {"ledger"}
        for check in result.checks:
            problem = "" if check.missing is False and not check.corrupt else check.detail
            subject = f"step {check.step}"
            current.add(subject)
            self._report(result.run_dir, subject, problem, result.run, check.path)
        for key in [k for k in self._reported if k[0] == result.run_dir and k[1] not in current]:
            del self._reported[key]  # steps that left the last K: forget them (bounded memory)

    def _report(self, run_dir: Path, subject: str, problem: str, run: str, path: str = "") -> None:
        key = (run_dir, subject)
        previous = self._reported.get(key)
        if previous == problem or (previous is None and not problem):
            return
        self._reported[key] = problem
        where = f"run {run!r} ({run_dir}) {subject}" + (f" at {path}" if path else "")
        if problem:
            log.warning("babysitter: checkpoint sentinel: %s: %s", where, problem)
        else:
            log.info("babysitter: checkpoint sentinel: %s is fine again", where)
