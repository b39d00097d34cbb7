"""The node agent: runs its collectors at each scrape, reports each one's health, serves /metrics.

Every collector runs at each scrape, one after the other, each on its own long-lived worker thread
with a deadline (``collector_timeout``): an exception or
a hang (an NVML call on a GPU that fell off the bus can block for many seconds) marks only that
collector failed, in ``babysitter_collector_success{collector}`` and
``babysitter_collector_duration_seconds{collector}``, with one log line per distinct error; a hung
collector is not started again until its previous run returns. The scrape itself always succeeds.

A scrape that says how long Prometheus waits for it (``X-Prometheus-Scrape-Timeout-Seconds``) passes
that on to the collectors that can shorten their work to fit (``limit_to``: the trainers' fetches).

Families of the same exposed name from several sources (the ranks of a job, the agent's own build
info next to a tracker's) are merged into one family, and exact duplicate series are dropped, so the
exposition stays valid for Prometheus.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from babysitter._version import __version__
from babysitter.catalog import node as N
from babysitter.catalog import selfmon as S
from babysitter.export.server import MetricsServer, Request, Response, tls_context
from babysitter.export.text import Lines, render_text
from babysitter.node.collector import Collector, family_of

__all__ = ["SCRAPE_TIMEOUT_HEADER", "Agent", "Server", "merge_families", "scrape_timeout"]

log = logging.getLogger(__name__)

#: The request header in which Prometheus says how long it waits for the scrape.
SCRAPE_TIMEOUT_HEADER = "x-prometheus-scrape-timeout-seconds"
_scrape = threading.local()


class _Runner:
    """One collector, run on its own daemon thread with a deadline; never more than one run in flight.

    The thread lives as long as the agent and waits between scrapes (starting a thread per run cost
    about 45 us of CPU per collector and scrape); runs are asked for and answered through two
    ``queue.SimpleQueue`` (C, one lock each: a ``threading.Condition`` handoff cost about 40 us of
    CPU per collector and scrape). Daemon threads, not an executor: a collector stuck in a driver
    call must not keep the process from exiting at shutdown (executor threads are joined at
    interpreter exit).
    """

    def __init__(self, collector: Collector, timeout: float) -> None:
        self.collector = collector
        self.name = str(collector.name)
        self._timeout = timeout
        self._asks: queue.SimpleQueue[int | None] = queue.SimpleQueue()  # a run's number; None: stop
        self._answers: queue.SimpleQueue[tuple[int, Any, float]] = queue.SimpleQueue()
        self._asked = 0  # runs asked for
        self._done = 0  # runs whose answer was read (a late answer of a timed-out run counts too)
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._last_error = ""

    def start(self) -> bool:
        """Ask for a run; False (failed, logged) while the previous one has not returned."""
        while self._done != self._asked:
            try:
                self._done = self._answers.get_nowait()[0]  # a timed-out run that returned since
            except queue.Empty:
                busy = time.perf_counter() - self._started
                self._fail(f"previous run still in progress after {busy:.1f} s")
                return False
        self._asked += 1
        self._started = time.perf_counter()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=f"bs-{self.name}", daemon=True)
            self._thread.start()
        self._asks.put(self._asked)
        return True

    def finish(self) -> tuple[list[Metric], bool, float]:
        """(families, success, seconds) of the run :meth:`start` asked for, within the deadline."""
        deadline = self._started + self._timeout
        while True:
            left = deadline - time.perf_counter()
            try:
                if left <= 0:
                    raise queue.Empty
                done, outcome, seconds = self._answers.get(timeout=left)
            except queue.Empty:
                self._fail(f"timed out after {self._timeout:g} s")
                return [], False, time.perf_counter() - self._started
            self._done = done
            if done == self._asked:
                break
        if isinstance(outcome, BaseException):
            self._fail(f"{type(outcome).__name__}: {outcome}")
            return [], False, seconds
        if self._last_error:
            log.info("babysitter: collector %s works again", self.name)
            self._last_error = ""
        families: list[Metric] = outcome
        return families, True, seconds

    def run(self) -> tuple[list[Metric], bool, float]:
        """(families, success, seconds) of one collection."""
        return self.finish() if self.start() else ([], False, 0.0)

    def _work(self) -> None:
        while True:
            asked = self._asks.get()
            if asked is None:
                return
            try:
                outcome: Any = list(self.collector.collect())
            except BaseException as exc:
                outcome = exc
            self._answers.put((asked, outcome, time.perf_counter() - self._started))

    def _fail(self, error: str) -> None:
        if error != self._last_error:
            log.warning("babysitter: collector %s failed: %s", self.name, error)
            self._last_error = error

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread, close the collector; give up (logged) after ``timeout`` if it is stuck."""
        self._asks.put(None)

        def work() -> None:
            try:
                self.collector.close()
            except Exception as exc:
                log.warning("babysitter: closing collector %s failed: %s", self.name, exc)

        thread = threading.Thread(target=work, name=f"bs-close-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("babysitter: collector %s did not close within %g s", self.name, timeout)


class Agent:
    """The collector registry of one host; a prometheus_client collector itself (``collect()``)."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        *,
        backend: str = "none",
        driver_version: str = "",
        collector_timeout: float = 10.0,
    ) -> None:
        names = [str(c.name) for c in collectors]
        if len(set(names)) != len(names):
            raise ValueError(f"collector names must be unique, got {names}")
        if collector_timeout <= 0:
            raise ValueError(f"collector timeout must be positive, got {collector_timeout}")
        self._runners = [_Runner(c, collector_timeout) for c in collectors]
        self.backend = backend
        self.driver_version = driver_version
        self._scrape_lock = threading.Lock()

    @property
    def collector_names(self) -> list[str]:
        """Names of the enabled collectors, in run order."""
        return [r.name for r in self._runners]

    def collect(self) -> Iterator[Metric]:
        """One scrape: every collector's families, their health, build and backend info."""
        yield from merge_families(self._families())

    def _families(self) -> list[Metric]:
        """Every collector's families and the agent's own, as they come (not merged)."""
        timeout: float | None = getattr(_scrape, "timeout", None)
        _scrape.timeout = None  # one request's header, read once
        with self._scrape_lock:
            families: list[Metric] = []
            success = family_of(N.COLLECTOR_SUCCESS)
            duration = family_of(N.COLLECTOR_DURATION)
            # One collector after the other: run at once, their threads fight over the GIL and the
            # scrape costs a fifth more CPU (benchmarks/results/node_agent.md) for a shorter wall time.
            for runner in self._runners:
                limit_to = getattr(runner.collector, "limit_to", None)
                if callable(limit_to):
                    limit_to(timeout)
                got, ok, seconds = runner.run()
                families.extend(got)
                success.add_metric([runner.name], 1.0 if ok else 0.0)  # type: ignore[attr-defined]
                duration.add_metric([runner.name], seconds)  # type: ignore[attr-defined]
            build = S.BUILD_INFO.family()
            build.add_metric([], {"version": __version__, "python": sys.version.split()[0]})  # type: ignore[attr-defined]
            info = N.NODE_INFO.family()
            info.add_metric([], {"backend": self.backend, "driver_version": self.driver_version})  # type: ignore[attr-defined]
            families.extend([success, duration, build, info])
        return families

    def registry(self) -> CollectorRegistry:
        """A fresh registry holding only this agent (what the HTTP server renders)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def render(self) -> bytes:
        """The /metrics body, as the server sends it (the text format, :mod:`babysitter.export.text`)."""
        # Merged by name here, duplicates dropped while rendering: one key per series, not two.
        return render_text(merge_families(self._families(), dedupe=False), on_duplicate=_duplicate)

    def close(self, timeout: float = 5.0) -> None:
        """Close every collector (threads, NVML handles, files) within ``timeout`` seconds in total."""
        deadline = time.monotonic() + timeout
        for runner in self._runners:
            runner.close(max(deadline - time.monotonic(), 0.05))


def _exposed(family: Metric) -> tuple[str, str]:
    """(name as exposed, type as exposed): info families render as ``<name>_info`` gauges."""
    if family.type == "info":
        return f"{family.name}_info", "gauge"
    return family.name, family.type


def _duplicate(name: str) -> None:
    _log_once(("dup", name), "babysitter: dropping duplicate series of %s", name)


def merge_families(families: Iterable[Metric], *, dedupe: bool = True) -> list[Metric]:
    """One family per exposed name, first-seen help and type; duplicate series (unless ``dedupe`` is
    off: the renderer drops them then) and type clashes dropped."""
    if not dedupe:
        return _join(families)
    merged: dict[str, Metric] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for family in families:
        name, kind = _exposed(family)
        target = merged.get(name)
        if target is None:
            target = Metric(name if family.type == "info" else family.name, family.documentation, kind)
            target.unit = family.unit
            merged[name] = target
        elif target.type != kind:
            _clash(name, kind, target.type)
            continue
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in seen:
                _log_once(("dup", sample.name), "babysitter: dropping duplicate series of %s", sample.name)
                continue
            seen.add(key)
            target.samples.append(sample)
    return list(merged.values())


def _join(families: Iterable[Metric]) -> list[Metric]:
    """:func:`merge_families` for the renderer, in one pass: a family whose name no other has is
    served as it is; the ranks' Lines of one name are joined as lines; anything else as samples."""
    merged: dict[str, Metric] = {}
    kinds: dict[str, str] = {}
    ours: set[str] = set()  # names whose merged family is made here (the others are a source's own)
    for family in families:
        kind = family.type
        name = f"{family.name}_info" if kind == "info" else family.name
        if kind == "info":
            kind = "gauge"
        target = merged.get(name)
        if target is None:
            merged[name] = family
            kinds[name] = kind
            continue
        if kinds[name] != kind:
            _clash(name, kind, kinds[name])
            continue
        if name not in ours:
            ours.add(name)
            if type(target) is Lines and type(family) is Lines:
                joined: Metric = Lines.like(target)
                joined.rows.extend(target.rows)  # type: ignore[attr-defined]
            else:
                joined = Metric(name if target.type == "info" else target.name, target.documentation, kind)
                joined.unit = target.unit
                joined.samples.extend(target.samples)
            target = merged[name] = joined
        if type(target) is Lines:
            if type(family) is Lines:
                target.rows.extend(family.rows)
                continue
            joined = Metric(target.name, target.documentation, kind)  # another kind of family too
            joined.unit = target.unit
            joined.samples.extend(target.samples)
            target = merged[name] = joined
        target.samples.extend(family.samples)
    return list(merged.values())


def _clash(name: str, kind: str, already: str) -> None:
    _log_once(("type", name), "babysitter: dropping family %s of type %s (already %s)", name, kind, already)


_logged: set[tuple[str, str]] = set()


def _log_once(key: tuple[str, str], msg: str, *args: Any) -> None:
    if key not in _logged and len(_logged) < 1000:
        _logged.add(key)
        log.warning(msg, *args)


class _ScrapeTimeout:
    """Reads Prometheus' scrape timeout from each request for the collection the same worker runs next."""

    max_body = 0

    def check(self, request: Request) -> Response | None:
        return None

    def answer(self, request: Request) -> Response | None:
        # Every path but the favicon renders the metrics next, in this same worker thread.
        header = None if request.path == "/favicon.ico" else request.headers.get(SCRAPE_TIMEOUT_HEADER)
        _scrape.timeout = scrape_timeout(header)
        return None


def scrape_timeout(value: str | None) -> float | None:
    """The header's seconds when it is a sane positive number (at most an hour), else None."""
    if not value or len(value) > 32:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 < seconds <= 3600 else None


@dataclass
class Server:
    """The agent's HTTP endpoint: bounded connections, threads and deadlines (see MetricsServer)."""

    host: str
    port: int
    tls: bool
    _server: MetricsServer

    @property
    def url(self) -> str:
        """The URL to scrape, with a loopback host when bound to all addresses."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/metrics"

    @property
    def address(self) -> str:
        """``host:port`` as bound (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @classmethod
    def start(
        cls,
        agent: Agent,
        host: str,
        port: int,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
    ) -> Server:
        """Bind ``host:port`` (port 0: ephemeral) and serve; OSError when the address is unusable."""
        context = tls_context(certfile, keyfile or certfile) if certfile is not None else None
        server = MetricsServer(
            agent.registry(),
            host,
            port,
            ssl_context=context,
            workers=4,
            max_connections=128,
            handler=_ScrapeTimeout(),
            render=agent.render,
        ).start()
        return cls(host, server.port, certfile is not None, server)

    def stop(self) -> None:
        """Stop serving and release the port."""
        with contextlib.suppress(Exception):
            self._server.close()
