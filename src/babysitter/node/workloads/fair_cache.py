"""A cache the host's trainers share, bounded in bytes and entries, whose eviction is fair between users.

The agent remembers what each registration's text parsed to (templates of its families, its comment
lines), so an honest rank's scrape reads values, not text. One user's churn (comment lines that change
at every scrape, on 60 endpoints) must not grow the agent past the bound, nor push an honest rank's
entries out. So each entry belongs to an owner (a registration) of a user (its uid); the bound is split
max-min fair, equally between the users with entries, then between each user's owners, as
:mod:`~babysitter.node.workloads.share` splits the series budget; and when an entry added goes over the
bound, the owner furthest over its share (in the larger of its shares of the bytes and of the entries)
loses its least recently used entries until the cache is within the bound again. An owner within its
share never loses an entry to another's churn: when the cache is over the bound, someone is over
their share. A user can only crowd out their own entries.

Sizes are what the caller counts an entry as holding (in bytes really held: the cache's own
bookkeeping per entry is added here, :data:`ENTRY_BYTES`). Not thread-safe: one collector's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["ENTRY_BYTES", "MISSING", "FairCache", "Partition"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Bytes the cache holds per entry besides the key and value: its OrderedDict slot and link and the
#: (value, size) pair (131 bytes in CPython 3.11: tracemalloc over 10,000 entries).
ENTRY_BYTES = 144
#: What :meth:`FairCache.get` gives for a key it does not hold (None may be a value).
MISSING: object = object()


class _Owner(Generic[K, V]):
    __slots__ = ("bytes", "entries", "share_bytes", "share_entries", "user")

    def __init__(self, user: Hashable) -> None:
        self.user = user
        self.entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0
        self.share_bytes = 1.0
        self.share_entries = 1.0

    def over(self) -> float:
        """How far over its share the owner is (1: at its share)."""
        return max(self.bytes / self.share_bytes, len(self.entries) / self.share_entries)


class FairCache(Generic[K, V]):
    """Entries of owners, at most ``max_bytes`` and ``max_entries`` in all (see the module docstring)."""

    def __init__(self, *, max_bytes: int, max_entries: int) -> None:
        if max_bytes <= 0 or max_entries <= 0:
            raise ValueError("a cache's bounds must be positive")
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._owners: dict[Hashable, _Owner[K, V]] = {}
        self._declared: dict[Hashable, Hashable] = {}
        self._bytes = 0
        self._entries = 0
        self.evictions = 0

    @property
    def size(self) -> int:
        """Bytes the entries are counted as holding, bookkeeping included."""
        return self._bytes

    @property
    def entries(self) -> int:
        """Entries held."""
        return self._entries

    def held(self, owner: Hashable) -> tuple[int, int]:
        """(bytes, entries) ``owner`` holds."""
        state = self._owners.get(owner)
        return (0, 0) if state is None else (state.bytes, len(state.entries))

    def keep(self, owners: Mapping[Any, Hashable]) -> None:
        """The live owners, each with its user: every other owner's entries go, and the shares are
        split between these (called once a scrape, with the registrations found)."""
        if owners == self._declared:
            return  # the same registrations as the last scrape (most scrapes): nothing to do
        self._declared = dict(owners)
        for owner in [o for o in self._owners if o not in owners]:
            self._forget(owner)
        for owner, user in owners.items():
            state = self._owners.get(owner)
            if state is not None and state.user != user:
                self._forget(owner)  # another user's now: nothing of the other's carries over
        self._share(owners)

    def get(self, owner: Hashable, key: K) -> V | object:
        """``owner``'s value for ``key`` (now its most recently used), or :data:`MISSING`."""
        state = self._owners.get(owner)
        if state is None:
            return MISSING
        found = state.entries.get(key)
        if found is None:
            return MISSING
        state.entries.move_to_end(key)
        return found[0]

    def put(self, owner: Hashable, key: K, value: V, size: int) -> None:
        """Remember ``value`` for ``owner``'s ``key``, counted as ``size`` bytes (plus the entry's own
        :data:`ENTRY_BYTES`); evicts as the module docstring says. A value larger than the whole
        bound is not remembered."""
        size += ENTRY_BYTES
        if size > self.max_bytes:
            return
        state = self._owners.get(owner)
        if state is None:
            state = self._owners[owner] = _Owner(owner)  # not declared by keep(): its own user
            self._share({o: s.user for o, s in self._owners.items()})
            self._declared = {}  # the next keep() has an owner to forget
        old = state.entries.pop(key, None)
        if old is not None:
            state.bytes -= old[1]
            self._bytes -= old[1]
            self._entries -= 1
        state.entries[key] = (value, size)
        state.bytes += size
        self._bytes += size
        self._entries += 1
        while self._over():
            victim = max((s for s in self._owners.values() if s.entries), key=_Owner.over)
            self._evict(victim)
            while self._over() and victim.entries and victim.over() > 1:
                self._evict(victim)  # the same owner while it stays over its share (no search again)

    def partition(self, owner: Hashable) -> Partition[K, V]:
        """``owner``'s entries as a small object with get and put (for code that knows no owners)."""
        return Partition(self, owner)

    def _over(self) -> bool:
        return self._bytes > self.max_bytes or self._entries > self.max_entries

    def _evict(self, victim: _Owner[K, V]) -> None:
        """Drop ``victim``'s least recently used entry."""
        _, (_, size) = victim.entries.popitem(last=False)
        victim.bytes -= size
        self._bytes -= size
        self._entries -= 1
        self.evictions += 1

    def _forget(self, owner: Hashable) -> None:
        state = self._owners.pop(owner)
        self._bytes -= state.bytes
        self._entries -= len(state.entries)

    def _share(self, owners: Mapping[Any, Hashable]) -> None:
        """Each owner's share: the bounds split equally per user, then per owner of that user."""
        per_user: dict[Hashable, int] = {}
        for user in owners.values():
            per_user[user] = per_user.get(user, 0) + 1
        for owner, user in owners.items():
            state = self._owners.get(owner)
            if state is None:
                state = self._owners[owner] = _Owner(user)
            parts = len(per_user) * per_user[user]
            state.share_bytes = self.max_bytes / parts
            state.share_entries = self.max_entries / parts


class Partition(Generic[K, V]):
    """One owner's view of a :class:`FairCache`."""

    __slots__ = ("_cache", "_owner")

    def __init__(self, cache: FairCache[K, V], owner: Hashable) -> None:
        self._cache = cache
        self._owner = owner

    def get(self, key: K) -> V | object:
        """The value for ``key``, or :data:`MISSING`."""
        return self._cache.get(self._owner, key)

    def put(self, key: K, value: V, size: int) -> None:
        """Remember ``value`` for ``key``, counted as ``size`` bytes."""
        self._cache.put(self._owner, key, value, size)
