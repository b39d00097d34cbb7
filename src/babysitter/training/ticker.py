"""A tracker's helper thread: one call every ``interval`` seconds, stopped when the tracker closes.

The watchdog and the incident responder each run one; they share how it starts and stops (a daemon
thread, so a training script that forgets ``close()`` still exits; a bounded join, so ``close()``
never hangs on a helper that is stuck in its own work)."""

from __future__ import annotations

import threading
from typing import TypeVar

from babysitter.training.tracker import Tracker

__all__ = ["TrackerThread"]

_T = TypeVar("_T", bound="TrackerThread")


class TrackerThread:
    """Calls :meth:`tick` every ``interval`` seconds on a daemon thread named ``name``."""

    def __init__(self, tracker: Tracker, interval: float, name: str) -> None:
        self.tracker = tracker
        self.interval = float(interval)
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> object:
        """One pass; subclasses override it (and never raise from it)."""
        raise NotImplementedError

    def start(self: _T) -> _T:
        """Start the thread; the tracker's close stops it. Returns self."""
        self.tracker.add_close_hook(self.stop)
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (the tracker's close does this); waits 2 s at most."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()
