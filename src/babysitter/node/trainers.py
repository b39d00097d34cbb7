"""Local trainers: the metrics of every training process on this host, served on the agent's own port.

Trackers register their endpoint in the registration directory (:mod:`babysitter.registration`). At
each scrape the agent lists it (dropping registrations whose process is gone), fetches every live
endpoint over loopback in parallel with a short timeout, and re-serves the parsed families. So
Prometheus needs one scrape target per host, however many jobs and ranks run there.

Failures stay local: an endpoint that does not answer (hung, port closed, garbage) gets
``babysitter_trainer_scrape_success{run,rank} 0`` and one log line until it recovers; a trainer that
died has its registration dropped, one log line, and ``babysitter_trainer_registrations_dropped_total``
goes up. Families of the same name from several ranks are merged by the agent (see
:func:`babysitter.node.agent.merge_families`).

The registration directory is shared by every user of the host, so what a trainer serves is bounded
(``max_bytes`` per endpoint, ``max_endpoints`` per scrape) and may not speak for the agent: families
in the agent's own namespaces (:data:`RESERVED_PREFIXES`: GPU health, storage, checkpoints, the
agent's self-metrics) are dropped from trainer output, with one log line per name.
"""

from __future__ import annotations

import concurrent.futures
import logging
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from babysitter import registration
from babysitter.catalog import node as N

__all__ = ["RESERVED_PREFIXES", "TrainersCollector"]

log = logging.getLogger(__name__)

_MAX_LABEL = 128
#: Metric name prefixes only the agent may export; a trainer's families with them are dropped.
RESERVED_PREFIXES = (
    "gpu_",
    "storage_",
    "checkpoint_",
    "babysitter_collector_",
    "babysitter_node_",
    "babysitter_trainer",
    "babysitter_gpu_",
)


def _clean(text: str) -> str:
    return "".join(ch for ch in text if ch.isprintable()).strip()[:_MAX_LABEL]


@dataclass
class _Result:
    endpoint: registration.Endpoint
    families: list[Metric]
    seconds: float
    error: str = ""


class TrainersCollector:
    """Fetch and re-serve every live trainer endpoint registered in ``directory``."""

    def __init__(
        self,
        directory: Path,
        *,
        timeout: float = 2.0,
        max_bytes: int = 4 * 1024 * 1024,
        max_endpoints: int = 256,
        workers: int = 8,
        ca_file: str | None = None,
        name: str = "trainers",
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"trainer fetch timeout must be positive, got {timeout}")
        self.name = name
        self.directory = directory
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._max_endpoints = max_endpoints
        self._dropped_names: set[str] = set()
        self._over_limit_logged = False
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="bs-trainers"
        )
        context = ssl.create_default_context(cafile=ca_file)
        # Never route loopback fetches through a proxy from the environment.
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        self._lock = threading.Lock()
        self._known: dict[str, registration.Endpoint] = {}
        self._failing: set[str] = set()
        self._dropped = 0

    @staticmethod
    def _key(endpoint: registration.Endpoint) -> str:
        return f"{endpoint.pid}:{endpoint.start_time}:{endpoint.url}"

    def collect(self) -> Iterable[Metric]:
        """The families of every live trainer plus per-endpoint success and duration."""
        with self._lock:
            endpoints = registration.list_endpoints(self.directory, prune=True)
            if len(endpoints) > self._max_endpoints:
                if not self._over_limit_logged:
                    self._over_limit_logged = True
                    log.warning(
                        "babysitter: %d trainer endpoints registered in %s; serving the first %d",
                        len(endpoints),
                        self.directory,
                        self._max_endpoints,
                    )
                endpoints = endpoints[: self._max_endpoints]
            self._forget_gone(endpoints)
            futures = [self._pool.submit(self._fetch, ep) for ep in endpoints]
            results = [f.result() for f in futures]
            out: list[Metric] = []
            success = N.TRAINER_SCRAPE_SUCCESS.family()
            duration = N.TRAINER_SCRAPE_DURATION.family()
            seen: set[tuple[str, str]] = set()
            for result in results:
                ep = result.endpoint
                labels = (_clean(ep.run), str(ep.rank))
                if labels in seen:  # two endpoints claiming the same run and rank: report the first
                    labels = (labels[0], f"{labels[1]}-pid{ep.pid}")
                seen.add(labels)
                success.add_metric(list(labels), 0.0 if result.error else 1.0)  # type: ignore[attr-defined]
                duration.add_metric(list(labels), result.seconds)  # type: ignore[attr-defined]
                self._log_transition(ep, result.error)
                out.extend(self._allowed(result.families, ep))
            trainers = GaugeMetricFamily(N.TRAINERS.name, N.TRAINERS.help)
            trainers.add_metric([], float(len(endpoints)))
            dropped = CounterMetricFamily(
                N.TRAINER_REGISTRATIONS_DROPPED.base_name, N.TRAINER_REGISTRATIONS_DROPPED.help
            )
            dropped.add_metric([], float(self._dropped))
            return [*out, success, duration, trainers, dropped]

    def close(self) -> None:
        """Stop the fetch threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _allowed(self, families: list[Metric], ep: registration.Endpoint) -> list[Metric]:
        kept = []
        for family in families:
            if family.name.startswith(RESERVED_PREFIXES):
                if family.name not in self._dropped_names and len(self._dropped_names) < 1000:
                    self._dropped_names.add(family.name)
                    log.warning(
                        "babysitter: trainer run=%s rank=%s (pid %d) exports %s, a name reserved for the "
                        "node agent; dropped",
                        _clean(ep.run),
                        ep.rank,
                        ep.pid,
                        family.name,
                    )
                continue
            kept.append(family)
        return kept

    def _forget_gone(self, endpoints: list[registration.Endpoint]) -> None:
        current = {self._key(ep): ep for ep in endpoints}
        for key, ep in list(self._known.items()):
            if key in current:
                continue
            del self._known[key]
            self._failing.discard(key)
            if registration.is_alive(ep):
                log.info("babysitter: trainer run=%s rank=%s (pid %d) unregistered", ep.run, ep.rank, ep.pid)
            else:
                self._dropped += 1
                log.warning(
                    "babysitter: trainer run=%s rank=%s (pid %d) exited; dropped its registration %s",
                    _clean(ep.run),
                    ep.rank,
                    ep.pid,
                    ep.url,
                )
        self._known.update(current)

    def _log_transition(self, ep: registration.Endpoint, error: str) -> None:
        key = self._key(ep)
        if error and key not in self._failing:
            self._failing.add(key)
            log.warning(
                "babysitter: trainer run=%s rank=%s (pid %d) at %s does not answer: %s",
                _clean(ep.run),
                ep.rank,
                ep.pid,
                ep.url,
                error,
            )
        elif not error and key in self._failing:
            self._failing.discard(key)
            log.info("babysitter: trainer run=%s rank=%s answers again", _clean(ep.run), ep.rank)

    def _fetch(self, ep: registration.Endpoint) -> _Result:
        start = time.perf_counter()
        try:
            request = urllib.request.Request(ep.url, headers={"Accept": "text/plain; version=0.0.4"})  # noqa: S310
            with self._opener.open(request, timeout=self._timeout) as response:
                body = response.read(self._max_bytes + 1)
            if len(body) > self._max_bytes:
                raise ValueError(f"response larger than {self._max_bytes} bytes")
            families = list(text_string_to_metric_families(body.decode("utf-8")))
        except Exception as exc:
            return _Result(ep, [], time.perf_counter() - start, f"{type(exc).__name__}: {exc}"[:200])
        return _Result(ep, families, time.perf_counter() - start)
