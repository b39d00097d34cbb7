"""``babysitter top``'s one-line hint per run: why its MFU dropped, from :func:`babysitter.explain.explain`.

Cheap by construction: each refresh asks one bounded query (one series per run: rank 0's MFU now
against its median over the hour before the last 15 minutes, or, for a run younger than that whose
GPU throttles now, against its best over the last 15 minutes); only runs whose MFU fell by the
alert's fraction get explained, each at most once per ``ttl`` seconds, on one background thread. The
view never waits for an explanation: it shows the last one it has. The explanation reads the rules
under the names the Prometheus has loaded (asked once, on that thread).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable

from babysitter.catalog import train as T
from babysitter.explain import Explanation, explain
from babysitter.explain.rules import detect_rules
from babysitter.generate.config import GenerateConfig
from babysitter.generate.rules import Records
from babysitter.prom import Deadline, PromClient, PromError, finite

__all__ = ["RunHints", "hint_line"]

log = logging.getLogger(__name__)

#: Longest hint shown on a row.
_WIDTH = 160


def hint_line(answer: Explanation) -> str:
    """The first cause as one short line (or what was checked when nothing was found)."""
    top = answer.top
    if top is None:
        return "MFU dropped; explain found no cause (babysitter explain lists what it checked)"
    # A share of the lost time when that is what the causes add up to; else of what they cost (no
    # baseline, or a slow one: the headline says which).
    of = "the lost time" if answer.lost_seconds >= answer.accounted_seconds else "what the causes cost"
    share = f" ({top.share:.0%} of {of})" if top.share is not None and top.seconds > 0 else ""
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
        #: None: read from the rules the Prometheus has loaded, at the first explanation.
        self.cfg = cfg
        self.window, self.baseline, self.ttl = window, baseline, ttl
        self.now = now
        self._explain = explainer
        self._lock = threading.Lock()
        self._ready: dict[str, tuple[float, str]] = {}
        self._pending: set[str] = set()
        self._todo: queue.Queue[str] = queue.Queue(maxsize=4)
        self._worker: threading.Thread | None = None

    def dropped_query(self) -> str:
        """Runs with MFU under (1 - drop fraction) x the median over the baseline before the window;
        a run with no such baseline (younger than window + baseline) whose GPU throttles now, under
        that fraction of its best MFU over the window (issue 22: the demo's throttled run got no hint)."""
        cfg = self.cfg or GenerateConfig()
        mfu = T.MFU.name
        keep = 1 - cfg.mfu_drop_fraction
        rng, off = f"{round(self.baseline)}s", f"{round(self.window)}s"
        median = f"max by (run) (quantile_over_time(0.5, {mfu}[{rng}] offset {off}))"
        throttled = f"max by (run) ({Records(cfg).rank_gpu_throttle} > 0)"
        best = f"max by (run) (max_over_time({mfu}[{off}])) and on (run) {throttled}"
        return f"max by (run) ({mfu})\n< {keep:g} * ({median}\nor {best})"

    def hints(self, runs: Iterable[str], *, client: PromClient | None = None) -> dict[str, str]:
        """The hints ready for ``runs``; asks for new ones where MFU dropped. PromError if its query fails.
        ``client``: the caller's (a frame's, with its deadline); else this one's."""
        wanted = set(runs)
        dropped = {
            s.labels.get("run", "")
            for s in (client or self.client).query(self.dropped_query(), self.now())
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
                # One explanation is one command: all its queries within twice the request timeout.
                client = self.client.within(Deadline(2 * self.client.timeout))
                if self.cfg is None:
                    self.cfg = detect_rules(client, self.now()).cfg
                answer = self._explain(
                    client, run, end=self.now(), window=self.window, baseline=self.baseline, cfg=self.cfg
                )
                text = hint_line(answer)
            except (PromError, ValueError) as exc:
                log.warning("babysitter top: explaining run %s failed: %s", run, exc)
                text = f"explain failed: {exc}"[:_WIDTH]
            with self._lock:
                self._ready[run] = (time.monotonic(), text)
                self._pending.discard(run)
