"""Where babysitter keeps the errors it swallows, so training never sees them.

Each kind of failure is counted (exported as ``babysitter_internal_errors_total{where}`` or
``babysitter_input_rejected_total{reason}``) and logged once; repeats only count, so a failure that
happens every step cannot flood the training log.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["Tally"]

log = logging.getLogger("babysitter")


class Tally:
    """Counts events by key and logs the first of each key once."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, key: str, detail: object = None, *, said: str | None = None) -> None:
        """Count one event; log it if it is the first with this key (as ``said`` when given: what it
        is, for an event that is no error, a taken port say). Never raises."""
        try:
            with self._lock:
                first = key not in self._counts
                self._counts[key] = self._counts.get(key, 0) + 1
            if first:
                if said is not None:
                    log.warning("%s", said)
                elif isinstance(detail, BaseException):
                    log.warning(
                        "babysitter: %s in %s (training continues; further ones are only counted): %r",
                        self._what,
                        key,
                        detail,
                        exc_info=detail,
                    )
                else:
                    log.warning(
                        "babysitter: %s: %s%s (training continues; further ones are only counted)",
                        self._what,
                        key,
                        f": {detail}" if detail is not None else "",
                    )
        except Exception:  # noqa: S110  # pragma: no cover - logging itself failed; nothing is left to do
            pass

    def counts(self) -> dict[str, int]:
        """A snapshot of the counts."""
        with self._lock:
            return dict(self._counts)
