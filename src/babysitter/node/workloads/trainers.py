"""Local trainers: the metrics of every training process on this host, served on the agent's own port.

Trackers register their endpoint in the registration directory (:mod:`babysitter.registration`). At
each scrape the agent lists it with a :class:`~babysitter.registration.Scanner` (which skips, counts
and logs every file it cannot vouch for), fetches every live endpoint concurrently within a total
deadline (:mod:`babysitter.node.workloads.fetch`), and re-serves the parsed families. So Prometheus needs one
scrape target per host, however many jobs and ranks run there.

The directory is shared by every user of the host, so a trainer's output is bound to its
registration: every sample must carry the ``run`` and ``rank`` it registered (missing ones are
added; another value fails the whole endpoint as ``label_mismatch``), at most ``max_series``
samples and ``max_bytes`` bytes are taken from one endpoint, and families in the agent's own
namespaces (:data:`RESERVED_PREFIXES`) are dropped with one log line per name.

Failures stay local: an endpoint that fails gets ``babysitter_trainer_scrape_success 0``, its
``babysitter_trainer_scrape_errors_total{reason}`` goes up and one line is logged until it recovers;
a trainer that died has its registration dropped, one log line, and
``babysitter_trainer_registrations_dropped_total`` goes up.
"""

from __future__ import annotations

import collections
import logging
import ssl
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from babysitter import registration
from babysitter.catalog import node as N
from babysitter.node.workloads.fetch import FETCH_ERRORS, Fetched, Fetcher, FetchError

__all__ = ["ERRORS", "RESERVED_PREFIXES", "TrainersCollector"]

log = logging.getLogger(__name__)

#: Every ``reason`` of ``babysitter_trainer_scrape_errors_total``.
ERRORS = (*FETCH_ERRORS, "too_many_series", "label_mismatch")
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


class TrainersCollector:
    """Fetch and re-serve every live trainer endpoint registered in ``directory``."""

    def __init__(
        self,
        directory: Path,
        *,
        timeout: float = 2.0,
        max_bytes: int = 512 * 1024,
        max_series: int = 2000,
        max_endpoints: int = 256,
        max_per_user: int = 64,
        networks: Sequence[registration.Network] = (),
        ca_file: str | None = None,
        name: str = "trainers",
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"trainer fetch timeout must be positive, got {timeout}")
        if max_series <= 0:
            raise ValueError(f"max_series must be positive, got {max_series}")
        self.name = name
        self.directory = directory
        self._max_series = max_series
        self._scanner = registration.Scanner(
            directory, networks=networks, max_per_user=max_per_user, max_endpoints=max_endpoints
        )
        self._fetcher = Fetcher(
            timeout=timeout,
            max_bytes=max_bytes,
            ssl_context=ssl.create_default_context(cafile=ca_file),
            networks=networks,
        )
        self._dropped_names: set[str] = set()
        self._lock = threading.Lock()
        self._known: dict[str, registration.Endpoint] = {}
        self._failing: dict[str, str] = {}
        self._errors: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._dropped = 0

    @staticmethod
    def _key(endpoint: registration.Endpoint) -> str:
        return f"{endpoint.pid}:{endpoint.start_time}:{endpoint.url}"

    def collect(self) -> Iterable[Metric]:
        """The families of every live trainer plus per-endpoint success, duration and errors."""
        with self._lock:
            found = self._scanner.scan(prune=True)
            self._forget_gone(found)
            fetched = self._fetcher.fetch_all([r.endpoint.url for r in found])
            out: list[Metric] = []
            success = N.TRAINER_SCRAPE_SUCCESS.family()
            duration = N.TRAINER_SCRAPE_DURATION.family()
            for reg, result in zip(found, fetched, strict=True):
                ep = reg.endpoint
                families, error = self._families(reg, result)
                labels = [ep.run, str(ep.rank), str(reg.owner_uid)]
                success.add_metric(labels, 0.0 if error else 1.0)  # type: ignore[attr-defined]
                duration.add_metric(labels, result.seconds)  # type: ignore[attr-defined]
                if error is not None:
                    self._errors[(ep.run, str(ep.rank), error.reason)] += 1
                self._log_transition(reg, error)
                out.extend(families)
            return [*out, success, duration, *self._counters(len(found))]

    def close(self) -> None:
        """Nothing to release: each round's connections close with it."""

    def _counters(self, live: int) -> list[Metric]:
        trainers = GaugeMetricFamily(N.TRAINERS.name, N.TRAINERS.help)
        trainers.add_metric([], float(live))
        dropped = CounterMetricFamily(
            N.TRAINER_REGISTRATIONS_DROPPED.base_name, N.TRAINER_REGISTRATIONS_DROPPED.help
        )
        dropped.add_metric([], float(self._dropped))
        errors = N.TRAINER_SCRAPE_ERRORS.family()
        for labels, count in sorted(self._errors.items()):
            errors.add_metric(list(labels), float(count))  # type: ignore[attr-defined]
        skipped = N.TRAINER_REGISTRATIONS_SKIPPED.family()
        for reason, count in sorted(self._scanner.skipped().items()):
            skipped.add_metric([reason], float(count))  # type: ignore[attr-defined]
        return [trainers, dropped, errors, skipped]

    def _families(
        self, reg: registration.Registered, result: Fetched
    ) -> tuple[list[Metric], FetchError | None]:
        if result.error is not None:
            return [], result.error
        try:
            return self._bound(_parse(result.body, self._max_series), reg.endpoint), None
        except FetchError as exc:
            return [], exc

    def _bound(self, families: list[Metric], ep: registration.Endpoint) -> list[Metric]:
        """The families this endpoint may serve: its own run and rank only, no reserved names."""
        rank = str(ep.rank)
        kept = []
        for family in families:
            for i, sample in enumerate(family.samples):
                got_run, got_rank = sample.labels.get("run", ep.run), sample.labels.get("rank", rank)
                if got_run != ep.run or got_rank != rank:
                    raise FetchError(
                        "label_mismatch",
                        f"serves {sample.name} with run={got_run[:64]!r} rank={got_rank[:16]!r}, registered "
                        f"as run={ep.run} rank={rank}",
                    )
                if "run" not in sample.labels or "rank" not in sample.labels:
                    family.samples[i] = sample._replace(labels={**sample.labels, "run": ep.run, "rank": rank})
            if family.name.startswith(RESERVED_PREFIXES):
                if family.name not in self._dropped_names and len(self._dropped_names) < 1000:
                    self._dropped_names.add(family.name)
                    log.warning(
                        "babysitter: trainer run=%s rank=%s (pid %d) exports %s, a name reserved for the "
                        "node agent; dropped",
                        ep.run,
                        ep.rank,
                        ep.pid,
                        family.name,
                    )
                continue
            kept.append(family)
        return kept

    def _forget_gone(self, found: list[registration.Registered]) -> None:
        current = {self._key(r.endpoint): r.endpoint for r in found}
        for key, ep in list(self._known.items()):
            if key in current:
                continue
            del self._known[key]
            self._failing.pop(key, None)
            if registration.is_alive(ep):
                log.info("babysitter: trainer run=%s rank=%s (pid %d) unregistered", ep.run, ep.rank, ep.pid)
            else:
                self._dropped += 1
                log.warning(
                    "babysitter: trainer run=%s rank=%s (pid %d) exited; dropped its registration %s",
                    ep.run,
                    ep.rank,
                    ep.pid,
                    ep.url,
                )
        self._known.update(current)
        live = {(ep.run, str(ep.rank)) for ep in current.values()}
        for labels in [k for k in self._errors if k[:2] not in live]:
            del self._errors[labels]

    def _log_transition(self, reg: registration.Registered, error: FetchError | None) -> None:
        ep = reg.endpoint
        key = self._key(ep)
        if error is not None and self._failing.get(key) != error.reason:
            self._failing[key] = error.reason
            log.warning(
                "babysitter: trainer run=%s rank=%s (pid %d, uid %d) at %s does not answer (%s): %s",
                ep.run,
                ep.rank,
                ep.pid,
                reg.owner_uid,
                ep.url,
                error.reason,
                error,
            )
        elif error is None and key in self._failing:
            del self._failing[key]
            log.info("babysitter: trainer run=%s rank=%s answers again", ep.run, ep.rank)


def _parse(body: bytes, max_series: int) -> list[Metric]:
    """Parse an exposition of at most ``max_series`` samples (counted before parsing: cheap)."""
    samples = sum(1 for line in body.split(b"\n") if line.strip() and not line.lstrip().startswith(b"#"))
    if samples > max_series:
        raise FetchError("too_many_series", f"{samples} series, more than the {max_series} allowed")
    try:
        return list(text_string_to_metric_families(body.decode("utf-8")))
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError... on garbage
        raise FetchError("protocol", f"not Prometheus text: {type(exc).__name__}: {exc}"[:200]) from None
