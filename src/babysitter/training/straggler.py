"""Straggler scores per rank, exchanged in-process over a CPU (gloo) process group.

Every ``every`` steps each rank contributes the median of its recent step times (and, when an
integration measures it, the median of its own *work* per step: the part not spent waiting for
peers), and every rank computes ``score = own median / median of all ranks' medians``: 1 is a
typical rank, 1.5 a rank 50% slower. PromQL's ``rank step time / median across ranks`` is the same
judgement from the scraped histograms.

In lockstep training (a gradient all-reduce every step, as DDP and FSDP do) every rank's step time is
the slowest rank's, so those scores read 1 everywhere. Where torch's flight recorder is read
(``training/collectives.py``), each round also carries when every rank enqueued the same sampled
collectives of the default group, and the score becomes each rank's own work between collectives
over the median rank's, with every host's clock offset removed (``training/arrival.py`` has the
arithmetic); ``train_collective_lag_seconds`` says how much later than the median rank it arrives.
Without the recorder (off, or an old torch) the scores stay what they were.

Why it cannot deadlock or slow training:

* The exchange is an ``all_gather`` and an element-wise MAX ``all_reduce``, both with
  ``async_op=True`` on a dedicated gloo group, issued from the training thread right after the step
  counts ``every, 2*every, ...``. Issuing never waits; gloo runs the collectives on its own worker
  thread and the result is read on a later round (or at close) once ``is_completed()``. Every rank
  issues the same rounds in the same order because data-parallel ranks reach the same step counts, so
  rounds pair up across ranks; every rank issues both collectives of a round whether or not it has
  recorder data (missing data voids the round's arrival part on every rank alike).
* Nothing is issued from another thread of ours: a round issued from a background thread could be
  left half-issued when the script ends and tear down the process group under a pending collective.
  The recorder is read, and a round's completion is watched for (``is_completed()`` polled for a
  moment, to stamp the instant on this host's clock), on the collectives monitor's thread; the
  training thread only takes the results. No callback is attached to a collective's future: gloo
  aborts the process when a future with a callback fails at teardown (a round left pending by ranks
  that do not step in lockstep; seen in tests/test_multirank.py).
* A round that errors or stays pending past ``timeout`` turns the exchange off on that rank with one
  log line; the others then time out in gloo and turn off too. Training never waits on it.
* It touches no device tensor: the payloads are CPU float64 tensors built from host timings and the
  recorder's host-side records, so there is no device synchronization.

Off (with one log line) when torch.distributed is not available, or the world size is 1. When it is
not initialized yet (``watch()`` called before ``init_process_group``, so that the flight recorder
is on), the exchange waits: at each round boundary (every ``every`` steps, never per step) it checks,
and starts at the first one after the process group exists. The group is created with
``torch.distributed.new_group(backend="gloo")`` - a collective on the default group - so it must be
created on every rank at the same point: at setup (``watch()`` and the framework callbacks call
:meth:`StragglerMonitor.start` on every rank) or at the same step count (a round boundary).
"""

from __future__ import annotations

import datetime
import logging
import math
import socket
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from babysitter.catalog import runtime as R
from babysitter.ledger.slowdown import TOLERANCE
from babysitter.training import arrival, flight
from babysitter.training.tracker import Tracker

if TYPE_CHECKING:
    from babysitter.training.collectives import CollectiveMonitor

__all__ = ["StragglerMonitor", "scores"]

log = logging.getLogger("babysitter")

_WORK_KEEP = 1024
#: Arrival results (score, lag) a rank's exported value is the median of.
_KEEP_RESULTS = 3
#: Floats of one rank's all_gather row: step median, work median, the round the arrival result comes
#: from, trimmed mean gap, mean wait, that round's completion stamp, and what a recorder dump every round
#: would cost (dump seconds over seconds per round).
_ROW = 7


def scores(medians: list[float]) -> list[float | None]:
    """Each entry over the median of the finite, positive entries; None where undefined."""
    valid = [m for m in medians if math.isfinite(m) and m > 0]
    if not valid:
        return [None] * len(medians)
    reference = statistics.median(valid)
    return [m / reference if math.isfinite(m) and m > 0 else None for m in medians]


@dataclass
class _Round:
    """One issued round: its two pending collectives and what the arrival part needs back."""

    index: int
    issued: float
    gather: Any
    rows: list[Any]
    reduce: Any
    reduced: Any
    seqs: list[int] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    mode: str = "time"
    settled: bool = False
    done: list[float] = field(default_factory=lambda: [math.nan])


class StragglerMonitor:
    """Per-rank straggler score for one tracker.

    Args:
        tracker: this rank's tracker.
        every: steps between exchanges (and the number of recent steps each median covers).
        timeout: seconds a round may stay pending before the exchange turns itself off; also the
            gloo group's timeout.
        max_pending: rounds this rank may be ahead of the slowest rank (ranks that do not step in
            lockstep) before the exchange turns itself off.
        collectives: the flight-recorder reader whose captures give the arrival score (None: step
            and work times only).
    """

    def __init__(
        self,
        tracker: Tracker,
        *,
        every: int = 100,
        timeout: float = 300.0,
        max_pending: int = 16,
        collectives: CollectiveMonitor | None = None,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 2:
            raise ValueError(f"straggler exchange interval must be an int >= 2 steps, got {every!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"straggler timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be a positive int, got {max_pending!r}")
        self.tracker = tracker
        self.max_pending = max_pending
        self.every = every
        self.timeout = float(timeout)
        self.collectives = collectives
        self.enabled = False
        #: True while waiting for torch.distributed to be initialized (started at a round boundary).
        self.waiting = False
        self.score: float | None = None
        #: Where the score comes from: ``arrival`` (flight recorder), ``work`` or ``step`` times.
        self.source = ""
        self.arrival_score: float | None = None
        self.lag: float | None = None
        self.rounds = 0
        self.world_size = 1
        self.rank = 0
        self._dist: Any = None
        self._torch: Any = None
        self._group: Any = None
        self._countdown = every
        self._pending: deque[_Round] = deque()
        self._work: deque[float] = deque(maxlen=_WORK_KEEP)
        self._work_seen = 0
        self._next = 0
        self._offsets = arrival.ClockOffsets()
        self._result = (-1.0, math.nan, math.nan, math.nan)  # round, gap, wait, completion stamp
        self._cadence = 1
        self._round_seconds = 0.0  # time between rounds (smoothed)
        self._last_issue: float | None = None
        self._arrival_round = -(1 << 30)
        self._last_x: tuple[int, int] | None = None
        self._scores: deque[float] = deque(maxlen=_KEEP_RESULTS)
        self._lags: deque[float] = deque(maxlen=_KEEP_RESULTS)
        #: Rank 0: every rank's last arrival scores, and where each rank runs (host, GPU uuid).
        self._all_scores: list[deque[float]] = []
        self._placements: list[tuple[str, str]] = []
        self._reported: int | None = None

    # ------------------------------------------------------------------ setup

    def start(self) -> bool:
        """Create the gloo group (a collective: every rank, same point). True if the exchange is on."""
        try:
            return self._start()
        except Exception as exc:
            self.tracker.errors.record("straggler_setup", exc)
            log.warning("babysitter: straggler scores off: process group setup failed: %r", exc)
            return False

    def _start(self) -> bool:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and not dist.is_available():
            log.info("babysitter: straggler scores off: torch.distributed is not available")
            return False
        if dist is None or not dist.is_initialized():
            if not self.waiting:
                log.info(
                    "babysitter: straggler scores wait for torch.distributed: the exchange starts at the "
                    "first round boundary (every %d steps) after init_process_group",
                    self.every,
                )
            self.waiting = True
            return False
        self.waiting = False
        world = int(dist.get_world_size())
        if world < 2:
            log.info("babysitter: straggler scores off: world size is 1")
            return False
        import torch

        timeout = datetime.timedelta(seconds=self.timeout)
        self._group = dist.new_group(backend="gloo", timeout=timeout)
        self._dist, self._torch = dist, torch
        self.world_size, self.rank = world, int(dist.get_rank())
        self._exchange_placements(dist)
        self.enabled = True
        if self.collectives is not None:
            self.collectives.exclude_group(str(getattr(self._group, "group_name", "")))
        self.tracker.add_metrics_source(self.metrics)
        self.tracker.add_close_hook(self.close)
        log.info("babysitter: straggler scores on: exchange every %d steps over gloo", self.every)
        return True

    def _exchange_placements(self, dist: Any) -> None:
        """Every rank's host and GPU, once, for the ledger's straggler records (rank 0 writes them):
        a small all_gather at setup, where every rank already meets (the group's creation)."""
        mine = (socket.gethostname()[:256], str(self.tracker.gpu.get("uuid", ""))[:128])
        try:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine, group=self._group)
            self._placements = [
                (str(p[0]), str(p[1])) if isinstance(p, tuple) and len(p) == 2 else ("", "") for p in gathered
            ]
        except Exception as exc:  # the records then name the rank alone
            self.tracker.errors.record("straggler_setup", exc)
            self._placements = []

    def attach(self) -> StragglerMonitor:
        """Drive the exchange from ``tracker.step()`` (plain training loops); returns self.

        Wraps the bound method on this tracker instance: one extra Python call per step, the exchange
        itself only every ``every`` steps. Framework callbacks call :meth:`after_step` instead.
        """
        if not (self.enabled or self.waiting):
            return self
        inner = self.tracker.step
        after = self.after_step

        def step(
            tokens: int | None = None,
            samples: int | None = None,
            loss: object = None,
            *,
            step: int | None = None,
            grad_norm: object = None,
        ) -> None:
            inner(tokens, samples, loss, step=step, grad_norm=grad_norm)
            after()

        self.tracker.step = step  # type: ignore[method-assign]
        return self

    # ------------------------------------------------------------------ training thread

    def add_work(self, seconds: float) -> None:
        """Record one step's own work (time not spent waiting for peers), when an integration knows it."""
        self._work.append(seconds)
        self._work_seen += 1

    def after_step(self) -> None:
        """Call on the training thread after each step; every ``every`` calls it issues a round."""
        if not (self.enabled or self.waiting):
            return
        self._countdown -= 1
        if self._countdown > 0:
            return
        self._countdown = self.every
        if self.waiting and not self.start():
            return
        try:
            self._harvest()
            if self.enabled:
                self._issue()
        except Exception as exc:
            self._disable("round failed", exc)

    def _issue(self) -> None:
        if len(self._pending) >= self.max_pending:
            self._disable(f"{len(self._pending)} rounds still pending", None)
            return
        index, self._next = self._next, self._next + 1
        steps = self.tracker.recent_step_seconds(self.every)
        step_median = statistics.median(steps) if steps else math.nan
        work = list(self._work)[-self.every :] if self._work_seen else []
        work_median = statistics.median(work) if work else math.nan
        result_round, gap, wait, done = self._result
        now = time.monotonic()
        if self._last_issue is not None:
            interval = now - self._last_issue
            self._round_seconds = (
                interval if not self._round_seconds else 0.7 * self._round_seconds + 0.3 * interval
            )
        self._last_issue = now
        # What a dump every round would cost: the rounds dump every ceil(max over ranks / budget) rounds.
        dump = self.collectives.dump_seconds if self.collectives is not None else 0.0
        cost = dump / self._round_seconds if self._round_seconds > 0 else 0.0
        torch, dist = self._torch, self._dist
        row = [step_median, work_median, result_round, gap, wait, done, cost]
        payload = torch.tensor(row, dtype=torch.float64)
        out = [torch.empty(_ROW, dtype=torch.float64) for _ in range(self.world_size)]
        slots, pending = self._slots(index)
        reduced = torch.tensor(slots, dtype=torch.float64)
        gather = dist.all_gather(out, payload, group=self._group, async_op=True)
        reduce = dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        pending.gather, pending.rows, pending.reduce, pending.reduced = gather, out, reduce, reduced
        self._pending.append(pending)
        if self.collectives is not None:
            # Its thread stamps the instant the all_gather completes (clock offsets), then, on the
            # rounds the cadence picks, dumps the recorder for the next round's samples.
            self.collectives.request_capture(
                index, flight.wall_ns(), completion=(gather, pending.done), capture=index % self._cadence == 0
            )

    def _slots(self, index: int) -> tuple[list[float], _Round]:
        """The MAX payload for round ``index``: the samples of the capture taken after the last round."""
        pending = _Round(index, time.monotonic(), None, [], None, None)
        capture = self.collectives.round_capture(index - 1) if self.collectives is not None else None
        if capture is None or capture.x is None:
            return arrival.payload([], {}, 0.0)[0], pending
        seqs = arrival.sample_seqs(capture.x, self._last_x, capture.round_index, capture.capacity)
        self._last_x = (capture.round_index, capture.x)
        timed = capture.mode == "time"
        offset = self._offsets.offset(self.rank) if timed else 0.0
        values, own = arrival.payload(seqs, capture.arrivals, offset)
        pending.seqs, pending.own, pending.mode = seqs, own, capture.mode
        pending.settled = self._offsets.settled or not timed
        return values, pending

    def _harvest(self) -> None:
        while self._pending:
            head = self._pending[0]
            if not (head.gather.is_completed() and head.reduce.is_completed()):
                if time.monotonic() - head.issued > self.timeout:
                    self._disable(f"a round pending for over {self.timeout:.0f} s", None)
                return
            self._pending.popleft()
            head.gather.wait()  # completed: returns at once, raises the collective's error if it failed
            head.reduce.wait()
            self._update([row.tolist() for row in head.rows])
            self._take_arrival(head)

    def _take_arrival(self, head: _Round) -> None:
        """This rank's gaps and waits from a reduced round, sent with the next round."""
        gap = wait = math.nan
        if head.seqs and head.settled:
            result = arrival.evaluate(head.reduced.tolist(), head.seqs, head.own, gaps=head.mode == "time")
            gap, wait = result.gap, result.wait
        self._result = (float(head.index), gap, wait, head.done[0])

    def _update(self, rows: list[list[float]]) -> None:
        works = [r[1] for r in rows]
        use_work = all(math.isfinite(w) and w > 0 for w in works)
        column = works if use_work else [r[0] for r in rows]
        legacy = scores(column)[self.rank]
        if len(rows[0]) >= _ROW:
            self._update_arrival(rows)
        fresh = self.arrival_score is not None and self.rounds - self._arrival_round <= self._cadence + 3
        self.score = self.arrival_score if fresh else legacy
        self.source = "arrival" if fresh else ("work" if use_work else "step")
        self.rounds += 1

    def _update_arrival(self, rows: list[list[float]]) -> None:
        rounds = {r[2] for r in rows}
        if len(rounds) == 1 and next(iter(rounds)) >= 0:
            self._offsets.add([r[5] for r in rows])
            found, lags = arrival.arrival_scores([r[3] for r in rows], [r[4] for r in rows])
            # The median of the last three results: one round's sleep or GC pause on a healthy rank
            # must not move it past a threshold (every rank keeps the same three, from the same rows).
            score, lag = found[self.rank], lags[self.rank]
            if score is not None:
                self._scores.append(score)
                self.arrival_score, self._arrival_round = statistics.median(self._scores), self.rounds
            if lag is not None:
                self._lags.append(lag)
                self.lag = statistics.median(self._lags)
                if self.collectives is not None:
                    self.collectives.lag = self.lag
            if self.rank == 0:
                self._record_straggler(found)
        costs = [r[6] for r in rows if math.isfinite(r[6]) and r[6] >= 0]
        self._cadence = max(1, min(10_000, math.ceil(max(costs, default=0.0) / _budget())))

    def _record_straggler(self, found: list[float | None]) -> None:
        """Rank 0: tell the ledger which rank the others wait for (the median of its last three
        scores at least 1 + the slowdown tolerance), and once when none does any more."""
        if len(self._all_scores) != len(found):
            self._all_scores = [deque(maxlen=_KEEP_RESULTS) for _ in found]
        for queue, score in zip(self._all_scores, found, strict=True):
            if score is not None and math.isfinite(score):
                queue.append(score)
        medians = [statistics.median(q) if q else 0.0 for q in self._all_scores]
        worst = max(range(len(medians)), key=medians.__getitem__) if medians else None
        slow = worst is not None and medians[worst] >= 1.0 + TOLERANCE
        if not slow and self._reported is None:
            return
        host = gpu = None
        if slow and worst is not None and worst < len(self._placements):
            host, gpu = self._placements[worst][0] or None, self._placements[worst][1] or None
        self.tracker.record_straggler(
            worst if slow else None, medians[worst] if slow and worst is not None else 0.0, host, gpu
        )
        self._reported = worst if slow else None

    def _disable(self, why: str, exc: BaseException | None) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self._pending.clear()
        self.tracker.errors.record("straggler_exchange", exc if exc is not None else why)
        log.warning("babysitter: straggler scores off on rank %d: %s", self.rank, why)

    # ------------------------------------------------------------------ end and export

    def close(self, wait: float = 2.0) -> None:
        """Collect rounds that finish within ``wait`` seconds; the tracker's close calls this."""
        deadline = time.monotonic() + wait
        try:
            while self._pending and time.monotonic() < deadline:
                head = self._pending[0]
                if head.gather.is_completed() and head.reduce.is_completed():
                    self._harvest()
                else:
                    time.sleep(0.01)
        except Exception as exc:
            self._disable("last round failed", exc)

    def metrics(self, label_names: list[str], label_values: list[str]) -> list[Any]:
        """``train_straggler_score`` once a round completed (a tracker metrics source)."""
        if self.score is None:
            return []
        family = R.STRAGGLER_SCORE.family(label_names)
        family.add_metric(label_values, self.score)  # type: ignore[attr-defined]
        return [family]


def _budget() -> float:
    from babysitter.training.collectives import CAPTURE_BUDGET

    return CAPTURE_BUDGET
