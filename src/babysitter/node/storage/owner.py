"""Whose rights the checkpoint sentinel uses for a run directory: the one user who controls it.

The sentinel reads what a run's ledger and manifests point at. Done with root's rights, that made it a
reader of anything for anyone who can write a ledger (issue 31). So each run directory is checked by
a worker holding the rights of the user who controls the directory, and nothing more:

- **Who controls a path.** Walking the configured path from ``/`` (``lstat``, symbolic links expanded
  by hand), every entry can be replaced by whoever can write the directory holding it: its owner, its
  group or everyone when they have write permission (with the sticky bit, only the entry's owner). The
  contents of the run directory itself are controlled by its owner, and by its group or everyone when
  they may write it.
- **The principal** is the one user among all of those (root when there is no other). Where there is
  more than one (a directory writable by a group or by everyone, a directory of one user inside
  another's) the worker runs as ``nobody`` (65534): then it can be led only to what everyone may read.
  A group write bit does not count when the group is the owner's own *user private group* (named
  after the owner, the owner's primary group, no other member listed; ``umask 002`` systems make
  every directory group-writable that way).

**Root looks only where only root decides.** The walk as root (:func:`walk` with ``full=False``, done in
the forked worker before it drops root, so a hung mount costs that worker only) stops at the first
entry someone else could replace: from there on that user decides what the path names. The agent
decides the principal (:func:`decide`, with the name service: in the agent, never in a forked child),
the worker takes that user's credentials and walks the whole path again as them (``full=True``); a
principal that is not the expected one (a directory of another user further down) makes it refuse,
and the agent starts it again as ``nobody``.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NOBODY",
    "Identity",
    "Principal",
    "PrivateGroups",
    "Walk",
    "agent_identity",
    "decide",
    "identity_for",
    "nobody",
    "private_groups",
    "walk",
]

#: uid and gid of the worker that verifies a run directory more than one user controls.
NOBODY = 65534
_MAX_LINKS = 40
_MAX_WRITERS = 64

#: ``private(uid)``: the gid of ``uid``'s user private group, or None when it has none.
PrivateGroups = Callable[[int], "int | None"]

_Writer = tuple[str, int]  # ("u", uid), ("g", gid), ("o", 0)


@dataclass(frozen=True)
class Walk:
    """What walking a run directory's path found: who can change it (``writers``: ``("u", uid)``,
    ``("g", gid)``, ``("o", 0)`` for everyone), where the first one besides root is (``where``), and
    whether the walk got to the directory (``reached``; False when it stopped where a user takes over).
    ``exists`` False: no directory there (``why`` says why)."""

    writers: frozenset[_Writer]
    where: str = ""
    reached: bool = False
    exists: bool = True
    why: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "writers": sorted([k, i] for k, i in self.writers),
            "where": self.where[:1024],
            "reached": self.reached,
            "exists": self.exists,
            "why": self.why[:300],
        }

    @classmethod
    def from_json(cls, obj: object) -> Walk:
        """A walk as a worker sent it (still root, but the answer is checked all the same)."""
        if type(obj) is not dict:
            raise ValueError("a walk must be an object")
        raw, where, why = obj.get("writers"), obj.get("where"), obj.get("why")
        reached, exists = obj.get("reached"), obj.get("exists")
        if type(raw) is not list or len(raw) > _MAX_WRITERS or type(where) is not str or type(why) is not str:
            raise ValueError("bad walk")
        if type(reached) is not bool or type(exists) is not bool:
            raise ValueError("bad walk")
        writers: set[_Writer] = set()
        for item in raw:
            if type(item) is not list or len(item) != 2 or item[0] not in ("u", "g", "o"):
                raise ValueError("bad writer")
            if type(item[1]) is not int or not 0 <= item[1] < 1 << 32:
                raise ValueError("bad writer")
            writers.add((str(item[0]), int(item[1])))
        return cls(frozenset(writers), where[:1024], reached, exists, why[:300])


@dataclass(frozen=True)
class Principal:
    """The one user who controls a run directory (``uid``; 0: root alone), or None when more than one
    does, with ``why``."""

    uid: int | None
    why: str = ""


def _entry_writers(directory: os.stat_result, entry: os.stat_result) -> set[_Writer]:
    """Who can rename, remove or replace ``entry`` inside ``directory``."""
    writers: set[_Writer] = {("u", directory.st_uid)}
    sticky = bool(directory.st_mode & stat.S_ISVTX)
    if directory.st_mode & stat.S_IWGRP:
        writers.add(("u", entry.st_uid) if sticky else ("g", directory.st_gid))
    if directory.st_mode & stat.S_IWOTH:
        writers.add(("u", entry.st_uid) if sticky else ("o", 0))
    return writers


def _content_writers(directory: os.stat_result) -> set[_Writer]:
    """Who can add or replace entries inside ``directory`` (the sticky bit does not stop additions)."""
    writers: set[_Writer] = {("u", directory.st_uid)}
    if directory.st_mode & stat.S_IWGRP:
        writers.add(("g", directory.st_gid))
    if directory.st_mode & stat.S_IWOTH:
        writers.add(("o", 0))
    return writers


def walk(path: Path, *, full: bool) -> Walk:
    """Who can change what ``path`` names and what is in it (see the module doc). ``full`` False stops
    at the first entry someone besides root could replace (root's walk); True goes to the end (the
    principal's walk, with its rights). OSError only for errors other than a missing, unreachable or
    looping component."""
    parts: deque[str] = deque(Path(os.path.abspath(path)).parts[1:])
    current = "/"
    links = 0
    writers: set[_Writer] = set()
    where = ""
    try:
        current_st = os.lstat(current)
        while parts:
            name = parts.popleft()
            if name in ("", "."):
                continue
            if name == "..":  # ``current`` is made of real directories: its lexical parent is its parent
                current = os.path.dirname(current)
                current_st = os.lstat(current)
                continue
            entry = os.path.join(current, name)
            st = os.lstat(entry)
            found = _entry_writers(current_st, st)
            if found != {("u", 0)} and not where:
                where = current
            writers |= found
            if where and not full:  # a user decides what ``name`` is: the rest is theirs to resolve
                return Walk(frozenset(writers), where)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    return Walk(frozenset(), exists=False, why="too many symbolic links")
                target = Path(os.readlink(entry))
                if target.is_absolute():
                    current, current_st = "/", os.lstat("/")
                    parts.extendleft(reversed(target.parts[1:]))
                else:
                    parts.extendleft(reversed(target.parts))
                continue
            if not stat.S_ISDIR(st.st_mode):
                return Walk(frozenset(), exists=False, why=f"{entry} is not a directory")
            current, current_st = entry, st
    except (FileNotFoundError, NotADirectoryError):
        return Walk(frozenset(), exists=False, why="no such directory")
    except PermissionError as exc:  # only where the walker is not root
        return Walk(frozenset(), exists=False, why=f"cannot be reached: {exc.strerror}")
    inside = _content_writers(current_st)
    if inside != {("u", current_st.st_uid)} or current_st.st_uid != 0:
        where = where or current
    return Walk(frozenset(writers | inside), where, reached=True)


def decide(found: Walk, private: PrivateGroups) -> Principal:
    """The principal of a walk: its one user besides root (root when none), or None with why."""
    where = found.where or "the run directory"
    if ("o", 0) in found.writers:
        return Principal(None, f"{where} or below is writable by everyone")
    users = sorted({ident for kind, ident in found.writers if kind == "u"} - {0})
    if len(users) > 1:
        return Principal(None, f"{where} or below is controlled by uids {', '.join(map(str, users))}")
    owner = users[0] if users else 0
    groups = sorted(ident for kind, ident in found.writers if kind == "g")
    shared = [g for g in groups if g != private(owner)]
    if shared:
        return Principal(None, f"{where} or below is writable by group {shared[0]}")
    return Principal(owner)


@dataclass(frozen=True)
class Identity:
    """The credentials a run's worker takes: ``uid`` None keeps the agent's own (root for a directory
    only root controls; the agent's user when the agent is not root). ``owner``: the uid its own walk
    must find in control (None: no expectation, as ``nobody`` or the agent's user); ``private_gid``
    that user's private group."""

    uid: int | None
    gid: int | None
    groups: tuple[int, ...]
    label: str
    owner: int | None
    private_gid: int | None = None
    why: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "uid": self.uid,
            "gid": self.gid,
            "groups": list(self.groups),
            "label": self.label,
            "owner": self.owner,
            "private_gid": self.private_gid,
            "why": self.why,
        }

    @classmethod
    def from_json(cls, obj: object) -> Identity:
        """What the agent sent its worker (the worker trusts its agent; this only checks the shape)."""
        if type(obj) is not dict:
            raise ValueError("an identity must be an object")
        ints = [obj.get(k) for k in ("uid", "gid", "owner", "private_gid")]
        groups = obj.get("groups")
        if not all(v is None or type(v) is int for v in ints) or type(groups) is not list:
            raise ValueError("bad identity")
        if not all(type(g) is int for g in groups):
            raise ValueError("bad identity")
        uid, gid, owner, private_gid = ints
        return cls(
            uid,
            gid,
            tuple(groups),
            str(obj.get("label", "")),
            owner,
            private_gid,
            str(obj.get("why", "")),
        )


class _Cache:
    """Name service answers (passwd, group), kept for ``ttl`` seconds: a pass must not ask LDAP or sssd
    once per run directory."""

    def __init__(self, ttl: float = 300.0) -> None:
        self.ttl = ttl
        self._private: dict[int, tuple[float, int | None]] = {}
        self._users: dict[int, tuple[float, tuple[str, int, tuple[int, ...]] | None]] = {}

    def private(self, uid: int) -> int | None:
        now = time.monotonic()
        hit = self._private.get(uid)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        gid: int | None = None
        try:
            pw = pwd.getpwuid(uid)
            group = grp.getgrgid(pw.pw_gid)
            if group.gr_name == pw.pw_name and set(group.gr_mem) <= {pw.pw_name}:
                gid = pw.pw_gid
        except (KeyError, OSError):
            gid = None
        if len(self._private) > 4096:
            self._private.clear()
        self._private[uid] = (now, gid)
        return gid

    def user(self, uid: int) -> tuple[str, int, tuple[int, ...]] | None:
        """(name, primary gid, every gid of the user) from the passwd and group databases."""
        now = time.monotonic()
        hit = self._users.get(uid)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        found: tuple[str, int, tuple[int, ...]] | None
        try:
            pw = pwd.getpwuid(uid)
            found = (pw.pw_name, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)))
        except (KeyError, OSError):
            found = None
        if len(self._users) > 4096:
            self._users.clear()
        self._users[uid] = (now, found)
        return found


_NAMES = _Cache()


def private_groups() -> PrivateGroups:
    """The user private group lookup, cached (the agent's side; a worker gets its one gid)."""
    return _NAMES.private


def nobody(why: str) -> Identity:
    """Verifying as ``nobody``: only what everyone may read, with ``why``."""
    return Identity(NOBODY, NOBODY, (), "nobody", owner=None, why=why)


def identity_for(found: Principal) -> Identity:
    """The credentials for a run directory whose principal is ``found`` (the agent is root)."""
    if found.uid is None:
        return nobody(found.why)
    private = _NAMES.private(found.uid)
    if found.uid == 0:
        return Identity(None, None, (), "root", owner=0, private_gid=private)
    user = _NAMES.user(found.uid)
    if user is None:  # no passwd entry (a container's uid): its own uid, no group's rights
        return Identity(found.uid, NOBODY, (), f"uid {found.uid}", owner=found.uid, private_gid=private)
    name, gid, groups = user
    return Identity(found.uid, gid, groups, f"uid {found.uid} ({name})", owner=found.uid, private_gid=private)


def agent_identity() -> Identity:
    """The agent is not root: its workers keep its user (they cannot change it)."""
    return Identity(None, None, (), "the agent's own user", owner=None)
