"""Device step timing without a host-device synchronization.

On CUDA the tracker records one event per step boundary on the current stream (``Event.record`` only
enqueues a marker); the housekeeping thread later asks each event, in order, whether it has
completed (``Event.query``, non-blocking) and reads the elapsed time between consecutive completed
events. Nothing here ever waits for the device. On CPU the host clock is the device clock, and the
tracker's ring of ``perf_counter_ns`` boundaries is used instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["CudaStepTimer", "EventLike"]


class EventLike(Protocol):
    """The part of ``torch.cuda.Event`` the timer uses."""

    def record(self) -> None:
        """Enqueue the event on the current stream."""

    def query(self) -> bool:
        """True once the device has passed the event (never blocks)."""
        ...

    def elapsed_time(self, end: Any) -> float:
        """Milliseconds between this event and ``end`` (both completed)."""
        ...


class CudaStepTimer:
    """A ring of reusable timing events, one per step boundary.

    ``mark(i)`` runs on the training thread (one event record, no allocation); ``drain()`` runs on
    the housekeeping thread and returns the device durations of steps whose events completed.
    The ring is sized so that the device would have to fall thousands of steps behind the host
    before an unread event is recorded again; should it happen, those steps are counted as
    ``overrun`` and skipped rather than misread.
    """

    def __init__(self, make_event: Callable[[], EventLike], size: int = 4096) -> None:
        if size < 2 or size & (size - 1):
            raise ValueError("size must be a power of two >= 2")
        self._events = [make_event() for _ in range(size)]
        self._mask = size - 1
        self._marked = 0  # boundaries recorded (written by the training thread only)
        self._read = 0  # boundaries consumed (housekeeping thread only)
        self.overrun = 0

    def mark(self, index: int) -> None:
        """Record the boundary that ends step ``index`` (0-based count of steps by this process)."""
        self._events[index & self._mask].record()
        self._marked = index + 1

    def drain(self) -> list[float]:
        """Seconds of device time of each newly completed step, oldest first; never blocks."""
        marked = self._marked
        size = self._mask + 1
        if marked - self._read > size - 1:
            skipped = marked - self._read - (size - 1)
            self.overrun += skipped
            self._read += skipped
        durations: list[float] = []
        while self._read < marked:
            current = self._events[self._read & self._mask]
            if not current.query():
                break
            if self._read > 0:
                previous = self._events[(self._read - 1) & self._mask]
                durations.append(previous.elapsed_time(current) / 1000.0)
            self._read += 1
        return durations
