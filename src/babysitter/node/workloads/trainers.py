"""Local trainers: the metrics of every training process on this host, served on the agent's own port.

Trackers register their endpoint in the registration directory (:mod:`babysitter.registration`). At
each scrape the agent lists it with a :class:`~babysitter.registration.Scanner` (which skips, counts
and logs every file it cannot vouch for), fetches every live endpoint concurrently within a total
deadline (:mod:`babysitter.node.workloads.fetch`), and re-serves the parsed families (each family's text
parsed and checked once per shape: :mod:`~babysitter.node.workloads.templates`). So Prometheus needs one
scrape target per host, however many jobs and ranks run there.

The directory is shared by every user of the host, so a trainer's output is bound to its
registration: every sample must carry the ``run`` and ``rank`` it registered (missing ones are
added; another value, or an ``instance``, ``job`` or ``__`` label, fails the whole endpoint as
``label_mismatch``), at most ``max_series`` samples and ``max_bytes`` bytes are taken from one
endpoint, and names only the agent, Prometheus or another exporter may serve
(:mod:`~babysitter.node.workloads.reserved`, derived from the catalog) are dropped, one log line per
name. All trainers together get a host-wide budget (``max_series_total`` series, ``max_bytes_total``
bytes per scrape, read at most ``read_budget``), shared max-min fair per user, then per registration
(:mod:`~babysitter.node.workloads.share`); what does not fit is dropped in whole families, counted in
``babysitter_trainer_series_dropped_total{owner_uid,reason}`` and logged once per registration.

A scrape that says how long Prometheus waits (``X-Prometheus-Scrape-Timeout-Seconds``, passed in by
the agent through :meth:`TrainersCollector.limit_to`) shortens the fetch deadline to fit inside it.

Each registration's rank is served as a number too (``babysitter_trainer_rank``), which no trainer can
serve: the rules compare it with the world size the run's rank 0 declares.

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

from prometheus_client.core import Metric

from babysitter import registration
from babysitter.catalog import node as N
from babysitter.catalog.budget import BUDGET
from babysitter.node.collector import family_of
from babysitter.node.workloads import share
from babysitter.node.workloads.exposition import Headers, parse_text
from babysitter.node.workloads.fair_cache import FairCache
from babysitter.node.workloads.fetch import FETCH_ERRORS, Fetched, Fetcher, FetchError
from babysitter.node.workloads.reserved import RESERVED_PREFIXES, is_reserved_name, reserved_label
from babysitter.node.workloads.templates import Templates

__all__ = [
    "ERRORS",
    "MAX_BYTES_TOTAL",
    "MAX_SERIES_TOTAL",
    "READ_BUDGET",
    "RESERVED_PREFIXES",
    "TrainersCollector",
    "fetch_deadline",
]

log = logging.getLogger(__name__)

#: Every ``reason`` of ``babysitter_trainer_scrape_errors_total``.
ERRORS = (*FETCH_ERRORS, "too_many_series", "label_mismatch")
#: Series served from all trainers of a host per scrape (a real rank serves 17-44: docs/metrics.md).
MAX_SERIES_TOTAL = BUDGET.trainers
#: Bytes of exposition served from all trainers of a host per scrape (a real rank serves about 8 KB).
MAX_BYTES_TOTAL = 1024 * 1024
#: Bytes read from all trainers of a host per scrape, split per user then registration.
READ_BUDGET = 32 * 1024 * 1024
#: No endpoint's read limit is below this (8 times what a real rank serves), however many share.
READ_FLOOR = 64 * 1024
#: Time kept back from Prometheus' scrape timeout for the agent's own work after the fetches.
SCRAPE_MARGIN = 0.5
#: Comment lines remembered for all trainers (bytes, entries), shared fairly between users: a rank
#: sends 40-90 (``# HELP``/``# TYPE`` of each family).
HEADER_CACHE_BYTES = 2 * 1024 * 1024
HEADER_CACHE_ENTRIES = 4096


def fetch_deadline(configured: float, scrape_timeout: float | None) -> float:
    """The trainers' fetch deadline: the configured one, shortened to fit inside the scrape's
    timeout less a margin (at least half of it, for very short scrape timeouts)."""
    if scrape_timeout is None:
        return configured
    room = max(scrape_timeout - max(SCRAPE_MARGIN, 0.1 * scrape_timeout), scrape_timeout / 2)
    return min(configured, room)


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
        max_series_total: int = MAX_SERIES_TOTAL,
        max_bytes_total: int = MAX_BYTES_TOTAL,
        read_budget: int = READ_BUDGET,
        networks: Sequence[registration.Network] = (),
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        name: str = "trainers",
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"trainer fetch timeout must be positive, got {timeout}")
        if min(max_series, max_series_total, max_bytes_total, read_budget) <= 0:
            raise ValueError("trainer series and byte limits must be positive")
        self.name = name
        self.directory = directory
        self._timeout = timeout
        self._scrape_timeout: float | None = None
        self._max_series = max_series
        self._max_bytes = max_bytes
        self._max_series_total = max_series_total
        self._max_bytes_total = max_bytes_total
        self._read_budget = read_budget
        self._scanner = registration.Scanner(
            directory, networks=networks, max_per_user=max_per_user, max_endpoints=max_endpoints
        )
        context = ssl.create_default_context(cafile=ca_file)
        if client_cert is not None:  # for trackers that require client certificates (mutual TLS)
            try:
                context.load_cert_chain(*client_cert)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load trainer client certificate {client_cert[0]!r}: {exc}") from exc
        self._fetcher = Fetcher(timeout=timeout, max_bytes=max_bytes, ssl_context=context, networks=networks)
        self._dropped_names: set[str] = set()
        self._lock = threading.Lock()
        self._known: dict[str, registration.Endpoint] = {}
        self._failing: dict[str, str] = {}
        self._errors: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._dropped = 0
        self._series_dropped: collections.Counter[tuple[str, str]] = collections.Counter()
        self._told: set[tuple[str, str]] = set()
        self._templates = Templates(max_bytes=4 * max_bytes_total)
        self._headers: FairCache[str, object] = FairCache(
            max_bytes=HEADER_CACHE_BYTES, max_entries=HEADER_CACHE_ENTRIES
        )

    def limit_to(self, scrape_timeout: float | None) -> None:
        """The timeout of the scrape about to run (Prometheus' header), or None: the fetch fits in it."""
        self._scrape_timeout = scrape_timeout

    @staticmethod
    def _key(endpoint: registration.Endpoint) -> str:
        return f"{endpoint.pid}:{endpoint.start_time}:{endpoint.url}"

    def collect(self) -> Iterable[Metric]:
        """The families of every live trainer plus per-endpoint success, duration and errors."""
        with self._lock:
            found = self._scanner.scan(prune=True)
            self._forget_gone(found, self._scanner.dead)
            # A template is an endpoint's: the registration (run and rank included) is its key, and
            # its user's uid decides its fair share of the templates' and comment lines' bounds.
            owners = {r.endpoint: r.owner_uid for r in found}
            self._templates.keep(owners)
            self._headers.keep(owners)
            limits = share.read_limits(
                [r.owner_uid for r in found], budget=self._read_budget, floor=READ_FLOOR, cap=self._max_bytes
            )
            fetched = self._fetcher.fetch_all(
                [r.endpoint.url for r in found],
                timeout=fetch_deadline(self._timeout, self._scrape_timeout),
                max_bytes=limits,
            )
            blocks: dict[int, list[share.Block]] = {}
            errors: dict[int, FetchError] = {}
            for i, (reg, result) in enumerate(zip(found, fetched, strict=True)):
                try:
                    blocks[i] = self._blocks(reg, result)
                except FetchError as exc:
                    errors[i] = exc
            kept = self._allot(found, blocks)
            out: list[Metric] = []
            success = family_of(N.TRAINER_SCRAPE_SUCCESS)
            duration = family_of(N.TRAINER_SCRAPE_DURATION)
            ranks = family_of(N.TRAINER_RANK)
            for i, (reg, result) in enumerate(zip(found, fetched, strict=True)):
                ep = reg.endpoint
                error = errors.get(i)
                if error is None:
                    try:
                        out.extend(self._serve(reg, kept[i]))
                    except FetchError as exc:
                        error = exc
                labels = [ep.run, str(ep.rank), str(reg.owner_uid)]
                success.add_metric(labels, 0.0 if error else 1.0)  # type: ignore[attr-defined]
                duration.add_metric(labels, result.seconds)  # type: ignore[attr-defined]
                ranks.add_metric(labels, float(ep.rank))  # type: ignore[attr-defined]
                if error is not None:
                    self._errors[(ep.run, str(ep.rank), error.reason)] += 1
                self._log_transition(reg, error)
            return [*out, success, duration, ranks, *self._counters(len(found))]

    def close(self) -> None:
        """Nothing to release: each round's connections close with it."""

    def _counters(self, live: int) -> list[Metric]:
        trainers = family_of(N.TRAINERS)
        trainers.add_metric([], float(live))  # type: ignore[attr-defined]
        dropped = family_of(N.TRAINER_REGISTRATIONS_DROPPED)
        dropped.add_metric([], float(self._dropped))  # type: ignore[attr-defined]
        errors = family_of(N.TRAINER_SCRAPE_ERRORS)
        for labels, count in sorted(self._errors.items()):
            errors.add_metric(list(labels), float(count))  # type: ignore[attr-defined]
        skipped = family_of(N.TRAINER_REGISTRATIONS_SKIPPED)
        for reason, count in sorted(self._scanner.skipped().items()):
            skipped.add_metric([reason], float(count))  # type: ignore[attr-defined]
        series = family_of(N.TRAINER_SERIES_DROPPED)
        for (uid, why), count in sorted(self._series_dropped.items()):
            series.add_metric([uid, why], float(count))  # type: ignore[attr-defined]
        return [trainers, dropped, errors, skipped, series]

    def _blocks(self, reg: registration.Registered, result: Fetched) -> list[share.Block]:
        """The endpoint's families as text blocks, reserved names left out (counted): cheap scans only."""
        if result.error is not None:
            raise result.error
        body = result.body
        if body.count(b"\n") > 3 * self._max_series + 64:  # bounds the split's work
            samples = share.count_series(body)
            raise FetchError("too_many_series", f"{samples} series, more than the {self._max_series} allowed")
        split = share.split_families(body)
        samples = sum(block.series for block in split)
        if samples > self._max_series:
            raise FetchError("too_many_series", f"{samples} series, more than the {self._max_series} allowed")
        blocks = []
        for block in split:
            if block.name and is_reserved_name(block.name):
                self._drop_reserved(reg, block.name, block.series)
                continue
            blocks.append(block)
        return blocks

    def _allot(
        self, found: list[registration.Registered], blocks: dict[int, list[share.Block]]
    ) -> dict[int, list[share.Block]]:
        """The blocks each endpoint may serve: its fair share of the host's series and bytes, whole
        families in the order served (a family that does not fit is skipped, a later one may fit)."""
        order = sorted(blocks)
        picked = share.fair_pick(
            [found[i].owner_uid for i in order],
            [blocks[i] for i in order],
            max_series=self._max_series_total,
            max_bytes=self._max_bytes_total,
        )
        kept = dict(zip(order, picked, strict=True))
        for i in order:
            lost = sum(b.series for b in blocks[i]) - sum(b.series for b in kept[i])
            if lost:
                self._drop_budget(found[i], lost, sum(b.series for b in blocks[i]))
        return kept

    def _drop_budget(self, reg: registration.Registered, lost: int, asked: int) -> None:
        ep = reg.endpoint
        self._series_dropped[(str(reg.owner_uid), "budget")] += lost
        key = (self._key(ep), "budget")
        if key not in self._told and len(self._told) < 10_000:
            self._told.add(key)
            log.warning(
                "babysitter: trainer run=%s rank=%s (pid %d, uid %d) serves %d series, over its share of "
                "the host-wide trainer budget (%d series, %d bytes per scrape, shared fairly between "
                "users): %d dropped, in whole families (babysitter_trainer_series_dropped_total counts "
                "them; logged once)",
                ep.run,
                ep.rank,
                ep.pid,
                reg.owner_uid,
                asked,
                self._max_series_total,
                self._max_bytes_total,
                lost,
            )

    def _drop_reserved(self, reg: registration.Registered, name: str, series: int) -> None:
        self._series_dropped[(str(reg.owner_uid), "reserved")] += series
        if name not in self._dropped_names and len(self._dropped_names) < 1000:
            self._dropped_names.add(name)
            ep = reg.endpoint
            log.warning(
                "babysitter: trainer run=%s rank=%s (pid %d, uid %d) exports %s, a name reserved for the "
                "node agent, Prometheus or another exporter; dropped",
                ep.run,
                ep.rank,
                ep.pid,
                reg.owner_uid,
                name[:200],
            )

    def _serve(self, reg: registration.Registered, blocks: list[share.Block]) -> list[Metric]:
        """The families of an endpoint's kept blocks, each parsed and bound to its registration (or
        from its template: :mod:`~babysitter.node.workloads.templates`); any FetchError fails them all."""
        served: list[Metric] = []
        headers = self._headers.partition(reg.endpoint)
        for block in blocks:
            served.extend(
                self._templates.serve(
                    reg.endpoint, block.text, lambda text: self._bound(_parse(text, headers), reg)
                )
            )
        return served

    def _bound(self, families: list[Metric], reg: registration.Registered) -> list[Metric]:
        """The families this endpoint may serve: its own run and rank only, no reserved names or labels."""
        ep = reg.endpoint
        rank = str(ep.rank)
        kept = []
        for family in families:
            samples = []
            for sample in family.samples:
                got_run, got_rank = sample.labels.get("run", ep.run), sample.labels.get("rank", rank)
                if got_run != ep.run or got_rank != rank:
                    raise FetchError(
                        "label_mismatch",
                        f"serves {sample.name} with run={got_run[:64]!r} rank={got_rank[:16]!r}, registered "
                        f"as run={ep.run} rank={rank}",
                    )
                taken = reserved_label(sample.labels)
                if taken is not None:
                    raise FetchError(
                        "label_mismatch",
                        f"serves {sample.name} with label {taken[:64]}, which only the scrape sets",
                    )
                if is_reserved_name(sample.name):
                    self._drop_reserved(reg, sample.name, 1)
                    continue
                if "run" not in sample.labels or "rank" not in sample.labels:
                    samples.append(sample._replace(labels={**sample.labels, "run": ep.run, "rank": rank}))
                else:
                    samples.append(sample)
            if is_reserved_name(family.name):
                self._drop_reserved(reg, family.name, len(samples))
                continue
            if samples:
                family.samples[:] = samples
                kept.append(family)
        return kept

    def _forget_gone(self, found: list[registration.Registered], dead: set[registration.Endpoint]) -> None:
        """Forget the endpoints no longer registered; those whose registration was still there with
        its process gone (``dead``) died without unregistering: dropped, counted and logged. A process
        that unregistered and exited before this scan is not one of them (it closed its tracker)."""
        current = {self._key(r.endpoint): r.endpoint for r in found}
        for key, ep in list(self._known.items()):
            if key in current:
                continue
            del self._known[key]
            self._failing.pop(key, None)
            self._told.discard((key, "budget"))
            if ep not in dead:
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


def _parse(body: bytes, headers: Headers | None = None) -> list[Metric]:
    """Parse the blocks kept of an exposition (their samples were counted and bounded before); its
    comment lines remembered in ``headers`` (the registration's part of the collector's cache)."""
    if not body:
        return []
    try:
        return parse_text(body.decode("utf-8"), headers)
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError... on garbage
        raise FetchError("protocol", f"not Prometheus text: {type(exc).__name__}: {exc}"[:200]) from None
