"""``babysitter top``'s one-line hint per run: why its MFU dropped, from :func:`babysitter.explain.explain`.

Cheap by construction: each refresh asks one bounded query (one series per run: rank 0's MFU now
against its median over the hour before the last 15 minutes); only runs whose MFU fell by the
alert's fraction get explained, each at most once per ``ttl`` seconds, on one background thread. The
view never waits for an explanation: it shows the last one it has.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable

from babysitter.catalog import train as T
from babysitter.explain import Explanation, explain
from babysitter.generate.config import GenerateConfig
from babysitter.prom import PromClient, PromError, finite

__all__ = ["RunHints", "hint_line"]

log = logging.getLogger(__name__)

#: Longest hint shown on a row.
_WIDTH = 160


def hint_line(answer: Explanation) -> str:
    """The first cause as one short line (or what was checked when nothing was found)."""
    top = answer.top
    if top is None:
        return "MFU dropped; explain found no cause (babysitter explain lists what it checked)"
    share = f" ({top.share:.0%} of the lost time)" if top.share is not None and top.seconds > 0 else ""
    text = f"likely {top.key.replace('_', ' ')}{share}: {top.text}"
    return text if len(text) <= _WIDTH else text[: _WIDTH - 3] + "..."


class RunHints:
    """Hints for the runs whose MFU dropped; ``hints()`` returns at once with what is ready."""

    def __init__(
        self,
        client: PromClient,
        *,
        cfg: GenerateConfig | None = None,
        window: float = 900.0,
        baseline: float = 3600.0,
        ttl: float = 300.0,
        now: Callable[[], float] = time.time,
        explainer: Callable[..., Explanation] = explain,
    ) -> None:
        self.client = client
        self.cfg = cfg or GenerateConfig()
        self.window, self.baseline, self.ttl = window, baseline, ttl
        self.now = now
        self._explain = explainer
        self._lock = threading.Lock()
        self._ready: dict[str, tuple[float, str]] = {}
        self._pending: set[str] = set()
        self._todo: queue.Queue[str] = queue.Queue(maxsize=4)
        self._worker: threading.Thread | None = None

    def dropped_query(self) -> str:
        """Runs with MFU under (1 - drop fraction) x the median over the baseline before the window."""
        mfu = T.MFU.name
        keep = 1 - self.cfg.mfu_drop_fraction
        rng, off = f"{round(self.baseline)}s", f"{round(self.window)}s"
        median = f"quantile_over_time(0.5, {mfu}[{rng}] offset {off})"
        return f"max by (run) ({mfu})\n< {keep:g} * max by (run) ({median})"

    def hints(self, runs: Iterable[str]) -> dict[str, str]:
        """The hints ready for ``runs``; asks for new ones where MFU dropped. PromError if its query fails."""
        wanted = set(runs)
        dropped = {
            s.labels.get("run", "")
            for s in self.client.query(self.dropped_query(), self.now())
            if finite(s.value) is not None
        } & wanted
        now = time.monotonic()
        with self._lock:
            for run in dropped:
                fresh = run in self._ready and now - self._ready[run][0] < self.ttl
                if not fresh and run not in self._pending:
                    try:
                        self._todo.put_nowait(run)
                    except queue.Full:
                        break
                    self._pending.add(run)
            self._start()
            return {run: text for run, (_, text) in self._ready.items() if run in dropped}

    def _start(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="babysitter-top-hints", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while True:
            try:
                run = self._todo.get(timeout=30.0)
            except queue.Empty:
                return
            try:
                answer = self._explain(
                    self.client, run, end=self.now(), window=self.window, baseline=self.baseline, cfg=self.cfg
                )
                text = hint_line(answer)
            except (PromError, ValueError) as exc:
                log.warning("babysitter top: explaining run %s failed: %s", run, exc)
                text = f"explain failed: {exc}"[:_WIDTH]
            with self._lock:
                self._ready[run] = (time.monotonic(), text)
                self._pending.discard(run)
