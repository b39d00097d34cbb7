"""The safety rails' state: rate limit, drain cap, idempotency, and which alerts hold a host drained.

Pure bookkeeping with the time passed in, so alert storms can be replayed in property tests at any
speed. The remediator consults it before every action and records every action it took (dry runs
too: a dry run rehearses the rails as well), and rebuilds it from the audit log at start.

It also keeps, per host, the drain this remediator made (:class:`Drained`: for which alert, with which
reason, rehearsed or real): an undrain undoes only that drain, only while the scheduler still shows
that reason, and never undoes for real a drain that was only rehearsed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from babysitter.remediate.policy import DrainCap, RateLimit

__all__ = ["DISRUPTIVE", "Drained", "Rails"]

#: Actions the rate limit counts (an annotation changes nothing a job depends on).
DISRUPTIVE = frozenset({"drain", "undrain", "requeue"})
#: Idempotency keys are forgotten after this long (an alert firing for a month is still one episode).
KEY_TTL = 30 * 86400.0


@dataclass(frozen=True)
class Drained:
    """A drain this remediator made: why (the reason it gave the scheduler), for which alert, when."""

    reason: str
    alert_key: str | None
    dry_run: bool
    t: float


@dataclass
class Rails:
    """State behind the rails; every method takes ``now`` (Unix seconds)."""

    rate: RateLimit
    cap: DrainCap
    _actions: deque[float] = field(default_factory=deque)
    _drains: dict[str, float] = field(default_factory=dict)
    _done: dict[str, float] = field(default_factory=dict)
    _requeued: dict[str, float] = field(default_factory=dict)
    #: host -> keys of the alerts that keep it drained (an undrain waits until none is left).
    holders: dict[str, set[str]] = field(default_factory=dict)
    #: host -> the drain this remediator made there and has not undone.
    made: dict[str, Drained] = field(default_factory=dict)

    # ---------------------------------------------------------------- rate limit

    def _expire(self, now: float) -> None:
        while self._actions and self._actions[0] <= now - self.rate.window:
            self._actions.popleft()

    def rate_ok(self, now: float) -> bool:
        """Whether one more disruptive action fits in the rate limit's window."""
        self._expire(now)
        return len(self._actions) < self.rate.actions

    def actions_in_window(self, now: float) -> int:
        """Disruptive actions within the rate window."""
        self._expire(now)
        return len(self._actions)

    # ---------------------------------------------------------------- drain cap

    def cap_nodes(self, cluster_nodes: int) -> int:
        """Nodes the cap allows to be drained within its window."""
        return max(self.cap.min_nodes, math.floor(self.cap.fraction * cluster_nodes + 1e-9))

    def drained(self, now: float) -> set[str]:
        """Distinct hosts drained within the cap's window."""
        return {host for host, t in self._drains.items() if t > now - self.cap.window}

    def cap_ok(self, host: str, now: float, cluster_nodes: int) -> bool:
        """Whether draining ``host`` keeps the distinct drained hosts within the cap."""
        drained = self.drained(now)
        return host in drained or len(drained) < self.cap_nodes(cluster_nodes)

    # ---------------------------------------------------------------- idempotency

    def done(self, key: str) -> bool:
        """Whether the action with this key was already taken."""
        return key in self._done

    def recently_requeued(self, job: str, now: float) -> bool:
        """A job requeued within the rate window is not requeued again for another alert."""
        t = self._requeued.get(job)
        return t is not None and t > now - self.rate.window

    def held(self, host: str, now: float) -> bool:
        """Drained by this remediator within the cap's window, for alerts not all resolved."""
        return bool(self.holders.get(host)) and host in self.drained(now)

    def hold(self, host: str, alert_key: str, key: str, now: float) -> None:
        """Another alert keeps a host drained that is drained already: no new command."""
        self.holders.setdefault(host, set()).add(alert_key)
        self._done[key] = now

    # ---------------------------------------------------------------- recording

    def record(
        self,
        action: str,
        *,
        key: str | None,
        now: float,
        host: str | None = None,
        job: str | None = None,
        alert_key: str | None = None,
        done: bool = True,
        reason: str | None = None,
        dry_run: bool = False,
    ) -> None:
        """Account for one action attempt; ``done`` marks it taken (ok or dry run), not failed. A drain's
        ``reason`` and ``dry_run`` are what a later undrain checks."""
        if action in DISRUPTIVE:
            self._actions.append(now)
        if not done:
            return
        if key is not None:
            self._done[key] = now
        if action == "drain" and host is not None:
            self._drains[host] = now
            self.made[host] = Drained(reason or "", alert_key, dry_run, now)
            if alert_key is not None:
                self.holders.setdefault(host, set()).add(alert_key)
        elif action == "undrain" and host is not None:
            self.holders.pop(host, None)
            self.made.pop(host, None)
        elif action == "requeue" and job is not None:
            self._requeued[job] = now
        self._prune(now)

    def release(self, host: str, alert_key: str) -> bool:
        """The alert resolved and its rule undrains: True when it held the host and no other alert does.

        An alert whose rule does not undrain is never released: its host stays drained until a human
        resumes it, whatever other alerts about the host do.
        """
        holders = self.holders.get(host)
        if not holders or alert_key not in holders:
            return False
        holders.discard(alert_key)
        return not holders

    def _prune(self, now: float) -> None:
        if len(self._done) > 100_000 or (self._done and min(self._done.values()) < now - KEY_TTL):
            self._done = {k: t for k, t in self._done.items() if t >= now - KEY_TTL}
        for name in [n for n, d in self.made.items() if d.t < now - KEY_TTL]:
            del self.made[name]
        horizon = now - max(self.cap.window, self.rate.window)
        for table in (self._drains, self._requeued):
            for name in [n for n, t in table.items() if t <= horizon]:
                del table[name]
