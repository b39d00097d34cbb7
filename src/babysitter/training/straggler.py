"""Straggler scores per rank, exchanged in-process over a CPU (gloo) process group.

Every ``every`` steps each rank contributes the median of its recent step times (and, when an
integration measures it, the median of its own *work* per step: the part not spent waiting for
peers), and every rank computes ``score = own median / median of all ranks' medians``: 1 is a
typical rank, 1.5 a rank 50% slower. PromQL's ``rank step time / median across ranks`` is the same
judgement from the scraped histograms.

Why it cannot deadlock or slow training:

* The exchange is an ``all_gather`` with ``async_op=True`` on a dedicated gloo group, issued from the
  training thread right after the step counts ``every, 2*every, ...``. Issuing never waits; gloo
  runs the collective on its own worker thread and the result is read on a later round (or at
  close) once ``is_completed()``. Every rank issues the same rounds in the same order because
  data-parallel ranks reach the same step counts, so rounds pair up across ranks.
* Nothing runs on another thread of ours: a round issued from a background thread could be left
  half-issued when the script ends and tear down the process group under a pending collective.
* A round that errors or stays pending past ``timeout`` turns the exchange off on that rank with one
  log line; the others then time out in gloo and turn off too. Training never waits on it.
* It touches no device tensor: the payload is a two-element CPU float64 tensor built from host
  timings, so there is no device synchronization.

Off (with one log line) when torch.distributed is not available or not initialized, or the world
size is 1. The group is created with ``torch.distributed.new_group(backend="gloo")`` - a collective
on the default group - so :meth:`StragglerMonitor.start` must run on every rank at the same point of
the script (``watch()`` and the framework callbacks do that).
"""

from __future__ import annotations

import datetime
import logging
import math
import statistics
import sys
import time
from collections import deque
from typing import Any

from babysitter.catalog import runtime as R
from babysitter.training.tracker import Tracker

__all__ = ["StragglerMonitor", "scores"]

log = logging.getLogger("babysitter")

_WORK_KEEP = 1024


def scores(medians: list[float]) -> list[float | None]:
    """Each entry over the median of the finite, positive entries; None where undefined."""
    valid = [m for m in medians if math.isfinite(m) and m > 0]
    if not valid:
        return [None] * len(medians)
    reference = statistics.median(valid)
    return [m / reference if math.isfinite(m) and m > 0 else None for m in medians]


class StragglerMonitor:
    """Per-rank straggler score for one tracker.

    Args:
        tracker: this rank's tracker.
        every: steps between exchanges (and the number of recent steps each median covers).
        timeout: seconds a round may stay pending before the exchange turns itself off; also the
            gloo group's timeout.
        max_pending: rounds this rank may be ahead of the slowest rank (ranks that do not step in
            lockstep) before the exchange turns itself off.
    """

    def __init__(
        self, tracker: Tracker, *, every: int = 100, timeout: float = 300.0, max_pending: int = 16
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
        self.enabled = False
        self.score: float | None = None
        self.rounds = 0
        self.world_size = 1
        self.rank = 0
        self._dist: Any = None
        self._torch: Any = None
        self._group: Any = None
        self._countdown = every
        self._pending: deque[tuple[float, Any, list[Any]]] = deque()
        self._work: deque[float] = deque(maxlen=_WORK_KEEP)
        self._work_seen = 0

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
        if dist is None or not dist.is_available() or not dist.is_initialized():
            log.info("babysitter: straggler scores off: torch.distributed is not initialized")
            return False
        world = int(dist.get_world_size())
        if world < 2:
            log.info("babysitter: straggler scores off: world size is 1")
            return False
        import torch

        timeout = datetime.timedelta(seconds=self.timeout)
        self._group = dist.new_group(backend="gloo", timeout=timeout)
        self._dist, self._torch = dist, torch
        self.world_size, self.rank = world, int(dist.get_rank())
        self.enabled = True
        self.tracker.add_metrics_source(self.metrics)
        self.tracker.add_close_hook(self.close)
        log.info("babysitter: straggler scores on: exchange every %d steps over gloo", self.every)
        return True

    def attach(self) -> StragglerMonitor:
        """Drive the exchange from ``tracker.step()`` (plain training loops); returns self.

        Wraps the bound method on this tracker instance: one extra Python call per step, the exchange
        itself only every ``every`` steps. Framework callbacks call :meth:`after_step` instead.
        """
        if not self.enabled:
            return self
        inner = self.tracker.step
        after = self.after_step

        def step(
            tokens: int | None = None,
            samples: int | None = None,
            loss: object = None,
            *,
            step: int | None = None,
        ) -> None:
            inner(tokens, samples, loss, step=step)
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
        if not self.enabled:
            return
        self._countdown -= 1
        if self._countdown > 0:
            return
        self._countdown = self.every
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
        steps = self.tracker.recent_step_seconds(self.every)
        step_median = statistics.median(steps) if steps else math.nan
        work = list(self._work)[-self.every :] if self._work_seen else []
        work_median = statistics.median(work) if work else math.nan
        torch = self._torch
        payload = torch.tensor([step_median, work_median], dtype=torch.float64)
        out = [torch.empty(2, dtype=torch.float64) for _ in range(self.world_size)]
        work_handle = self._dist.all_gather(out, payload, group=self._group, async_op=True)
        self._pending.append((time.monotonic(), work_handle, out))

    def _harvest(self) -> None:
        while self._pending:
            issued, handle, out = self._pending[0]
            if not handle.is_completed():
                if time.monotonic() - issued > self.timeout:
                    self._disable(f"a round pending for over {self.timeout:.0f} s", None)
                return
            self._pending.popleft()
            handle.wait()  # completed: returns at once, raises the collective's error if it failed
            self._update([row.tolist() for row in out])

    def _update(self, rows: list[list[float]]) -> None:
        works = [r[1] for r in rows]
        use_work = all(math.isfinite(w) and w > 0 for w in works)
        column = works if use_work else [r[0] for r in rows]
        self.score = scores(column)[self.rank]
        self.rounds += 1

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
                if self._pending[0][1].is_completed():
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
