"""The demo explains its throttle faults on screen: ``babysitter explain`` run in-process, off the view.

When a scripted ``throttle`` fault has lasted :attr:`FaultExplainer.delay` seconds, a background
thread asks :func:`babysitter.explain.explain` why the run slowed over those seconds (against the
demo's Prometheus, with the demo's rules, the fast profile: explain must read the recording rules
the demo's Prometheus records), and hands its top cause back as one line for the event log and the
closing report. Every query is bounded by the client's timeout; a failure becomes a line, never an
exception, and the demo's loop never waits for an answer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from babysitter.demo.scenario import DemoEvent
from babysitter.explain import Explanation, explain
from babysitter.generate.config import GenerateConfig
from babysitter.prom import PromClient

__all__ = [
    "EXPLAINED_EVENTS",
    "EXPLAIN_WINDOW",
    "ExplainedFault",
    "FaultExplainer",
    "explain_command",
    "explained_line",
]

log = logging.getLogger(__name__)

#: The scripted faults the demo explains on screen.
EXPLAINED_EVENTS = frozenset({"throttle"})

#: Seconds after a fault the demo explains: the fast rules' 20 s rate window, so that the step time at
#: the window's end is the throttled one (a 14 s window read a third of the slowdown, half ramped).
EXPLAIN_WINDOW = 20.0


@dataclass(frozen=True)
class ExplainedFault:
    """One fault and what explain said about it (``answer`` None when explain failed: ``error``)."""

    event: DemoEvent
    answer: Explanation | None
    error: str = ""
    #: Unix time the explained window ends.
    end: float = 0.0

    @property
    def top_key(self) -> str | None:
        """The cause ranked first (None: nothing found, or explain failed)."""
        top = self.answer.top if self.answer is not None else None
        return top.key if top is not None else None

    def line(self) -> str:
        """``explained <fault>: <cause> (<team>, <cost>): <cause's line>``, or why there is none."""
        return explained_line(self.event, self.answer, self.error)


def explain_command(prometheus_url: str, run: str, end: float, window: float, baseline: float) -> str:
    """The ``babysitter explain`` command that asks the same question from a shell (issue 22: the
    demo printed an answer but not how to get it again, nor which rate window its rules use: the
    command reads that from the rules the Prometheus has loaded)."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(round(end)))
    return (
        f"babysitter explain --prometheus {prometheus_url} --run {run} --at {at} "
        f"--window {window:g}s --baseline {baseline:g}s"
    )


def explained_line(event: DemoEvent, answer: Explanation | None, error: str = "") -> str:
    """The one line the demo prints for a fault explain looked at."""
    head = f"explained {event.describe()}:"
    if answer is None:
        return f"{head} explain failed: {error}"
    top = answer.top
    if top is None:
        return f"{head} nothing found over the {answer.window_seconds:.0f} s after it"
    timed = top.share is not None and top.seconds > 0
    of = "the lost time" if answer.lost_seconds >= answer.accounted_seconds else "what the causes cost"
    cost = f"{top.share:.0%} of {of}" if timed else "no time measured"
    return f"{head} {top.key.replace('_', ' ')} ({top.team}, {cost}): {top.text}"


class FaultExplainer:
    """Explains scheduled faults one at a time on a daemon thread; ``on_line`` gets each answer's line."""

    def __init__(
        self,
        prometheus_url: str,
        *,
        run: str,
        cluster: str,
        cfg: GenerateConfig,
        on_line: Callable[[str], None],
        delay: float = EXPLAIN_WINDOW,
        baseline: float = 30.0,
        timeout: float = 3.0,
    ) -> None:
        self.url = prometheus_url
        self.client = PromClient(prometheus_url, timeout=timeout)
        self.run, self.cluster, self.cfg = run, cluster, cfg
        self.on_line = on_line
        self.delay, self.baseline = delay, baseline
        self.results: list[ExplainedFault] = []
        self._todo: queue.Queue[tuple[DemoEvent, float] | None] = queue.Queue()
        self._stop = threading.Event()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="bs-demo-explain", daemon=True)
        self._thread.start()

    def schedule(self, event: DemoEvent, at: float) -> None:
        """Explain ``event`` (at Unix time ``at``) over ``[at, at + delay]``, once that is past."""
        with self._lock:
            self._pending += 1
        self._todo.put((event, at))

    def command(self, result: ExplainedFault) -> str:
        """The shell command that asks what ``result`` answered."""
        return explain_command(self.url, self.run, result.end, self.delay, self.baseline)

    @property
    def pending(self) -> int:
        """Faults scheduled and not answered yet."""
        with self._lock:
            return self._pending

    def close(self, wait: float = 0.0) -> None:
        """Let the answers due within ``wait`` seconds arrive, then stop (the rest is dropped)."""
        deadline = time.monotonic() + wait
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        self._stop.set()
        self._todo.put(None)
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + 1.0)

    def _work(self) -> None:
        while (item := self._todo.get()) is not None:
            event, at = item
            end = at + self.delay
            if self._stop.wait(max(0.0, end - time.time())):
                return
            result = self._explain(event, end)
            with self._lock:
                self.results.append(result)
                self._pending -= 1
            try:
                self.on_line(result.line())
            except Exception as exc:  # the view must not end the explainer
                log.warning("demo: showing an explanation failed: %s", exc)

    def _explain(self, event: DemoEvent, end: float) -> ExplainedFault:
        try:
            answer = explain(
                self.client,
                self.run,
                end=end,
                window=self.delay,
                baseline=self.baseline,
                cluster=self.cluster,
                cfg=self.cfg,
            )
        except Exception as exc:  # a Prometheus that fails or times out: a line, never a crash
            return ExplainedFault(event, None, f"{type(exc).__name__}: {exc}", end=end)
        return ExplainedFault(event, answer, end=end)
