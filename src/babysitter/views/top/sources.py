"""Where ``babysitter top`` gets its frames: Prometheus, or ``/metrics`` endpoints fetched directly.

* :class:`PrometheusSource` asks a Prometheus server (instant queries and its active alerts, through
  the shared :class:`~babysitter.prom.PromClient`), so it sees every run and node that Prometheus
  scrapes, with rates over a window;
* :class:`MetricsSource` fetches node agent or tracker ``/metrics`` endpoints itself, for a machine
  without Prometheus; step time is then the mean between two refreshes (since start on the first).

A source never raises for an unreachable or broken endpoint: the frame carries the error instead, so
the view keeps running while Prometheus restarts.
"""

from __future__ import annotations

import math
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.prom import Deadline, PromClient, PromError, fetch
from babysitter.views.top.frame import AlertRow, Frame, NodeRow, RunRow, gpu_key
from babysitter.views.top.hints import RunHints

__all__ = ["PROMETHEUS_METRICS", "MetricsSource", "PrometheusSource"]

_TIMEOUT = 5.0
#: What :class:`PrometheusSource` queries: a distributed tier must keep these (see
#: ``babysitter.generate.distributed``, which drops what nothing reads before remote_write).
PROMETHEUS_METRICS = (
    T.STEPS,
    T.STEP,
    T.MFU,
    T.STEP_DURATION,
    T.LAST_STEP_TIMESTAMP,
    T.CKPT_LAST_SUCCESS,
    G.GOODPUT,
    G.RESTARTS,
    N.GPU_UP,
    N.GPU_XID_ERRORS,
    N.GPU_TEMPERATURE,
    N.GPU_UTILIZATION,
)
_MAX_BODY = 32 * 1024 * 1024


def _get(url: str, timeout: float, deadline: Deadline | None = None) -> bytes:
    """A /metrics body, all of it within ``timeout`` and the frame's ``deadline`` (a drip cannot hold it)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {url!r}")
    return fetch(
        url,
        timeout=timeout,
        max_bytes=_MAX_BODY,
        deadline=deadline,
        headers={"Accept": "text/plain, application/json"},
    )


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# --------------------------------------------------------------------------------------- Prometheus


class PrometheusSource:
    """Frames from a Prometheus server's HTTP API (``url`` like ``http://127.0.0.1:9090``)."""

    def __init__(
        self,
        url: str,
        *,
        window: str = "1m",
        lookback: str = "15m",
        timeout: float = _TIMEOUT,
        hints: bool = False,
        frame_deadline: float | None = None,
    ) -> None:
        self._base = PromClient(url, timeout=timeout)
        #: The client of the frame being built: its queries share one deadline (``frame_deadline``).
        self._client = self._base
        #: With ``hints``, runs whose MFU dropped get a one-line cause from ``babysitter explain``.
        self._hints = RunHints(self._base) if hints else None
        self.url = self._base.url
        self.window = window
        self.lookback = lookback
        self.timeout = timeout
        #: Seconds all the queries of one frame may take together.
        self.frame_deadline = frame_deadline if frame_deadline is not None else 2 * timeout

    def _by(self, expr: str, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for sample in self._client.query(expr):
            value = _finite(sample.value)
            name = sample.labels.get(key)
            if name is not None and value is not None:
                out[name] = value
        return out

    def frame(self) -> Frame:
        """Query runs, nodes and alerts; a failed query leaves its column empty and adds an error.
        All of them end within ``frame_deadline`` (then the rest fail at once, saying so)."""
        self._client = self._base.within(Deadline(self.frame_deadline))
        errors: list[str] = []

        def by(expr: str, key: str) -> dict[str, float]:
            try:
                return self._by(expr, key)
            except PromError as exc:
                errors.append(f"{exc}{exc.advice()}")
                return {}

        w = self.window
        step_sum, step_count = f"{T.STEP_DURATION.name}_sum", f"{T.STEP_DURATION.name}_count"
        ranks = by(f"count by (run) ({T.STEPS.name})", "run")
        step = by(f"max by (run) ({T.STEP.name})", "run")
        mfu = by(f"max by (run) ({T.MFU.name})", "run")
        goodput = by(f"max by (run) ({G.GOODPUT.name})", "run")
        step_time = by(
            f"sum by (run) (rate({step_sum}[{w}])) / sum by (run) (rate({step_count}[{w}]))", "run"
        )
        last_step = by(f"time() - max by (run) ({T.LAST_STEP_TIMESTAMP.name})", "run")
        ckpt = by(f"time() - max by (run) ({T.CKPT_LAST_SUCCESS.name} > 0)", "run")
        restarts = by(f"max by (run) ({G.RESTARTS.name})", "run")
        # Runs whose series are gone (ended, killed, their node down) stay listed for the lookback.
        seen = by(
            f"time() - max by (run) (max_over_time({T.LAST_STEP_TIMESTAMP.name}[{self.lookback}]))", "run"
        )
        gone = tuple(
            RunRow(run=run, ranks=0, last_step_age=age, reporting=False)
            for run, age in sorted(seen.items())
            if run not in ranks and run not in goodput
        )
        runs = (
            tuple(
                RunRow(
                    run=run,
                    ranks=int(ranks.get(run, 0)),
                    step=_int(step.get(run)),
                    mfu=mfu.get(run),
                    goodput=goodput.get(run),
                    step_seconds=step_time.get(run),
                    last_step_age=last_step.get(run),
                    checkpoint_age=ckpt.get(run),
                    restarts=_int(restarts.get(run)),
                )
                for run in sorted(set(ranks) | set(goodput))
            )
            + gone
        )
        if self._hints is not None:
            try:
                found = self._hints.hints((row.run for row in runs if row.reporting), client=self._client)
            except PromError as exc:
                errors.append(f"{exc}{exc.advice()}")
                found = {}
            runs = tuple(replace(row, hint=found.get(row.run)) for row in runs)
        nodes = self._nodes(errors)
        alerts = self._alerts(errors)
        return Frame(time.time(), f"prometheus {self.url}", runs, nodes, alerts, tuple(errors))

    def _nodes(self, errors: list[str]) -> tuple[NodeRow, ...]:
        try:
            up = self._client.query(N.GPU_UP.name)
            xids = self._client.query(f"sum by (instance, gpu, xid) ({N.GPU_XID_ERRORS.name})")
            temps = self._by(f"max by (instance) ({N.GPU_TEMPERATURE.name})", "instance")
            util = self._by(f"avg by (instance) ({N.GPU_UTILIZATION.name})", "instance")
        except PromError as exc:
            errors.append(f"{exc}{exc.advice()}")
            return ()
        gpus: dict[str, dict[str, bool]] = {}
        for item in up:
            gpus.setdefault(item.labels.get("instance", "?"), {})[item.labels.get("gpu", "?")] = (
                _finite(item.value) == 1.0
            )
        counts: dict[str, dict[str, int]] = {}
        for item in xids:
            value = _finite(item.value) or 0.0
            per = counts.setdefault(item.labels.get("instance", "?"), {})
            code = item.labels.get("xid", "?")
            per[code] = per.get(code, 0) + int(value)
        return tuple(
            NodeRow(
                instance=instance,
                gpus=len(gpus.get(instance, {})),
                lost=tuple(sorted((g for g, ok in gpus.get(instance, {}).items() if not ok), key=gpu_key)),
                xids={k: v for k, v in sorted(counts.get(instance, {}).items()) if v > 0},
                max_temperature=temps.get(instance),
                mean_utilization=util.get(instance),
            )
            for instance in sorted(set(gpus) | set(counts))
        )

    def _alerts(self, errors: list[str]) -> tuple[AlertRow, ...] | None:
        try:
            raw = self._client.alerts()
        except PromError as exc:
            errors.append(f"{exc}{exc.advice()}")
            return None
        rows = []
        for item in raw:
            labels = {str(k): str(v) for k, v in item.get("labels", {}).items()}
            rows.append(
                AlertRow(
                    name=labels.get("alertname", "?"),
                    state=str(item.get("state", "")),
                    severity=labels.get("severity", ""),
                    labels=labels,
                    since=_parse_rfc3339(item.get("activeAt")),
                    summary=str(item.get("annotations", {}).get("summary", "")),
                )
            )
        rows.sort(key=lambda a: (a.state != "firing", a.severity != "critical", a.name, a.subject()))
        return tuple(rows)


def _parse_rfc3339(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    from datetime import datetime

    try:
        # Prometheus writes nanoseconds; Python's parser takes at most microseconds.
        head, _, frac = text.rstrip("Z").partition(".")
        stamp = datetime.fromisoformat(head + "+00:00")
        return stamp.timestamp() + (float("0." + frac.rstrip("Z")) if frac else 0.0)
    except ValueError:
        return None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


# ----------------------------------------------------------------------------------------- /metrics


@dataclass
class _RankState:
    step: int | None = None
    mfu: float | None = None
    goodput: float | None = None
    last_step: float | None = None
    checkpoint: float | None = None
    restarts: int | None = None
    step_sum: float | None = None
    step_count: float | None = None


@dataclass
class _Scraped:
    """What one refresh read from the endpoints, by rank and by host."""

    ranks: dict[tuple[str, str], _RankState] = field(default_factory=dict)
    gpus: dict[str, dict[str, bool]] = field(default_factory=dict)
    xids: dict[str, dict[str, int]] = field(default_factory=dict)
    temps: dict[str, float] = field(default_factory=dict)
    utils: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, labels: dict[str, str], value: float, instance: str) -> None:
        v = _finite(value)
        if v is None:
            return
        if "run" in labels and name.startswith("train_"):
            self._train(
                self.ranks.setdefault((labels["run"], labels.get("rank", "0")), _RankState()), name, v
            )
        elif name == N.GPU_UP.name:
            self.gpus.setdefault(instance, {})[labels.get("gpu", "?")] = v == 1.0
        elif name == N.GPU_XID_ERRORS.name:
            per = self.xids.setdefault(instance, {})
            code = labels.get("xid", "?")
            per[code] = per.get(code, 0) + int(v)
        elif name == N.GPU_TEMPERATURE.name:
            self.temps[instance] = max(self.temps.get(instance, v), v)
        elif name == N.GPU_UTILIZATION.name:
            self.utils.setdefault(instance, []).append(v)

    @staticmethod
    def _train(state: _RankState, name: str, v: float) -> None:
        if name == T.STEP.name:
            state.step = int(v)
        elif name == T.MFU.name:
            state.mfu = v
        elif name == G.GOODPUT.name:
            state.goodput = v
        elif name == T.LAST_STEP_TIMESTAMP.name:
            state.last_step = v
        elif name == T.CKPT_LAST_SUCCESS.name and v > 0:
            state.checkpoint = v
        elif name == G.RESTARTS.name:
            state.restarts = int(v)
        elif name == f"{T.STEP_DURATION.name}_sum":
            state.step_sum = v
        elif name == f"{T.STEP_DURATION.name}_count":
            state.step_count = v

    def node(self, instance: str) -> NodeRow:
        gpus = self.gpus.get(instance, {})
        utils = self.utils.get(instance)
        return NodeRow(
            instance=instance,
            gpus=len(gpus),
            lost=tuple(sorted((g for g, ok in gpus.items() if not ok), key=gpu_key)),
            xids=dict(sorted(self.xids.get(instance, {}).items())),
            max_temperature=self.temps.get(instance),
            mean_utilization=sum(utils) / len(utils) if utils else None,
        )


class MetricsSource:
    """Frames from ``/metrics`` endpoints (node agents, which also serve their trainers, or trackers)."""

    def __init__(
        self, urls: Sequence[str], *, timeout: float = _TIMEOUT, frame_deadline: float | None = None
    ) -> None:
        if not urls:
            raise ValueError("--metrics needs at least one URL")
        self.urls: list[str] = []
        for url in urls:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"--metrics needs http(s) URLs such as http://127.0.0.1:9946/metrics, got {url!r}"
                )
            self.urls.append(url if parts.path not in ("", "/") else url.rstrip("/") + "/metrics")
        self.timeout = timeout
        self.frame_deadline = frame_deadline if frame_deadline is not None else 2 * timeout
        self._previous: dict[tuple[str, str], tuple[float, float]] = {}

    def frame(self) -> Frame:
        """Fetch every endpoint once; an endpoint that fails adds an error line."""
        from prometheus_client.parser import text_string_to_metric_families

        now = time.time()
        errors: list[str] = []
        acc = _Scraped()
        deadline = Deadline(self.frame_deadline)
        for url in self.urls:
            instance = urllib.parse.urlsplit(url).netloc
            try:
                text = _get(url, self.timeout, deadline).decode("utf-8", "replace")
                families = list(text_string_to_metric_families(text))
            except (OSError, ValueError, PromError) as exc:
                errors.append(f"{url}: {exc}")
                continue
            for family in families:
                for sample in family.samples:
                    acc.add(sample.name, sample.labels, sample.value, instance)
        runs: dict[str, list[tuple[str, _RankState]]] = {}
        for (run, rank), state in acc.ranks.items():
            runs.setdefault(run, []).append((rank, state))
        rows = tuple(self._run_row(run, members, now) for run, members in sorted(runs.items()))
        nodes = tuple(acc.node(instance) for instance in sorted(set(acc.gpus) | set(acc.xids)))
        return Frame(now, "metrics " + " ".join(self.urls), rows, nodes, None, tuple(errors))

    def _run_row(self, run: str, members: list[tuple[str, _RankState]], now: float) -> RunRow:
        def pick(values: Iterable[float | None], how: Callable[[list[float]], float]) -> float | None:
            present = [x for x in values if x is not None]
            return how(present) if present else None

        step_times: list[float] = []
        for rank, st in members:
            if st.step_sum is None or st.step_count is None:
                continue
            before = self._previous.get((run, rank))
            self._previous[(run, rank)] = (st.step_sum, st.step_count)
            if before is not None and st.step_count > before[1]:
                step_times.append((st.step_sum - before[0]) / (st.step_count - before[1]))
            elif st.step_count > 0:
                step_times.append(st.step_sum / st.step_count)
        states = [st for _, st in members]
        last = pick((s.last_step for s in states), max)
        ckpt = pick((s.checkpoint for s in states), max)
        step = pick((s.step for s in states), max)
        restarts = pick((s.restarts for s in states), max)
        return RunRow(
            run=run,
            ranks=len(members),
            step=_int(step),
            mfu=pick((s.mfu for s in states), lambda xs: sum(xs) / len(xs)),
            goodput=pick((s.goodput for s in states), max),
            step_seconds=(sum(step_times) / len(step_times)) if step_times else None,
            last_step_age=None if last is None else max(0.0, now - last),
            checkpoint_age=None if ckpt is None else max(0.0, now - ckpt),
            restarts=_int(restarts),
        )


# ------------------------------------------------------------------------------------------- render
