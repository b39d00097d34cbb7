"""Reading sysfs (and procfs) for the node agent's hardware collectors: bounded, counted, never raising.

Every collector that reads the kernel's files (InfiniBand ports, PCIe links, EDAC, CPU thermal, the
GPU-to-NIC topology) goes through one :class:`SysfsReader` over a root given by ``--path.sysfs``
(node_exporter's flag; ``/sys`` by default), so tests and containers point it at another tree.

What the kernel gets wrong is counted, not raised: a file that cannot be read (``unreadable``:
permissions, I/O errors, a driver that answers EINVAL), one that disappeared between listing and
reading (``vanished``: a device being removed), content that is not what the kernel documents
(``garbage``) and counters the hardware does not provide (``unavailable``: InfiniBand's
``N/A (no PMA)``) and a file that is not one (``not_regular``: a FIFO, socket, device node or
symbolic link where the kernel has a regular file). Each problem, a (file, reason) pair, is counted
once in ``babysitter_sysfs_problems_total{collector,reason}`` and logged once when it starts; a file
that reads fine again clears it, so a later failure counts again. The value is simply absent meanwhile.

Only regular files are read, and never through a symbolic link as the last part of their path: every
file is opened with ``O_NONBLOCK | O_NOFOLLOW`` and checked with ``fstat`` before a byte is read, so a
FIFO costs its own value, not a collector blocked in ``open`` (kernel attributes are regular files, and
a device node takes root to make). The links of the kernel's layout (``class/...``, ``bus/pci/devices``,
a device's ``device``, ``driver``) are followed by :meth:`SysfsReader.resolve` only, which keeps what
they lead to below the root; collectors read from the resolved directories.

How much a collector watches is capped (:data:`babysitter.catalog.budget.CAPS`): :meth:`SysfsReader.bound`
keeps the first items of a scan and shows how many more there were in
``babysitter_sysfs_items_dropped{collector,kind}``, with one log line per kind.

Counters the kernel resets (a driver reload recreates the device with every counter at 0) go through
:class:`Counters`, which keeps the exported counter monotonic: a value lower than the last one read,
or a device directory that is a new one (another inode), adds what was counted before the reset, so
Prometheus never sees the counter go back and counts what happened after the reset exactly.

The files read at every scrape are kept open and read again from their start (``pread`` at offset
0: sysfs formats an attribute afresh for each read from its start, the way ``sysfs_notify`` users
re-read one): the path walk of ``open`` was half of each read's cost, and a host reads a few hundred
attributes a scrape. A kept file whose device is removed fails its read (ENODEV), and one that a test
tree deleted or replaced has no links left: either is opened again by its path, and what that finds
(nothing: ``vanished``) is what counts. Descriptors are bounded (a quarter of the process's file limit
at most, shared by every reader) and a file not read in a scrape is closed at the scrape's end
(:meth:`SysfsReader.release_unread`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import resource
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from prometheus_client.core import Metric

from babysitter.catalog import fabric as F
from babysitter.catalog._spec import MetricSpec
from babysitter.node.collector import family_of

__all__ = ["PROBLEMS", "Counters", "Rescan", "Sample", "SysfsReader", "to_families"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Every ``reason`` of ``babysitter_sysfs_problems_total``.
PROBLEMS = ("unreadable", "vanished", "garbage", "unavailable", "not_regular")
# Never block in open() (a FIFO), never follow a link in place of the file, never take a terminal.
_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY
_MAX_BYTES = 8192  # the largest attribute read (AER stats are ~1 KiB; a page is the kernel's limit)
_MAX_ENTRIES = 4096  # entries listed per directory: a tree larger than that is not a server's sysfs
_MAX_TRACKED = 4096  # (file, reason) problems remembered at once
_LOGGED_PER_READER = 50  # log lines about problems per collector; the counter keeps counting after that
_NAME = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")


def _close_all(fds: dict[str, int]) -> None:
    """Close the descriptors of one reader and give them back to the budget."""
    global _kept
    with _kept_lock:
        _kept -= len(fds)
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def _descriptor_budget() -> int:
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):  # pragma: no cover - every Linux has the limit
        return 0
    return 1024 if soft == resource.RLIM_INFINITY else max(0, min(1024, soft // 4))


#: Descriptors all readers of this process may keep open (sockets and the rest keep the other 3/4).
KEEP_OPEN = _descriptor_budget()
_kept = 0
_kept_lock = threading.Lock()
_ORDER = {spec.name: i for i, spec in enumerate(F.METRICS)}

#: One value of a collector: its catalog entry, label values (in the entry's order), the value.
Sample = tuple[MetricSpec, tuple[str, ...], float]


class _NotRegular(Exception):
    """The path is a FIFO, socket, device node, directory or symbolic link, not an attribute's file."""


def _open(path: str) -> int:
    """A descriptor on the regular file at ``path`` (its last part not a link); raises OSError or
    :class:`_NotRegular`."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: the file itself is a link
            raise _NotRegular("a symbolic link") from None
        if exc.errno == errno.ENXIO:  # a socket (or a device without its driver): which one?
            with contextlib.suppress(OSError):
                mode = os.lstat(path).st_mode
                if not stat.S_ISREG(mode):
                    raise _NotRegular(_kind_of(mode)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory")
        raise _NotRegular(_kind_of(mode))
    return fd


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device")):
        if test(mode):
            return name
    return "not a regular file"


class SysfsReader:
    """Files under ``root`` (``/sys`` or a test tree), read as the kernel's attributes are read.

    Paths passed in are relative to the root (``class/infiniband``) or absolute below it (from
    :meth:`resolve`). Not thread-safe: one reader per collector, used from its collect().
    """

    def __init__(self, root: Path | str, collector: str, *, keep_open: bool = True) -> None:
        self.root = Path(root)
        self._root = os.path.abspath(root)
        self._real_root: str | None = None  # the root's real path, once it exists
        self.collector = collector
        self._counts = dict.fromkeys(PROBLEMS, 0)
        self._active: set[tuple[str, str]] = set()
        self._logged = 0
        self._keep_open = keep_open
        self._fds: dict[str, int] = {}  # path -> a descriptor kept open on it
        self._read: set[str] = set()  # kept paths read since the last release_unread()
        self._dropped: dict[str, int] = {}  # kind -> found beyond its cap by the last scan
        self._capped: set[str] = set()  # kinds logged
        # A reader dropped without close() (a collector nobody closed) still gives its files back.
        self._release = weakref.finalize(self, _close_all, self._fds)

    # --- paths ------------------------------------------------------------------------------------
    def path(self, relative: str) -> str:
        """The absolute path of ``relative`` under the root (absolute paths are kept)."""
        return relative if relative[:1] == "/" else os.path.join(self._root, relative)

    def resolve(self, relative: str) -> str | None:
        """Where a link (``bus/pci/devices/0000:9b:00.0``) leads, below the root; None when nowhere."""
        try:
            resolved = os.path.realpath(self.path(relative), strict=True)
        except OSError:
            return None
        root = self._real_root
        if root is None:
            root = os.path.realpath(self.root)
            if os.path.isdir(root):
                self._real_root = root  # kept once it exists (a test tree may come later)
        return resolved if resolved == root or resolved.startswith(root + os.sep) else None

    def real(self, base: str, *parts: str) -> str | None:
        """``base/part/...`` when each part is a directory and none a link, else None: what a collector
        adds to a resolved device directory (``ports/1``, ``counters``) is never a link in the kernel's
        layout, so nothing is read through one. Costs a ``lstat`` per part (scans only)."""
        path = self.path(base)
        for part in parts:
            path = os.path.join(path, part)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                return None  # not there: optional directories (hw_counters) are absent on many drivers
            if not stat.S_ISDIR(mode):
                what = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
                self.problem(path, "not_regular", what)
                return None
            if self._active:
                self.ok(path, "not_regular")
        return path

    def listdir(self, relative: str) -> list[str]:
        """Entry names of a directory, sorted (at most 4096, names of the kernel's kind only); [] when
        it does not exist (most optional directories: no ``hw_counters``, no ``infiniband`` class)."""
        try:
            with os.scandir(self.path(relative)) as entries:
                names = [e.name for _, e in zip(range(_MAX_ENTRIES), entries, strict=False)]
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            return []
        except OSError as exc:
            self.problem(relative, "unreadable", exc.strerror or str(exc))
            return []
        self.ok(relative)
        return sorted(name for name in names if _NAME.match(name))

    def exists(self, relative: str) -> bool:
        """Whether the file or directory is there."""
        return os.path.lexists(self.path(relative))

    def inode(self, relative: str) -> int | None:
        """The inode of a directory: a device the kernel recreated (driver reload) has a new one."""
        try:
            return os.stat(self.path(relative)).st_ino
        except OSError:
            return None

    # --- reading ------------------------------------------------------------------------------------
    def _raw(self, relative: str, listed: bool) -> bytes | None:
        path = relative if relative[:1] == "/" else self.path(relative)
        fd = self._fds.get(path)
        if fd is not None:
            try:
                raw = os.pread(fd, _MAX_BYTES, 0)
                if os.fstat(fd).st_nlink:  # still the file at ``path`` (see the module docstring)
                    self._read.add(path)
                    if self._active:
                        self.ok(relative, "unreadable", "vanished", "not_regular")
                    return raw
            except OSError:
                pass  # gone or failing: what opening it again finds is what counts
            self._drop(path)
        try:
            fd = _open(path)
            try:
                raw = os.read(fd, _MAX_BYTES)
            except BaseException:
                os.close(fd)
                raise
            self._keep(path, fd)
        except _NotRegular as exc:
            self.problem(relative, "not_regular", str(exc))
            return None
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO, errno.ENOTDIR):
                if listed:
                    self.problem(relative, "vanished", exc.strerror or "gone")
                return None
            self.problem(relative, "unreadable", exc.strerror or str(exc))
            return None
        if self._active:
            self.ok(relative, "unreadable", "vanished", "not_regular")
        return raw

    def _keep(self, path: str, fd: int) -> None:
        global _kept
        with _kept_lock:
            keep = self._keep_open and _kept < KEEP_OPEN
            if keep:
                _kept += 1
        if keep:
            self._fds[path] = fd
            self._read.add(path)
        else:
            os.close(fd)

    def _drop(self, path: str) -> None:
        global _kept
        fd = self._fds.pop(path)
        self._read.discard(path)
        with _kept_lock:
            _kept -= 1
        with contextlib.suppress(OSError):  # a descriptor of ours is always valid
            os.close(fd)

    @contextlib.contextmanager
    def passing(self) -> Iterator[None]:
        """Reads inside are not kept open: a rescan's files (device lists, the PCIe tree) are read
        once a minute, not every scrape."""
        keep, self._keep_open = self._keep_open, False
        try:
            yield
        finally:
            self._keep_open = keep

    def release_unread(self) -> None:
        """Close the files not read since the last call: a collector calls it at the end of each
        scrape, so a device gone, or a file it no longer reads, holds no descriptor."""
        for path in [p for p in self._fds if p not in self._read]:
            self._drop(path)
        self._read.clear()

    def close(self) -> None:
        """Close every file kept open."""
        _close_all(self._fds)
        self._read.clear()

    @property
    def kept_open(self) -> int:
        """Files this reader keeps open now."""
        return len(self._fds)

    def text(self, relative: str, *, listed: bool = True) -> str | None:
        """The file's content, stripped; None when it cannot be read (counted unless it simply does not
        exist and was not ``listed``: optional attributes are absent on many drivers)."""
        raw = self._raw(relative, listed)
        return None if raw is None else raw.decode("utf-8", "replace").strip()

    def integer(self, relative: str, *, listed: bool = True, base: int = 10) -> int | None:
        """A file holding one non-negative integer (``0x...`` with ``base=16``); None (counted) for
        anything else. InfiniBand's ``N/A (no PMA)`` is ``unavailable``, not garbage."""
        raw = self._raw(relative, listed)
        if raw is None:
            return None
        if base == 10:
            try:
                value = int(raw)  # the common case, straight from the bytes
            except ValueError:
                pass
            else:
                if value >= 0:
                    if self._active:
                        self.ok(relative, "garbage", "unavailable")
                    return value
        return self.parse_int(relative, raw.decode("utf-8", "replace").strip(), base=base)

    def integers(self, paths: Iterable[str]) -> list[int | None]:
        """:meth:`integer` of each of ``paths`` (absolute, listed, decimal), in order: the files a
        collector reads every scrape, read in one loop (a port's counters, a CPU's throttles)."""
        fds, read, pread, fstat = self._fds, self._read, os.pread, os.fstat
        out: list[int | None] = []
        for path in paths:
            fd = fds.get(path)
            if fd is not None and not self._active:
                try:
                    raw = pread(fd, _MAX_BYTES, 0)
                    fresh = fstat(fd).st_nlink != 0
                except OSError:
                    fresh = False
                if fresh:
                    try:
                        value = int(raw)
                    except ValueError:
                        value = -1
                    if value >= 0:
                        read.add(path)
                        out.append(value)
                        continue
            out.append(self.integer(path))  # anything else: the whole way, counted as there
        return out

    def parse_int(self, relative: str, text: str, *, base: int = 10) -> int | None:
        """``text`` (read from ``relative``) as a non-negative integer, or None counted as garbage."""
        try:
            value = int(text, base)
        except ValueError:
            if text.startswith("N/A"):
                self.problem(relative, "unavailable", text[:40])
            else:
                self.problem(relative, "garbage", repr(text[:40]))
            return None
        if value < 0:
            self.problem(relative, "garbage", repr(text[:40]))
            return None
        self.ok(relative, "garbage", "unavailable")
        return value

    # --- problems -------------------------------------------------------------------------------------
    def problem(self, relative: str, reason: str, detail: str) -> None:
        """Count (once while it lasts) and log (once) that ``relative`` has ``reason``."""
        key = (relative, reason)
        if key in self._active:
            return
        if len(self._active) < _MAX_TRACKED:
            self._active.add(key)
        self._counts[reason] += 1
        if self._logged < _LOGGED_PER_READER:
            self._logged += 1
            more = " (further problems are counted, not logged)" if self._logged == _LOGGED_PER_READER else ""
            log.warning(
                "babysitter: %s collector: %s: %s (%s)%s",
                self.collector,
                self.path(relative),
                reason,
                detail,
                more,
            )

    def ok(self, relative: str, *reasons: str) -> None:
        """``relative`` read fine: its problems (of ``reasons``, or all) are over."""
        if not self._active:
            return
        for reason in reasons or PROBLEMS:
            self._active.discard((relative, reason))

    @property
    def vanished(self) -> int:
        """Files that vanished so far (a device being removed): collectors look again when it grows."""
        return self._counts["vanished"]

    def problems(self) -> dict[str, int]:
        """Problems counted so far, by reason."""
        return dict(self._counts)

    def family(self) -> Metric:
        """``babysitter_sysfs_problems_total{collector,reason}`` for this reader: a reason's series
        appears with its first problem (a healthy host exports none)."""
        family = F.SYSFS_PROBLEMS.family()
        for reason in PROBLEMS:
            if self._counts[reason]:
                family.add_metric([self.collector, reason], float(self._counts[reason]))  # type: ignore[attr-defined]
        return family

    def families(self) -> list[Metric]:
        """:meth:`family`, and ``babysitter_sysfs_items_dropped{collector,kind}`` once a cap was met."""
        if not self._dropped:
            return [self.family()]
        dropped = F.SYSFS_ITEMS_DROPPED.family()
        for kind, count in sorted(self._dropped.items()):
            dropped.add_metric([self.collector, kind], float(count))  # type: ignore[attr-defined]
        return [self.family(), dropped]

    # --- caps -------------------------------------------------------------------------------------------
    def bound(self, kind: str, items: Sequence[T], cap: int) -> Sequence[T]:
        """The first ``cap`` of ``items`` (what a scan found of ``kind``), the rest shown as dropped."""
        self.dropped(kind, len(items) - cap, cap)
        return items[:cap] if len(items) > cap else items

    def dropped(self, kind: str, count: int, cap: int) -> None:
        """A scan found ``count`` items of ``kind`` beyond its ``cap`` (0 or less: none): kept for
        ``babysitter_sysfs_items_dropped`` (until a scan finds none: 0) and logged the first time."""
        count = max(count, 0)
        if not count and kind not in self._dropped:
            return
        self._dropped[kind] = count
        if count and kind not in self._capped:
            self._capped.add(kind)
            log.warning(
                "babysitter: %s collector: %d more of kind %s under %s than the %d watched; they are not "
                "read (babysitter_sysfs_items_dropped counts them; logged once)",
                self.collector,
                count,
                kind,
                self._root,
                cap,
            )


class Rescan:
    """When a collector reads its slow-changing part again (device lists, the PCIe tree, the CPU topology):
    every ``seconds`` (0: every scrape), or at the next scrape after :meth:`soon` (a device vanished)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds < 0:
            raise ValueError(f"rescan interval must be >= 0 s, got {seconds}")
        self.seconds = seconds
        self._clock = clock
        self._at: float | None = None

    def due(self) -> bool:
        """Whether to read again now (and, when it is, the interval starts over)."""
        now = self._clock()
        if self._at is not None and now - self._at < self.seconds:
            return False
        self._at = now
        return True

    def soon(self) -> None:
        """Read again at the next :meth:`due`."""
        self._at = None


@dataclass
class _Counter:
    raw: int
    base: int = 0  # counted before the kernel's last reset


@dataclass
class Counters:
    """Monotonic counters over the kernel's, which a driver reload resets (see the module docstring).

    ``value(key, raw, epoch)`` returns the exported value; ``epoch`` identifies the incarnation of
    the device (its directory's inode), so a reset is seen even when the new value is already above
    the old one. Keys not seen in a scrape are forgotten by :meth:`sweep` (a device gone for good).
    Not thread-safe: one per collector, used from its collect() (which the agent never runs twice at once).
    """

    name: str
    resets: int = 0
    _values: dict[tuple[str, ...], _Counter] = field(default_factory=dict)
    _epochs: dict[tuple[str, ...], int | None] = field(default_factory=dict)
    _seen: set[tuple[str, ...]] = field(default_factory=set)
    _logged: set[tuple[str, ...]] = field(default_factory=set)

    def epoch(self, owner: tuple[str, ...], epoch: int | None) -> bool:
        """Record the incarnation of ``owner`` (a device and port); True when it changed (a reset)."""
        before = self._epochs.get(owner, epoch)
        self._epochs[owner] = epoch
        changed = before != epoch and before is not None and epoch is not None
        if changed:
            self._reset(owner, "the device was recreated (driver reload)")
            for key, counter in self._values.items():
                if key[: len(owner)] == owner:
                    counter.base += counter.raw
                    counter.raw = 0
        return changed

    def value(self, key: tuple[str, ...], raw: int) -> int:
        """The monotonic value of counter ``key`` whose kernel value is ``raw`` now."""
        self._seen.add(key)
        counter = self._values.get(key)
        if counter is None:
            self._values[key] = _Counter(raw)
            return raw
        if raw < counter.raw:
            counter.base += counter.raw
            self._reset(key, "the counter went back")
        counter.raw = raw
        return counter.base + raw

    def sweep(self) -> None:
        """Forget the counters not read since the last sweep (their device is gone)."""
        for key in [k for k in self._values if k not in self._seen]:
            del self._values[key]
        self._seen.clear()

    def _reset(self, key: tuple[str, ...], why: str) -> None:
        self.resets += 1
        owner = key[:2]
        if owner not in self._logged and len(self._logged) < 256:
            self._logged.add(owner)
            log.info(
                "babysitter: %s counters of %s were reset (%s); the exported counters continue from "
                "their last values",
                self.name,
                " ".join(owner),
                why,
            )


def to_families(samples: Iterable[Sample]) -> list[Metric]:
    """One family per catalog entry, in catalog order (info entries: value 1, labels as given)."""
    families: dict[str, Metric] = {}
    for spec, labels, value in samples:
        family = families.get(spec.name)
        if family is None:
            family = families[spec.name] = family_of(spec)
        if spec.kind == "info":
            family.add_metric(list(labels), {})  # type: ignore[attr-defined]
        else:
            family.add_metric(labels, value)  # type: ignore[attr-defined]
    return [families[name] for name in sorted(families, key=lambda n: _ORDER.get(n, len(_ORDER)))]
