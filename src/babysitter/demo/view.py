"""The demo's terminal: scenario events and pages as lines the moment they happen, and a live view.

On a terminal, a rich ``Live`` panel at the bottom shows the clock, the next scripted fault and the
runs, node and alerts ``babysitter top`` shows, laid out for 80x24 (:mod:`babysitter.demo.panel`),
while events and pages scroll above it. Piped to a file
or a CI log, there is no animation: the same event and page lines, plus a one-line status every
``status_every`` seconds.
"""

from __future__ import annotations

import textwrap
import threading
import time
from typing import Any

from babysitter.demo.pager import Page
from babysitter.demo.scenario import DemoEvent
from babysitter.terminal import clean
from babysitter.views.top import Frame, RunRow

__all__ = ["INDENT", "DemoView", "receiver_verb", "wrapped"]

#: Width of the clock at the head of every line (``[+ 25.1s] ``): continuation lines start under it.
INDENT = 10


def wrapped(line: str, width: int, indent: int = INDENT) -> str:
    """``line`` wrapped at ``width`` with its continuations indented under the clock, so a terminal
    or a log of 80 columns never wraps or cuts it (issue 22); words longer than a line are split."""
    if len(line) <= width:
        return line
    return textwrap.fill(
        line, width=width, subsequent_indent=" " * indent, break_long_words=True, break_on_hyphens=False
    )


def receiver_verb(receiver: str) -> str:
    """How a line names the receiver a notification went to: ``PAGE`` for a pager (infra's ``pager``
    or a team's ``pager-<team>``, which the line then names), else the receiver's name."""
    return "PAGE" if receiver in ("", "pager") or receiver.startswith("pager-") else receiver.upper()


def _run_status(run: RunRow) -> str:
    parts = [f"run {run.run}: step {run.step if run.step is not None else '-'}"]
    if run.mfu is not None:
        parts.append(f"MFU {run.mfu:.1%}")
    if run.goodput is not None:
        parts.append(f"goodput {run.goodput:.1%}")
    if run.step_seconds is not None:
        parts.append(f"step {run.step_seconds * 1000:.0f}ms")
    if run.checkpoint_age is not None:
        parts.append(f"last ckpt {run.checkpoint_age:.0f}s ago")
    return ", ".join(parts)


class DemoView:
    """Everything the demo prints goes through here (one lock: lines never interleave)."""

    def __init__(
        self,
        console: Any,
        *,
        t0: float,
        duration: float,
        live: bool | None = None,
        status_every: float = 15.0,
        wrap: bool | None = None,
    ) -> None:
        self.console = console
        #: Wrap long lines under the clock at the console's width: on a terminal (default), so an
        #: 80-column one never breaks a line mid-word; piped (a CI log), lines stay whole for grep.
        self.wrap = console.is_terminal if wrap is None else wrap
        self.t0 = t0
        self.duration = duration
        self.live_enabled = console.is_terminal if live is None else live
        self.status_every = status_every
        self._lock = threading.RLock()
        self._live: Any = None
        self._frame: Frame | None = None
        self._next: DemoEvent | None = None
        self._pages: list[Page] = []
        #: Pages still arrive after the scenario (a RESOLVED as the stack stops): once the closing
        #: tables and the report print, nothing more does.
        self._held = False
        self._last_status = 0.0

    def _clock(self, at: float | None = None) -> str:
        return f"[+{(at if at is not None else time.time()) - self.t0:5.1f}s]"

    def start(self) -> None:
        """Start the live panel (terminal only)."""
        if not self.live_enabled:
            return
        from rich.live import Live

        with self._lock:
            self._live = Live(self._panel(), console=self.console, refresh_per_second=2, transient=True)
            self._live.start()

    def stop(self) -> None:
        """Remove the live panel; later output is plain lines."""
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    def _print(self, line: str, style: str | None) -> None:
        line = clean(line)  # alert labels and summaries come from Alertmanager: no control characters
        text = wrapped(line, self.console.width) if self.wrap else line
        self.console.print(text, style=style, soft_wrap=True, highlight=False, markup=False)

    def say(self, text: str, style: str | None = None, *, live: bool = False) -> None:
        """A timestamped line (plain text: no markup); ``live``: one that happened on its own (an
        explanation), not printed once :meth:`hold` holds the pages."""
        with self._lock:
            if live and self._held:
                return
            self._print(f"{self._clock()} {text}", style)

    def event(self, event: DemoEvent) -> None:
        """A scripted fault happens now."""
        self.say(f"FAULT {event.describe()}", style="bold yellow")

    def hold(self, held: bool = True) -> None:
        """Stop printing pages (they are still kept), before the closing tables and the report;
        ``hold(False)`` prints the ones that come later again (``--keep``: the stack runs on)."""
        with self._lock:
            self._held = held

    def page(self, page: Page) -> None:
        """A notification arrived from Alertmanager, for the receiver it names (pager: ``PAGE``)."""
        with self._lock:
            self._pages.append(page)
            if self._held:
                return
            verb = receiver_verb(page.receiver)
            # Which receiver, unless the line already says: the infra pager is plain PAGE, chat is CHAT.
            to = f" (to {page.receiver})" if page.receiver not in ("", "pager") else ""
            if page.status == "firing":
                line = (
                    f"{self._clock(page.received)} {verb} {page.severity} {page.name} {page.subject()}: "
                    f"{page.summary}{to if verb == 'PAGE' else ''}"
                )
                paged = "bold red" if page.severity == "critical" else "red"
                style = paged if verb == "PAGE" else "yellow"
            else:
                line = f"{self._clock(page.received)} RESOLVED {page.name} {page.subject()}{to}"
                style = "green"
            self._print(line, style)
            self._refresh()

    def remediation(self, head: str, audit_line: str, *, refused: bool = False) -> None:
        """What the remediator did (or, in a dry run, would do), and its audit record."""
        with self._lock:
            style = "bold yellow" if refused else "bold magenta"
            self._print(f"{self._clock()} {head}", style)
            self._print(f"{' ' * INDENT}audit: {audit_line}", "magenta")
            self._refresh()

    def update(self, frame: Frame | None, next_event: DemoEvent | None) -> None:
        """New data for the live panel (or, without one, a status line now and then)."""
        with self._lock:
            self._frame = frame
            self._next = next_event
            if self._live is not None:
                self._refresh()
                return
            now = time.time()
            if frame is None or now - self._last_status < self.status_every:
                return
            self._last_status = now
            for run in frame.runs:
                self.say(_run_status(run), style="dim")
            for node in frame.nodes:
                xids = " ".join(f"Xid {c} x{n}" for c, n in node.xids.items())
                self.say(
                    f"node {node.instance}: {node.gpus_up}/{node.gpus} GPUs up {xids}".rstrip(), style="dim"
                )

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._panel())

    def _panel(self) -> Any:
        from babysitter.demo.panel import panel

        return panel(self._frame, self._next, t0=self.t0, duration=self.duration)
