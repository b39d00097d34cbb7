"""One run directory's checkpoint checks, as the sentinel's worker for that run does them.

The worker runs as the user who controls the run directory (:mod:`.owner`) with the directory as its
working directory, so every path here is relative to it (``root`` is ``.``). What it may look at,
whatever its rights (defense in depth):

- **Ledger paths stay inside the run directory.** A relative path is taken relative to it; an absolute
  one only when it lies inside it (old ledgers wrote absolute paths), as the directory was configured
  or as the kernel names it; anything else, and any ``..``, is *cannot be checked: outside the run
  directory*. Symbolic links on the way are followed only while they stay inside.
- **Directories that someone else could change are not trusted.** Every directory on the way to a
  checkpoint, the checkpoint directory and each directory holding a file its manifest lists must be
  controlled by the run's owner alone (owned by them or root, writable by no one else but their
  private group): otherwise another user could swap in a link to the owner's private files and learn
  about them from the verdicts. Such a checkpoint *cannot be checked*.
- **Regular files and directories only.** The ledger and a manifest are opened without following a
  final symbolic link and without blocking (``O_NOFOLLOW | O_NONBLOCK``), then ``fstat``-ed; a listed
  file that is a link, a FIFO, a device or a socket makes its checkpoint *cannot be checked*, before
  anything opens it.

The rest (which checkpoints, what makes one missing or corrupt, the digest budget) is the sentinel's
(:mod:`.sentinel`); this module does it for one run.
"""

from __future__ import annotations

import codecs
import errno
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Protocol

from babysitter import jsonin, terminal, userfiles
from babysitter.catalog.storage import CORRUPT_REASONS
from babysitter.checkpoints.manifest import Manifest, manifest_path
from babysitter.checkpoints.verdicts import Verdict, append_verdict
from babysitter.checkpoints.verify import ChunkVerifier, Problem, check_sizes, check_structure, load_manifest
from babysitter.ledger import DEFAULT_FILE_NAME, CheckpointRecord
from babysitter.ledger.reader import MAX_SAVE_LINE, SAVE_KINDS
from babysitter.ledger.records import SchemaError, decode
from babysitter.ledger.saves import SaveLog, SaveRecord

__all__ = [
    "OUTSIDE",
    "CheckpointCheck",
    "LedgerTail",
    "OutOfTime",
    "RunChecker",
    "RunReport",
    "RunSettings",
    "clean",
    "directory_size",
    "resolve",
    "run_name",
    "verify",
]

# A worker may import nothing once it runs as the run's owner (the interpreter itself may live under
# /root): the codecs its readers look up lazily (zipfile decodes member names as cp437, json decodes
# UTF-16 and UTF-32 bytes) are loaded here, in the agent, before any fork.
for _codec in ("cp437", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"):
    codecs.lookup(_codec)

#: The detail of a ledger path the sentinel refuses to look at.
OUTSIDE = "cannot be checked: outside the run directory"
_MAX_WALK = 200_000  # entries walked per checkpoint directory; beyond, only existence is checked
_NAME_PROBE_BYTES = 1 << 20  # the run's name is in the ledger's first start record, near the top
_TAIL_CHUNK = 16 << 20  # bytes of new ledger read at a time
_MAX_CACHED_DIRS = 256
_MAX_LINKS = 40
#: Lengths of what a check carries back to the agent (its log, metrics and the verdicts file).
_MAX_PATH, _MAX_TEXT = 4096, 1024


class OutOfTime(Exception):
    """The worker's share of the pass is spent (a walk or a digest sweep stops, to resume later)."""


class _Outside(Exception):
    """A path that leaves the run directory."""


class _Untrusted(Exception):
    """A directory someone besides the run's owner controls."""


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

    def to_json(self) -> dict[str, object]:
        """What the worker sends back (bounded)."""
        return {
            "step": self.step,
            "path": self.path[:_MAX_PATH],
            "time": self.time,
            "missing": self.missing,
            "detail": self.detail[:_MAX_TEXT],
            "corrupt": self.corrupt,
            "reason": self.reason,
            "file": self.file[:_MAX_TEXT],
            "pending": self.pending,
            "mid": self.mid[:64],
        }

    @classmethod
    def from_json(cls, obj: object) -> CheckpointCheck:
        """A check as a worker sent it; ValueError for anything but what :meth:`to_json` writes (the
        worker runs as a user: its answer is checked like any input)."""
        if type(obj) is not dict:
            raise ValueError("a check must be an object")
        step, when = obj.get("step"), obj.get("time")
        texts = [obj.get(k) for k in ("path", "detail", "reason", "file", "mid")]
        flags = [obj.get(k) for k in ("missing", "corrupt")]
        if type(step) is not int or not 0 <= step < 1 << 62:
            raise ValueError("bad step")
        if not isinstance(when, (int, float)) or isinstance(when, bool) or not math.isfinite(when):
            raise ValueError("bad time")
        if not all(type(t) is str for t in texts) or not all(f is None or type(f) is bool for f in flags):
            raise ValueError("bad fields")
        if type(obj.get("pending")) is not bool or (texts[2] and texts[2] not in CORRUPT_REASONS):
            raise ValueError("bad fields")
        path, detail, reason, file, mid = (str(t) for t in texts)
        missing, corrupt = (None if f is None else bool(f) for f in flags)
        return cls(
            step=step,
            path=clean(path, _MAX_PATH),
            time=float(when),
            missing=missing,
            detail=clean(detail, _MAX_TEXT),
            corrupt=corrupt,
            reason=reason,
            file=clean(file, _MAX_TEXT),
            pending=bool(obj["pending"]),
            mid=clean(mid, 64),
        )


def clean(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters and cleaned as for a terminal (:func:`babysitter.terminal.clean`):
    what a user wrote must not forge log lines or reach a terminal raw."""
    return terminal.clean(text[:limit])


def directory_size(path: Path, limit: int = _MAX_WALK, *, deadline: float | None = None) -> int | None:
    """Sum of regular file sizes under ``path`` (symlinks not followed); None past ``limit`` entries
    (directories count: a tree of empty ones costs the same walk); :class:`OutOfTime` once
    ``time.monotonic()`` passes ``deadline``."""
    total = 0
    seen = 0
    stack = [str(path)]
    while stack:
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > limit:
                    return None
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
                if deadline is not None and not seen % 512 and time.monotonic() > deadline:
                    raise OutOfTime
    return total


#: ``size(path, stat_result)`` of a checkpoint directory, None when too large to sum.
DirectorySizer = Callable[[Path, os.stat_result], "int | None"]


def _prefixes(run_dir: Path, *extra: str) -> tuple[str, ...]:
    """The names of the run directory an absolute ledger path may start with."""
    names = [os.path.normpath(os.path.abspath(run_dir)), *(os.path.normpath(e) for e in extra)]
    return tuple(dict.fromkeys(n.rstrip("/") for n in names if n))


def _inside(path: str, prefixes: Sequence[str]) -> str | None:
    """``path`` relative to the run directory (``.`` for the directory itself), or None when it is an
    absolute path elsewhere or has a ``..``."""
    if "\x00" in path or ".." in PurePosixPath(path).parts:
        return None
    if not os.path.isabs(path):
        rel = path
    else:
        norm = os.path.normpath(path)
        for prefix in prefixes:
            if norm == prefix or norm == prefix + "/":
                rel = "."
                break
            if norm.startswith(prefix + "/"):
                rel = norm[len(prefix) + 1 :]
                break
        else:
            return None
    return "/".join(p for p in rel.split("/") if p not in ("", ".")) or "."


def resolve(
    root: Path,
    path: str,
    prefixes: Sequence[str],
    *,
    trusted: Callable[[os.stat_result], str | None] | None = None,
) -> tuple[str, os.stat_result]:
    """(the path relative to ``root`` with every symbolic link expanded, its ``lstat``) of a ledger
    path, following links only while they stay under ``root``. Raises :class:`_Outside` for a path or
    link that leaves it, :class:`_Untrusted` when ``trusted`` (of a directory's ``lstat``) names
    someone else in control of one on the way, FileNotFoundError, NotADirectoryError or OSError."""
    rel = _inside(path, prefixes)
    if rel is None:
        raise _Outside
    todo = [p for p in reversed(rel.split("/")) if p not in ("", ".")]
    done: list[str] = []
    links = 0
    st = os.lstat(root)
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":  # from a link's target: ``done`` is made of real directories
            if not done:
                raise _Outside
            done.pop()
            st = os.lstat(root.joinpath(*done))
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/".join(done))
        if trusted is not None and (why := trusted(st)):
            raise _Untrusted(f"{'/'.join(done) or 'the run directory'} {why}")
        st = os.lstat(root.joinpath(*done, name))
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            target = os.readlink(root.joinpath(*done, name))
            if os.path.isabs(target):
                mapped = _inside(target, prefixes) if ".." not in PurePosixPath(target).parts else None
                if mapped is None:
                    raise _Outside
                done = []
                target = mapped
            todo.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
            st = os.lstat(root.joinpath(*done))
            continue
        done.append(name)
    if trusted is not None and stat.S_ISDIR(st.st_mode) and (why := trusted(st)):
        raise _Untrusted(f"{'/'.join(done) or 'the run directory'} {why}")
    return "/".join(done) or ".", st


def verify(
    run_dir: Path,
    record: _Record,
    dir_size: DirectorySizer | None = None,
    *,
    prefixes: Sequence[str] = (),
    trusted: Callable[[os.stat_result], str | None] | None = None,
) -> tuple[CheckpointCheck, str | None]:
    """Check one ledger record's checkpoint under ``run_dir`` (see :mod:`.sentinel` for the rules):
    (the check, its path relative to ``run_dir`` when it was found there)."""
    raw = record.path

    def check(missing: bool | None, detail: str = "") -> CheckpointCheck:
        return CheckpointCheck(record.step, raw or "", record.time, missing, detail)

    if not raw:
        return check(None, "the ledger has no path for it"), None
    if "://" in raw:
        return check(None, "a URL, not a path on this host"), None
    try:
        rel, st = resolve(run_dir, raw, prefixes or _prefixes(run_dir), trusted=trusted)
        if stat.S_ISDIR(st.st_mode):
            path = run_dir / rel
            size = dir_size(path, st) if dir_size is not None else directory_size(path)
        elif stat.S_ISREG(st.st_mode):
            size = st.st_size
        else:
            return check(True, "neither a file nor a directory"), None
    except _Outside:
        return check(None, OUTSIDE), None
    except _Untrusted as exc:
        return check(
            None, f"cannot be checked: {exc} (the sentinel reads only what its owner alone controls)"
        ), None
    except OutOfTime:
        return check(None, "cannot check: its walk did not finish within the time budget"), None
    except (FileNotFoundError, NotADirectoryError):
        return check(True, "does not exist"), None
    except OSError as exc:  # permission, I/O, stale handle: cannot tell whether it is gone
        return check(None, f"cannot check: {exc.strerror or exc}"), None
    expected = record.nbytes
    if expected is not None and size is not None and size < expected:
        return check(True, f"{size} bytes, ledger says {expected}"), rel
    return check(False), rel


def _open_regular(path: Path) -> int:
    """A descriptor of the regular file ``path`` (a final link, a FIFO or a device is an OSError that
    names it, and opening one never blocks): :func:`babysitter.userfiles.open_regular`."""
    return userfiles.open_regular(path, follow_symlinks=False)


class LedgerTail:
    """The run's saves (:class:`~babysitter.ledger.saves.SaveLog`) for a ledger read again and again.

    A month-long ledger is tens of MB and every node of a job may run a sentinel: re-reading it every
    pass would be a steady read load on the shared file system. This reads only what was appended
    since the last pass (complete lines; a torn last line waits for its newline, a line that is not
    JSON is skipped, as the ledger reader does) and starts over when the file is replaced or
    truncated. It keeps the newest save of at most ``max_steps`` steps. The ledger must be a regular
    file (a FIFO, a link or a device is an OSError, and never blocks).
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
            CheckpointRecord(step=s.step, path=s.path, nbytes=s.nbytes, time=s.time, origin=s.origin)
            for s in self.saves()
            if s.state == "completed"
        ]

    def saves(
        self, *, now: float | None = None, abort_after: float | None = None, deadline: float | None = None
    ) -> list[SaveRecord]:
        """Completed and aborted saves, oldest first; FileNotFoundError when there is no ledger;
        :class:`OutOfTime` when ``time.monotonic()`` passes ``deadline`` with more to read (what was
        read is kept: the next call goes on from there)."""
        with open(_open_regular(self.path), "rb") as fh:
            st = os.fstat(fh.fileno())
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
                if deadline is not None and time.monotonic() > deadline:
                    raise OutOfTime
        return self._log.saves(now=now, abort_after=abort_after)

    def _parse(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if not any(kind in line for kind in SAVE_KINDS):
                continue
            try:  # bounded: a line nested 100,000 deep is skipped, not a RecursionError every pass
                self._log.add(decode(jsonin.loads(line, max_bytes=MAX_SAVE_LINE)))
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
        self.deadline: float | None = None
        self._cache: dict[Path, tuple[int, int, float, int | None]] = {}

    def size(self, path: Path, st: os.stat_result) -> int | None:
        now = time.monotonic()
        cached = self._cache.get(path)
        if cached is not None:
            ino, mtime, walked, size = cached
            if ino == st.st_ino and mtime == st.st_mtime_ns and now - walked < self.walk_seconds:
                return size
        size = directory_size(path, deadline=self.deadline)
        self.walks += 1
        self._cache[path] = (st.st_ino, st.st_mtime_ns, now, size)
        if len(self._cache) > _MAX_CACHED_DIRS:  # checkpoints that left the last K: forget the oldest
            del self._cache[min(self._cache, key=lambda p: self._cache[p][2])]
        return size


def run_name(run_dir: Path) -> str | None:
    """The run's name from the ledger's first start record; None when there is none (yet)."""
    try:
        with open(_open_regular(run_dir / DEFAULT_FILE_NAME), "rb") as fh:
            head = fh.read(_NAME_PROBE_BYTES)
    except OSError:
        return None
    for line in head.split(b"\n"):
        if b'"k":"start"' not in line.replace(b" ", b""):
            continue
        try:
            name = jsonin.loads(line, max_bytes=MAX_SAVE_LINE).get("run")
        except (ValueError, AttributeError):
            continue
        if isinstance(name, str) and name:
            return name
    return None


_UNCHECKED = Problem("", "", "")


@dataclass
class _Manifested:
    """What the worker knows of one checkpoint's manifest across passes."""

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
    untrusted: str = ""  # why the listed files cannot be checked (a link, a FIFO, a shared directory)
    sweep_base: int = 0  # the verifier's verified_bytes when its sweep began


class _Verifications:
    """Manifest checks of one run's checkpoints, within the digest credit the agent grants per pass."""

    def __init__(
        self,
        *,
        reverify_seconds: float,
        walk_seconds: float,
        drop_cache: bool,
        trusted: Callable[[os.stat_result], str | None] | None,
    ) -> None:
        self.reverify_seconds = reverify_seconds
        self.walk_seconds = walk_seconds
        self.drop_cache = drop_cache
        self.trusted = trusted
        self.credit = 0
        self.used = 0
        self.starved = False
        self.stop: Callable[[], bool] | None = None
        self._states: dict[str, _Manifested] = {}
        self._seen: set[str] = set()

    def begin_pass(self, credit: int, stop: Callable[[], bool] | None) -> None:
        self.credit, self.used, self.starved, self.stop = credit, 0, False, stop
        self._seen = set()

    def end_pass(self) -> None:
        for key in [k for k in self._states if k not in self._seen]:
            del self._states[key]  # left the last K: forget it (bounded memory)

    def demand(self, within: float) -> int:
        """Digest bytes this run would read in a pass ``within`` seconds from now, given all it asks."""
        now = time.monotonic()
        total = 0
        for state in self._states.values():
            verifier = state.verifier
            if verifier is None or state.untrusted or state.size_problem or state.structure:
                continue
            if verifier.next_length() is not None:
                total += max(0, verifier.total_bytes - (verifier.verified_bytes - state.sweep_base))
            elif state.swept_at is not None and now + within - state.swept_at >= self.reverify_seconds:
                total += verifier.total_bytes
        return total

    def _state(self, rel: str, is_dir: bool) -> _Manifested | None:
        path = manifest_path(Path(rel), is_dir=is_dir)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        state = self._states.get(rel)
        if state is not None and state.key == key:
            return state
        problem: Problem | None
        if not stat.S_ISREG(st.st_mode):
            problem = Problem("manifest_invalid", path.name, "not a regular file")
            state = _Manifested(key, None, "", problem, None)
        else:
            manifest, mid, problem = load_manifest(Path(rel))
            verifier = None
            if manifest is not None:
                verifier = ChunkVerifier(Path(rel), manifest, seed=mid, drop_cache=self.drop_cache)
            state = _Manifested(key, manifest, mid, problem, verifier)
        self._states[rel] = state
        return state

    def _listed(self, base: Path, manifest: Manifest) -> str:
        """Why the listed files cannot be looked at (a directory on the way that someone else controls,
        a link, a FIFO, a device), or "" when each is a regular file or absent."""
        dirs: dict[str, bool] = {}
        for entry in manifest.files:
            parent = PurePosixPath(entry.path).parent
            for k in range(1, len(parent.parts) + 1):
                sub = "/".join(parent.parts[:k])
                if sub in dirs:
                    continue
                try:
                    st = os.lstat(base / sub)
                except (FileNotFoundError, NotADirectoryError):
                    dirs[sub] = False
                    break
                if not stat.S_ISDIR(st.st_mode):
                    return f"{sub} is not a directory (a link?)"
                if self.trusted is not None and (why := self.trusted(st)):
                    return f"{sub} {why}"
                dirs[sub] = True
            try:
                st = os.lstat(base / entry.path)
            except (FileNotFoundError, NotADirectoryError):
                continue  # the sizes check says it is missing
            if not stat.S_ISREG(st.st_mode):
                return f"{entry.path} is not a regular file"
        return ""

    def check(self, rel: str, is_dir: bool, *, newest: bool) -> _Manifested | None:
        """The checkpoint's manifest state after this pass's checks; None when it has no manifest."""
        self._seen.add(rel)
        state = self._state(rel, is_dir)
        if state is None or state.manifest is None or state.verifier is None:
            return state
        now = time.monotonic()
        if newest or state.sizes_at is None or now - state.sizes_at >= self.walk_seconds:
            base = Path(rel) if is_dir else Path(rel).parent
            state.untrusted = self._listed(base, state.manifest)
            state.size_problem = None if state.untrusted else check_sizes(Path(rel), state.manifest)
            state.sizes_at = now
            if state.size_problem is not None or state.untrusted:
                state.structure = _UNCHECKED  # the files changed: look at their headers again
        if state.size_problem is not None or state.untrusted:
            return state
        if state.structure is _UNCHECKED:
            state.structure = check_structure(Path(rel), state.manifest)
        if state.structure is not None:
            return state
        verifier = state.verifier
        if verifier.next_length() is None:
            if state.swept_at is not None and now - state.swept_at >= self.reverify_seconds:
                verifier.restart()
                state.swept_at = None
                state.sweep_base = verifier.verified_bytes
            else:
                return state
        problem, used = verifier.verify(max(0, self.credit - self.used), stop=self.stop)
        self.used += used
        self.starved = self.starved or (problem is None and verifier.next_length() is not None)
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


@dataclass(frozen=True)
class RunSettings:
    """How one run is checked (the sentinel's options; see :class:`.sentinel.CheckpointSentinelCollector`).

    ``owner``: the uid that must control every directory the checks look into (with root, and
    ``private_gid`` its private group); None checks nothing (a worker running as ``nobody``, or as the
    agent's own user)."""

    keep_last: int = 3
    walk_seconds: float = 300.0
    reverify_seconds: float = 6 * 3600.0
    manifest_grace: float = 1800.0
    abort_after: float = 3600.0
    refresh_seconds: float = 30.0
    verdicts: bool = True
    drop_cache: bool = True
    owner: int | None = None
    private_gid: int | None = None


@dataclass
class RunReport:
    """One pass over one run, as the worker sends it back."""

    run: str | None
    ledger_ok: bool
    detail: str = ""
    checks: list[CheckpointCheck] = field(default_factory=list)
    used: int = 0
    starved: bool = False
    demand: int = 0
    walks: int = 0
    notes: list[str] = field(default_factory=list)


class RunChecker:
    """Everything one run's worker keeps across passes: the ledger's tail, directory sizes, manifests
    and how far their digests were verified, and which verdicts it wrote.

    ``root`` is where the run directory is (``.`` in a worker, whose working directory it is);
    ``run_dir`` is the directory as configured, for ``read_ledger`` and to recognize old ledgers'
    absolute paths inside it.
    """

    def __init__(
        self,
        run_dir: Path,
        settings: RunSettings,
        *,
        root: Path = Path("."),
        read_ledger: Callable[[Path], Sequence[_Record]] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.root = root
        self.settings = settings
        self._read = read_ledger
        here = os.getcwd() if root == Path(".") else os.path.realpath(root)
        self.prefixes = _prefixes(run_dir, here)
        self.tail = LedgerTail(root / DEFAULT_FILE_NAME)
        self.sizes = _SizeCache(settings.walk_seconds)
        self.trusted = self._trusted if settings.owner is not None else None
        self.verifications = _Verifications(
            reverify_seconds=settings.reverify_seconds,
            walk_seconds=settings.walk_seconds,
            drop_cache=settings.drop_cache,
            trusted=self.trusted,
        )
        self._name: str | None = None
        self._verdicts_written: dict[int, tuple[object, ...]] = {}
        self._verdicts_failed = False

    def _trusted(self, st: os.stat_result) -> str | None:
        """Why a directory is not the owner's alone (None when it is)."""
        owner, private = self.settings.owner, self.settings.private_gid
        if stat.S_ISLNK(st.st_mode):
            return "is a symbolic link"
        if st.st_uid not in (owner, 0):
            return f"belongs to uid {st.st_uid}"
        if st.st_mode & stat.S_IWOTH:
            return "is writable by everyone"
        if st.st_mode & stat.S_IWGRP and st.st_gid != private:
            return f"is writable by group {st.st_gid}"
        return None

    def check(self, wall: float, credit: int, seconds: float) -> RunReport:
        """One pass: the checks, the digest bytes read of ``credit``, within about half of ``seconds``
        (the agent kills the worker at ``seconds``)."""
        start = time.monotonic()
        soft = start + seconds / 2
        self.sizes.deadline = soft
        self.verifications.begin_pass(credit, lambda: time.monotonic() > soft)
        if self._name is None:
            self._name = run_name(self.root)
        report = self._check(wall)
        self.verifications.end_pass()
        report.run = self._name
        report.used = self.verifications.used
        report.starved = self.verifications.starved
        report.demand = self.verifications.demand(self.settings.refresh_seconds)
        report.walks = self.sizes.walks
        if self.settings.verdicts:
            note = self._write_verdicts(report.checks, wall)
            if note:
                report.notes.append(note)
        return report

    def _saves(self, wall: float) -> list[SaveRecord]:
        if self._read is None:
            after, deadline = self.settings.abort_after, self.sizes.deadline
            return self.tail.saves(now=wall, abort_after=after, deadline=deadline)
        return [
            r if isinstance(r, SaveRecord) else SaveRecord(r.step, r.path, r.nbytes, r.time)
            for r in self._read(self.run_dir)
        ]

    def _check(self, wall: float) -> RunReport:
        try:
            saves = self._saves(wall)
        except OutOfTime:
            why = "the ledger is still being read (more than one pass's time budget); it goes on next pass"
            return RunReport(None, False, why)
        except FileNotFoundError:
            return RunReport(None, False, "no ledger in this directory")
        except OSError as exc:
            return RunReport(None, False, f"cannot read the ledger: {exc.strerror or exc}")
        newest: dict[int, SaveRecord] = {}
        for save in saves:  # oldest first; a step saved again after a restart keeps its newest record
            newest[save.step] = save
        ordered = _newest_per_path(newest.values())
        keep = self.settings.keep_last
        done = [s for s in ordered if s.state == "completed"][-keep:]
        since = done[0].time if done else 0.0
        aborted = [s for s in ordered if s.state == "aborted" and s.time >= since][-keep:]
        checks = []
        for i, save in enumerate(reversed(done)):  # newest first: it gets the digest budget first
            checks.append(self._verify(save, wall, newest=i == 0))
        checks.reverse()
        checks.extend(c for c in (self._aborted(s) for s in aborted) if c is not None)
        return RunReport(None, True, checks=checks)

    def _verify(self, save: SaveRecord, wall: float, *, newest: bool) -> CheckpointCheck:
        prefixes = self._prefixes(save)
        check, rel = verify(self.root, save, self.sizes.size, prefixes=prefixes, trusted=self.trusted)
        if check.missing is not False or rel is None:
            return check
        try:
            is_dir = stat.S_ISDIR(os.lstat(self.root / rel).st_mode)
            state = self.verifications.check(str(self.root / rel), is_dir, newest=newest)
        except OSError as exc:  # the manifest cannot be stat'ed: cannot tell
            return replace(check, detail=f"cannot check its manifest: {exc.strerror or exc}")
        if state is None:
            if not save.manifest:
                return check  # a tracker that writes no manifests: existence and size only
            if save.manifest_ok is False:
                return replace(check, corrupt=True, reason="incomplete", detail=save.why or "incomplete")
            if save.closed or wall - save.time > self.settings.manifest_grace:
                why = (
                    "no manifest: its process ended before committing one (the save did not complete)"
                    if save.closed
                    else f"no manifest {self.settings.manifest_grace:.0f} s after the save (it did not "
                    "complete, or its manifest thread is stuck)"
                )
                return replace(check, corrupt=True, reason="no_manifest", detail=why)
            return replace(check, pending=True, detail="its manifest is still being written")
        if state.untrusted:
            return replace(
                check,
                missing=None,
                detail=f"cannot be checked: {state.untrusted} (the sentinel reads only what its owner "
                "alone controls, and regular files only)",
            )
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

    def _prefixes(self, save: SaveRecord) -> tuple[str, ...]:
        """What an absolute path of ``save`` may start with: the run directory as it is named here,
        and the directory its ledger was written in (the start record's ``dir``: a moved run directory's
        absolute paths map to the same place here; :mod:`babysitter.ledger.paths`, rule 2)."""
        if not save.origin or not os.path.isabs(save.origin):
            return self.prefixes
        return (*self.prefixes, os.path.normpath(save.origin).rstrip("/") or "/")

    def _aborted(self, save: SaveRecord) -> CheckpointCheck | None:
        """A save that began and never ended: corrupt when its path is there (a half-written checkpoint
        a resume could pick), nothing when it never wrote anything or cannot be looked at."""
        if not save.path or "://" in save.path:
            return None
        try:
            resolve(self.root, save.path, self._prefixes(save), trusted=self.trusted)
        except (_Outside, _Untrusted, OSError):
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

    def _write_verdicts(self, checks: list[CheckpointCheck], wall: float) -> str:
        """Append each changed verdict to the run directory (for the report and requeues); a note for the
        agent's log the first time that fails."""
        note = ""
        for check in checks:
            if check.corrupt is None:
                continue
            state = (check.corrupt, check.reason, check.file, check.mid)
            if self._verdicts_written.get(check.step) == state:
                continue
            verdict = Verdict(
                t=wall,
                step=check.step,
                path=check.path,
                mid=check.mid,
                ok=not check.corrupt,
                reason=check.reason,
                file=check.file,
                detail=check.detail,
            )
            try:
                append_verdict(self.root, verdict)
            except OSError as exc:
                if not self._verdicts_failed:
                    self._verdicts_failed = True
                    note = (
                        f"cannot write verdicts into the run directory ({exc.strerror or exc}); the report "
                        "and requeues see only what they check themselves"
                    )
                continue
            self._verdicts_written[check.step] = state
        if len(self._verdicts_written) > 4096:
            self._verdicts_written.clear()
        return note
