"""The checkpoint sentinel: are the checkpoints the ledger says completed still there, at their size?

Providers delete files (quota sweeps, expired scratch, a wrong ``rm``), and a run only learns it when
it restarts from a checkpoint that is gone. For each configured run directory the sentinel reads the
ledger (:func:`babysitter.ledger.completed_checkpoints`), takes the last ``keep_last`` distinct steps,
and checks each path:

- a file must exist and be at least ``nbytes`` long;
- a directory's regular files (walked without following symlinks) must sum to at least ``nbytes``.
  Larger is fine: frameworks and eval jobs add files to checkpoint directories after the save;
- without a recorded ``nbytes`` only existence is checked; a record without a path, or with a URL
  (``s3://...``), cannot be checked here and is skipped (one log line).

Relative paths are taken relative to the run directory. The agent must see checkpoint paths where the
trainer wrote them (same mount points).

**Retention.** ``keep_last`` must not exceed how many checkpoints the training job keeps (Lightning's
``save_top_k``, HF's ``save_total_limit``): a checkpoint the job rotated away on purpose looks exactly
like one the provider deleted.

Exports ``checkpoint_missing{run}`` (how many of the checked ones are missing or too small),
``checkpoint_missing_newest_step{run}`` (the newest of those, while there is one),
``checkpoint_newest_verified_age_seconds{run}`` and ``checkpoint_ledger_up{run}``. ``run`` is the
name in the ledger's first start record, or the directory's name when there is none.

The file system work runs on a worker thread that ``collect()`` wakes when the last check is older
than ``refresh_seconds``; ``collect()`` waits for it at most ``wait_seconds`` and otherwise serves the
previous result, so a hung mount never hangs the agent's scrape.

**Load on shared storage.** Each pass reads only the ledger bytes appended since the last one
(:class:`LedgerTail`), stats each checkpoint path, and walks a checkpoint directory again only when
its top-level entry changed or ``walk_seconds`` (300 s) passed: a deleted checkpoint (file or whole
directory) is flagged at the next pass, a shard lost inside a directory within ``walk_seconds``.
One sentinel per run is enough; running it on every node of a job multiplies that load.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prometheus_client.core import Metric

from babysitter.catalog import storage as S
from babysitter.labels import sanitize_value
from babysitter.ledger import DEFAULT_FILE_NAME, CheckpointRecord
from babysitter.ledger.records import CheckpointEnd, SchemaError, decode

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
    """The verdict on one checkpoint: ``missing`` is None when it could not be checked."""

    step: int
    path: str
    time: float
    missing: bool | None
    detail: str = ""


@dataclass
class RunCheck:
    """The result of checking one run directory."""

    run_dir: Path
    run: str
    ledger_ok: bool
    detail: str = ""
    checks: list[CheckpointCheck] = field(default_factory=list)

    def newest_verified(self) -> CheckpointCheck | None:
        verified = [c for c in self.checks if c.missing is False]
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
    """:func:`babysitter.ledger.completed_checkpoints` for a ledger read again and again.

    A month-long ledger is tens of MB and every node of a job may run a sentinel: re-reading it every
    pass would be a steady read load on the shared file system. This reads only what was appended
    since the last pass (complete lines; a torn last line waits for its newline, a line that is not
    JSON is skipped, as the ledger reader does) and starts over when the file is replaced or
    truncated. It keeps the newest record of at most ``max_steps`` steps.
    """

    def __init__(self, path: Path, *, max_steps: int = 4096) -> None:
        self.path = path
        self._max_steps = max_steps
        self._ino: int | None = None
        self._offset = 0
        self._tail = b""  # the last bytes before _offset, to notice a file rewritten in place
        self._by_step: OrderedDict[int, CheckpointRecord] = OrderedDict()

    def read(self) -> list[CheckpointRecord]:
        """Completed saves, oldest first; FileNotFoundError when there is no ledger."""
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
                self._by_step.clear()
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
        return sorted(self._by_step.values(), key=lambda r: r.time)

    def _parse(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if b'"k":"cke"' not in line:
                continue
            try:
                record = decode(json.loads(line))
            except (ValueError, SchemaError):
                continue
            if isinstance(record, CheckpointEnd) and record.op == "save" and record.ok:
                self._by_step.pop(record.step, None)
                self._by_step[record.step] = CheckpointRecord(
                    step=record.step, path=record.path, nbytes=record.nbytes, time=record.t / 1_000_000
                )
                while len(self._by_step) > self._max_steps:
                    self._by_step.popitem(last=False)


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


class CheckpointSentinelCollector:
    """The ``sentinel`` collector: verifies the last ``keep_last`` checkpoints of each run directory.

    ``read_ledger`` replaces :func:`babysitter.ledger.completed_checkpoints` (for tests and other
    manifest formats); ``clock`` is wall time (ledger times are Unix seconds).
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
        read_ledger: Callable[[Path], Sequence[_Record]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if not refresh_seconds >= 0 or not wait_seconds >= 0 or not walk_seconds >= 0:
            raise ValueError("refresh_seconds, wait_seconds and walk_seconds must be >= 0")
        self.run_dirs = list(dict.fromkeys(Path(p) for p in run_dirs))
        if not self.run_dirs:
            raise ValueError("the checkpoint sentinel needs at least one run directory")
        self.keep_last = keep_last
        self._refresh = float(refresh_seconds)
        self._wait = float(wait_seconds)
        self._read = read_ledger
        self._tails = {d: LedgerTail(_ledger_path(d)) for d in self.run_dirs}
        self.sizes = _SizeCache(float(walk_seconds))
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
        age = S.CHECKPOINT_NEWEST_VERIFIED_AGE.family()
        ledger_up = S.CHECKPOINT_LEDGER_UP.family()
        wall = self._clock()
        for result in results:
            ledger_up.add_metric([result.run], 1.0 if result.ledger_ok else 0.0)  # type: ignore[attr-defined]
            checked = [c for c in result.checks if c.missing is not None]
            gone = [c.step for c in checked if c.missing]
            if checked:
                missing.add_metric([result.run], float(len(gone)))  # type: ignore[attr-defined]
            if gone:
                missing_step.add_metric([result.run], float(max(gone)))  # type: ignore[attr-defined]
            newest = result.newest_verified()
            if newest is not None:
                age.add_metric([result.run], max(0.0, wall - newest.time))  # type: ignore[attr-defined]
        return [missing, missing_step, age, ledger_up]

    def check_now(self) -> list[RunCheck]:
        """Check every run directory on the calling thread (what the worker does)."""
        results: list[RunCheck] = []
        labels: set[str] = set()
        for run_dir in self.run_dirs:
            result = self._check(run_dir)
            if result.run in labels:  # two directories with one run name: keep series apart
                result.run = sanitize_value(str(run_dir)) or result.run
            labels.add(result.run)
            results.append(result)
            self._log_changes(result)
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

    def _check(self, run_dir: Path) -> RunCheck:
        name = self._names.get(run_dir)
        if name is None:
            found = run_name(run_dir)
            name = sanitize_value(found or run_dir.name) or "run"
            if found:
                self._names[run_dir] = name
        try:
            records = list(self._read(run_dir) if self._read is not None else self._tails[run_dir].read())
        except FileNotFoundError:
            return RunCheck(run_dir, name, False, "no ledger in this directory")
        except OSError as exc:
            return RunCheck(run_dir, name, False, f"cannot read the ledger: {exc.strerror or exc}")
        newest: dict[int, _Record] = {}
        for record in records:  # newest last; a step saved again after a restart keeps its newest record
            newest[record.step] = record
        last = sorted(newest.values(), key=lambda r: r.time)[-self.keep_last :]
        return RunCheck(run_dir, name, True, checks=[verify(run_dir, r, self.sizes.size) for r in last])

    def _log_changes(self, result: RunCheck) -> None:
        self._report(result.run_dir, "ledger", "" if result.ledger_ok else result.detail, result.run)
        current = {"ledger"}
        for check in result.checks:
            problem = "" if check.missing is False else check.detail
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
