"""Gathering an incident's bundle into the run directory, within a deadline and a size.

:meth:`Gatherer.gather` asks every rank of the run for its stacks and flight recorder (a request in
``RUN_DIR/incidents/<id>/``, answered by each rank's
:class:`~babysitter.training.incidents.IncidentResponder`), and while the ranks answer it adds what
explains the incident from outside the processes: the alert, the ledger's last records, the
watchdog's recent hang dumps, the ranks' crash records, and from Prometheus the culprit host's GPU,
Xid, fabric and host state and which host each rank reported through. At the deadline (or as soon
as every rank of the world answered) it writes ``bundle.json``, the summary that marks the bundle
complete: who answered, who did not, the collective the answering ranks wait in and who never
reached it.

Bounded: at most ``max_incidents`` bundles per run (the oldest go), at most ``max_bytes`` each (a
rank's share of it is given in the request, and copies of dumps and records are cut), never longer
than ``wait`` seconds. Created 0700/0600, and owned by the run directory's owner when the gatherer
runs as root (the remediator), so the ranks, which run as that owner, can answer and read it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter import jsonin
from babysitter._version import __version__
from babysitter.incident.analyze import stuck_collective
from babysitter.ledger.reader import DEFAULT_FILE_NAME
from babysitter.prom import Deadline, PromClient
from babysitter.training import incident_files as F
from babysitter.training.incidents import DEFAULT_RANK_BYTES, MIN_RANK_BYTES, REQUEST_VERSION

__all__ = ["BUNDLE_VERSION", "Bundle", "Gatherer", "Limits", "MiB", "Target", "incident_id"]

incident_id = F.incident_id

log = logging.getLogger(__name__)

BUNDLE_VERSION = 1
MiB = 1024 * 1024
#: Bytes of a bundle kept for what is not the ranks' answers (alert, ledger, host, dumps, crashes).
_RESERVE = 4 * MiB
_LEDGER_TAIL = 256 * 1024
_LEDGER_RECORDS = 200
_HANG_FILES = 8
_HANG_BYTES = 256 * 1024
_CRASH_FILES = 16
_CRASH_BYTES = 64 * 1024
#: Hang dumps and crash records this long before the incident belong to it.
_LOOKBACK = 3600.0
_STALE_BUILD = 3600.0
_MAX_WORLD = 1 << 20


@dataclass(frozen=True)
class Limits:
    """How long and how much: ``wait`` seconds for the ranks, ``max_incidents`` bundles per run,
    ``max_bytes`` per bundle, ``rank_bytes`` per rank's answer at most."""

    wait: float = 10.0
    max_incidents: int = 32
    max_bytes: int = 64 * MiB
    rank_bytes: int = DEFAULT_RANK_BYTES

    def __post_init__(self) -> None:
        if not self.wait > 0:
            raise ValueError(f"wait must be positive seconds, got {self.wait!r}")
        if self.max_incidents < 1:
            raise ValueError(f"max_incidents must be at least 1, got {self.max_incidents!r}")
        if self.max_bytes < _RESERVE + MIN_RANK_BYTES:
            raise ValueError(
                f"max_bytes must be at least {_RESERVE + MIN_RANK_BYTES}, got {self.max_bytes!r}"
            )
        if self.rank_bytes < MIN_RANK_BYTES:
            raise ValueError(f"rank_bytes must be at least {MIN_RANK_BYTES}, got {self.rank_bytes!r}")


@dataclass(frozen=True)
class Target:
    """Where a bundle goes: a run directory and the run's name (None: a host's incident, no ranks)."""

    directory: Path
    run: str | None


@dataclass
class Bundle:
    """One gathered bundle (or why there is none)."""

    id: str
    path: Path
    run: str | None
    complete: bool = False
    #: False when the bundle existed already (the same alert, re-sent or seen by another gatherer).
    new: bool = True
    world_size: int | None = None
    answered: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    seconds: float = 0.0
    bytes: int = 0
    error: str | None = None

    def describe(self) -> dict[str, object]:
        """What the remediator's audit log says of the bundle."""
        out: dict[str, object] = {"id": self.id, "path": str(self.path), "complete": self.complete}
        if self.run is not None:
            out.update(
                run=self.run,
                world_size=self.world_size,
                answered=len(self.answered),
                missing=self.missing[:32],
            )
        out.update(seconds=round(self.seconds, 3), bytes=self.bytes, new=self.new)
        if self.error:
            out["error"] = self.error
        return out


@dataclass
class _Pending:
    bundle: Bundle
    target: Target
    owner: tuple[int, int] | None
    created: float
    rank_bytes: int
    ledger: list[Any]
    world: int | None
    notes: list[str]


def _owner(info: os.stat_result) -> tuple[int, int] | None:
    """Whom the bundle belongs to: the run directory's owner, when this process (root) can give it."""
    if os.geteuid() != 0 or info.st_uid == 0:
        return None
    return info.st_uid, info.st_gid


def _mkdir(name: str, dir_fd: int, owner: tuple[int, int] | None) -> None:
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    if owner is not None:
        os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)


def _world(records: list[Any]) -> int | None:
    """The world size of the newest start record of the ledger's tail."""
    for record in reversed(records):
        if isinstance(record, dict) and record.get("k") == "start":
            info = record.get("info")
            size = info.get("world_size") if isinstance(info, dict) else None
            if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= _MAX_WORLD:
                return size
            return None
    return None


def _ledger_tail(run_fd: int) -> tuple[list[Any], str | None]:
    """The last records of the run's ledger (torn and foreign lines skipped), or why none."""
    try:
        fd = os.open(DEFAULT_FILE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=run_fd)
    except FileNotFoundError:
        return [], "no ledger in the run directory"
    except OSError as exc:
        return [], f"ledger: {exc}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return [], "the ledger is not a regular file"
        start = max(0, info.st_size - _LEDGER_TAIL)
        data = os.pread(fd, _LEDGER_TAIL, start)
    finally:
        os.close(fd)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # a partial first line
    records: list[Any] = []
    for raw in lines:
        try:
            record = jsonin.loads(raw, max_bytes=_LEDGER_TAIL)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records[-_LEDGER_RECORDS:], None


class Gatherer:
    """Gathers bundles; ``prometheus`` (optional) for the host's and the ranks' state from outside."""

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        prometheus: PromClient | None = None,
        clock: Callable[[], float] = time.time,
        poll: float = 0.2,
    ) -> None:
        self.limits = limits or Limits()
        self.prometheus = prometheus
        self.clock = clock
        self.poll = poll

    # ------------------------------------------------------------------ the whole

    def gather(
        self,
        targets: Sequence[Target],
        *,
        incident: str,
        alert: dict[str, Any] | None = None,
        hosts: Sequence[str] = (),
        cluster: tuple[str, str] | None = None,
    ) -> list[Bundle]:
        """One bundle per target, all asked at once and finished by one deadline; never raises for a
        target (its :class:`Bundle` says what failed)."""
        if not F.valid_id(incident):
            raise ValueError(f"not an incident id: {incident[:80]!r}")
        started = time.monotonic()
        deadline = started + self.limits.wait
        pending: list[_Pending | Bundle] = []
        for target in targets:
            try:
                pending.append(self._begin(target, incident, alert, deadline))
            except (OSError, ValueError) as exc:
                path = target.directory / F.INCIDENTS / incident
                pending.append(Bundle(incident, path, target.run, error=f"{type(exc).__name__}: {exc}"[:500]))
        outside = self._outside(hosts, cluster, deadline)
        out: list[Bundle] = []
        for item in pending:
            if isinstance(item, Bundle):
                out.append(item)
                continue
            try:
                out.append(self._finish(item, deadline, outside, cluster))
            except (OSError, ValueError) as exc:
                item.bundle.error = f"{type(exc).__name__}: {exc}"[:500]
                out.append(item.bundle)
            item.bundle.seconds = time.monotonic() - started
        return out

    # ------------------------------------------------------------------ asking

    def _begin(
        self, target: Target, incident: str, alert: dict[str, Any] | None, deadline: float
    ) -> _Pending:
        now = self.clock()
        info = os.stat(target.directory)
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(f"{target.directory} is not a directory")
        owner = _owner(info)
        path = target.directory / F.INCIDENTS / incident
        bundle = Bundle(incident, path, target.run)
        with F.opened_dir(target.directory) as run_fd:
            with contextlib.suppress(FileExistsError):
                _mkdir(F.INCIDENTS, run_fd, owner)
            ledger, note = _ledger_tail(run_fd) if target.run is not None else ([], None)
            with F.opened_dir(F.INCIDENTS, dir_fd=run_fd) as top:
                world = _world(ledger)
                share = (self.limits.max_bytes - _RESERVE) // max(1, world or 1)
                rank_bytes = max(MIN_RANK_BYTES, min(self.limits.rank_bytes, share))
                pending = _Pending(
                    bundle, target, owner, now, rank_bytes, ledger, world, [note] if note else []
                )
                if incident in os.listdir(top):
                    return self._existing(pending, top)
                self._prune(top)
                self._build(pending, top, alert, now + (deadline - time.monotonic()))
        return pending

    def _existing(self, pending: _Pending, top: int) -> _Pending:
        """The incident's directory is there: complete (nothing to do) or being gathered (finish it)."""
        bundle = pending.bundle
        bundle.new = False
        with F.opened_dir(bundle.id, dir_fd=top) as folder:
            try:
                summary = F.read_json(F.BUNDLE, dir_fd=folder, limit=4 * MiB)
            except FileNotFoundError:
                pending.notes.append("another gatherer began this bundle; finished here")
                return pending
        if isinstance(summary, dict):
            _fill(bundle, summary)
        bundle.complete = True
        return pending

    def _prune(self, top: int) -> None:
        """Room for one more: the oldest bundles beyond ``max_incidents - 1`` go, and stale builds."""
        ids = F.list_ids(top)
        for old in ids[: max(0, len(ids) - self.limits.max_incidents + 1)]:
            _remove(top, old)
        now = time.time()
        for name in os.listdir(top):
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if now - os.stat(name, dir_fd=top, follow_symlinks=False).st_mtime > _STALE_BUILD:
                        _remove(top, name)

    def _build(self, pending: _Pending, top: int, alert: dict[str, Any] | None, wall_deadline: float) -> None:
        """The incident's directory, built aside and renamed into place with its request inside."""
        bundle, owner = pending.bundle, pending.owner
        tmp = f".{bundle.id}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        _mkdir(tmp, top, owner)
        try:
            with F.opened_dir(tmp, dir_fd=top) as folder:
                _mkdir(F.RANKS, folder, owner)
                if alert is not None:
                    F.write_json("alert.json", alert, dir_fd=folder, owner=owner)
                if bundle.run is not None:
                    request = {
                        "v": REQUEST_VERSION,
                        "id": bundle.id,
                        "run": bundle.run,
                        "created": round(pending.created, 6),
                        "deadline": round(wall_deadline, 6),
                        "rank_bytes": pending.rank_bytes,
                        "by": {"host": socket.gethostname(), "pid": os.getpid(), "version": __version__},
                    }
                    F.write_json(F.REQUEST, request, dir_fd=folder, owner=owner)
            os.rename(tmp, bundle.id, src_dir_fd=top, dst_dir_fd=top)
        except OSError:
            _remove(top, tmp)
            if bundle.id in os.listdir(top):  # another gatherer's rename won: finish theirs
                bundle.new = False
                return
            raise

    # ------------------------------------------------------------------ from outside the ranks

    def _outside(
        self, hosts: Sequence[str], cluster: tuple[str, str] | None, deadline: float
    ) -> dict[str, Any]:
        """The hosts' state from Prometheus (once for every target), within half the deadline."""
        out: dict[str, Any] = {"hosts": {}, "errors": []}
        if self.prometheus is None:
            if hosts:
                out["errors"].append("no Prometheus configured: the hosts' state is not in the bundle")
            return out
        from babysitter.incident.host import host_evidence

        budget = max(1.0, (deadline - time.monotonic()) / 2)
        client = self.prometheus.within(Deadline(budget))
        for host in list(dict.fromkeys(hosts))[:4]:
            out["hosts"][host] = host_evidence(client, host, at=self.clock(), cluster=cluster)
        return out

    # ------------------------------------------------------------------ waiting, then the summary

    def _finish(
        self, pending: _Pending, deadline: float, outside: dict[str, Any], cluster: tuple[str, str] | None
    ) -> Bundle:
        bundle, target = pending.bundle, pending.target
        if bundle.complete:
            return bundle
        answers: dict[int, dict[str, Any]] = {}
        with (
            F.opened_dir(target.directory) as run_fd,
            F.opened_dir(F.INCIDENTS, dir_fd=run_fd) as top,
            F.opened_dir(bundle.id, dir_fd=top) as folder,
        ):
            if bundle.run is not None:
                answers = self._answers(pending, folder, deadline)
            world = pending.world or max(
                (a["world_size"] for a in answers.values() if _count(a.get("world_size"))), default=None
            )
            run_state: dict[str, Any] = {}
            if bundle.run is not None and self.prometheus is not None:
                from babysitter.incident.host import run_evidence

                client = self.prometheus.within(Deadline(max(1.0, deadline - time.monotonic())))
                run_state = run_evidence(client, bundle.run, at=self.clock(), cluster=cluster)
            expected = set(range(world)) if world else set(answers)
            missing = sorted(expected - set(answers))
            files: dict[str, int] = {}
            owner = pending.owner
            if bundle.run is not None:
                files["ledger.json"] = F.write_json(
                    "ledger.json", {"records": pending.ledger}, dir_fd=folder, owner=owner
                )
                files.update(self._copies(run_fd, folder, pending))
            host = {**outside, "run": run_state} if run_state else outside
            if host.get("hosts") or host.get("errors") or run_state:
                files["host.json"] = F.write_json("host.json", host, dir_fd=folder, owner=owner)
            stuck = stuck_collective(answers, missing, run_state.get("last_enqueued"))
            alert = _read_alert(folder)
            summary = {
                "v": BUNDLE_VERSION,
                "id": bundle.id,
                "run": bundle.run,
                "created": round(pending.created, 6),
                "finished": round(self.clock(), 6),
                "alert": alert,
                "world_size": world,
                "answered": sorted(answers),
                "unusable": sorted(r for r, a in answers.items() if a.get("unusable")),
                "missing": missing,
                "rank_hosts": run_state.get("hosts", {}),
                "stuck": stuck,
                "culprit": _culprit(alert),
                "hosts": sorted(outside.get("hosts", {})),
                "notes": pending.notes + list(outside.get("errors", [])) + list(run_state.get("errors", [])),
                "limits": {
                    "wait": self.limits.wait,
                    "max_bytes": self.limits.max_bytes,
                    "rank_bytes": pending.rank_bytes,
                    "max_incidents": self.limits.max_incidents,
                },
                "gatherer": {"host": socket.gethostname(), "pid": os.getpid(), "version": __version__},
            }
            total = _size(folder)
            summary["bytes"] = total
            try:
                total += F.write_json(F.BUNDLE, summary, dir_fd=folder, owner=owner)
            except FileExistsError:  # another gatherer finished it first: theirs stands
                bundle.new = False
                other = F.read_json(F.BUNDLE, dir_fd=folder, limit=4 * MiB)
                if isinstance(other, dict):
                    _fill(bundle, other)
                bundle.complete = True
                return bundle
        bundle.complete = True
        bundle.world_size = world
        bundle.answered = sorted(answers)
        bundle.missing = missing
        bundle.bytes = total
        return bundle

    def _answers(self, pending: _Pending, folder: int, deadline: float) -> dict[int, dict[str, Any]]:
        """The ranks' answers, read as they come until every rank of the world answered or the deadline."""
        answers: dict[int, dict[str, Any]] = {}
        world = pending.world
        limit = pending.rank_bytes
        budget = self.limits.max_bytes - _RESERVE  # the ranks' share of the bundle, all of them
        dropped: list[int] = []
        with F.opened_dir(F.RANKS, dir_fd=folder) as ranks:
            while True:
                for name in os.listdir(ranks):
                    rank = F.rank_of(name)
                    if rank is None or rank in answers:
                        continue
                    try:
                        size = os.stat(name, dir_fd=ranks, follow_symlinks=False).st_size
                    except OSError:
                        size = 0
                    if size > limit or budget - size < 0:
                        # Over its share (a rank that ignored the request), or past the bundle's size
                        # (a world too large for it even at the smallest share): not read, not kept.
                        with contextlib.suppress(OSError):
                            os.unlink(name, dir_fd=ranks)
                        answers[rank] = {"rank": rank, "unusable": True}
                        if size > limit:
                            pending.notes.append(
                                f"rank {rank}'s answer is not usable: {size} bytes, over its share"
                            )
                        else:
                            dropped.append(rank)
                        continue
                    budget -= size
                    try:
                        answer = F.read_json(name, dir_fd=ranks, limit=limit)
                    except (OSError, ValueError) as exc:
                        pending.notes.append(f"rank {rank}'s answer is not usable: {exc}"[:300])
                        answer = None
                    if not isinstance(answer, dict) or answer.get("rank") != rank:
                        answers[rank] = {"rank": rank, "unusable": True}
                        continue
                    answers[rank] = answer
                    if world is None and _count(answer.get("world_size")):
                        world = int(answer["world_size"])
                if world is not None and set(range(world)) <= set(answers):
                    break
                if time.monotonic() >= deadline:
                    break
                time.sleep(min(self.poll, max(0.0, deadline - time.monotonic())))
        if world is not None:
            pending.world = world
        if dropped:
            shown = ", ".join(map(str, sorted(dropped)[:16])) + (" ..." if len(dropped) > 16 else "")
            pending.notes.append(
                f"{len(dropped)} ranks' answers dropped: the bundle's {self.limits.max_bytes} bytes "
                f"were used (ranks {shown})"
            )
        return answers

    def _copies(self, run_fd: int, folder: int, pending: _Pending) -> dict[str, int]:
        """The watchdog's hang dumps and the ranks' crash records of the incident's time, cut to size."""
        files: dict[str, int] = {}
        since = pending.created - _LOOKBACK
        sources = (
            ("hangs", ("hangs",), _HANG_FILES, _HANG_BYTES, ".txt"),
            ("crashes", (F.INCIDENTS, F.CRASHES), _CRASH_FILES, _CRASH_BYTES, ".json"),
        )
        for dest, parts, count, limit, suffix in sources:
            try:
                source = _open_path(run_fd, parts)
            except OSError:
                continue
            try:
                chosen = []
                for name in os.listdir(source):
                    if not name.endswith(suffix) or name.startswith("."):
                        continue
                    with contextlib.suppress(OSError):
                        info = os.stat(name, dir_fd=source, follow_symlinks=False)
                        if stat.S_ISREG(info.st_mode) and info.st_mtime >= since:
                            chosen.append((info.st_mtime, name))
                chosen = sorted(chosen)[-count:]
                if not chosen:
                    continue
                _mkdir(dest, folder, pending.owner)
                with F.opened_dir(dest, dir_fd=folder) as out:
                    for _, name in chosen:
                        try:
                            data, cut = _head(source, name, limit)
                        except OSError:
                            continue
                        if cut:
                            data += b"\n[cut at %d bytes by the incident gatherer]\n" % limit
                        files[f"{dest}/{name}"] = F.write_file(name, data, dir_fd=out, owner=pending.owner)
            finally:
                os.close(source)
        return files


# ---------------------------------------------------------------------------------------- helpers


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_WORLD


def _open_path(run_fd: int, parts: Sequence[str]) -> int:
    fd = os.dup(run_fd)
    try:
        for part in parts:
            nxt = F.open_dir(part, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        raise
    return fd


def _head(dir_fd: int, name: str, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of a regular file, and whether it was longer."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise F.FileError(f"{name} is not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    return data[:limit], len(data) > limit


def _size(dir_fd: int) -> int:
    """Bytes of the regular files under a directory (not following links)."""
    total = 0
    for name in os.listdir(dir_fd):
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISREG(info.st_mode):
            total += info.st_size
        elif stat.S_ISDIR(info.st_mode):
            with F.opened_dir(name, dir_fd=dir_fd) as sub:
                total += _size(sub)
    return total


def _remove(top: int, name: str) -> None:
    """Remove ``top/name`` (a bundle or a stale build); a link is removed, never followed."""
    try:
        info = os.stat(name, dir_fd=top, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        _rmtree(top, name, 0)
    else:
        os.unlink(name, dir_fd=top)


def _rmtree(parent: int, name: str, depth: int) -> None:
    """``shutil.rmtree`` relative to a descriptor (3.10 has no ``dir_fd`` for it), links never followed."""
    if depth > 8:
        raise OSError(f"{name}: nested deeper than any bundle")
    with F.opened_dir(name, dir_fd=parent) as fd:
        for entry in os.listdir(fd):
            if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                _rmtree(fd, entry, depth + 1)
            else:
                os.unlink(entry, dir_fd=fd)
    os.rmdir(name, dir_fd=parent)


def _read_alert(folder: int) -> dict[str, Any] | None:
    try:
        alert = F.read_json("alert.json", dir_fd=folder, limit=MiB)
    except (OSError, ValueError):
        return None
    return alert if isinstance(alert, dict) else None


def _culprit(alert: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the page said of its culprit (the evidence that named it)."""
    if not alert:
        return None
    annotations = alert.get("annotations")
    labels = alert.get("labels")
    if not isinstance(annotations, dict):
        annotations = {}
    if not isinstance(labels, dict):
        labels = {}
    out = {
        k: str(annotations[k])[:2000] for k in ("culprit_hosts", "summary", "description") if k in annotations
    }
    for key in ("instance", "rank", "gpu", "uuid", "xid", "device", "port"):
        if key in labels:
            out[f"label_{key}"] = str(labels[key])[:200]
    return out or None


def _fill(bundle: Bundle, summary: dict[str, Any]) -> None:
    """A :class:`Bundle` from an existing bundle's summary."""
    world = summary.get("world_size")
    bundle.world_size = world if _count(world) else None
    for key in ("answered", "missing"):
        value = summary.get(key)
        if isinstance(value, list):
            setattr(bundle, key, [r for r in value if isinstance(r, int) and not isinstance(r, bool)])
    size = summary.get("bytes")
    bundle.bytes = size if isinstance(size, int) and not isinstance(size, bool) else 0
