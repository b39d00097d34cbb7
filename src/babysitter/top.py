"""``babysitter top``: a live terminal view of runs and nodes, from Prometheus or straight from ``/metrics``.

Two sources give the same :class:`Frame`:

* :class:`PrometheusSource` asks a Prometheus server (instant queries and its firing alerts), so it
  sees every run and node that Prometheus scrapes, with rates over a window;
* :class:`MetricsSource` fetches node agent or tracker ``/metrics`` endpoints itself, for a machine
  without Prometheus; step time is then the mean between two refreshes (since start on the first).

:func:`render` turns a frame into rich tables; :func:`run_top` refreshes them (``once`` for one frame).
A source never raises for an unreachable or broken endpoint: the frame carries the error instead, so
the view keeps running while Prometheus restarts.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import train as T

__all__ = [
    "PROMETHEUS_METRICS",
    "AlertRow",
    "Frame",
    "MetricsSource",
    "NodeRow",
    "PrometheusSource",
    "RunRow",
    "Source",
    "render",
    "run_top",
]

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


@dataclass(frozen=True)
class RunRow:
    """One training run, aggregated over its ranks."""

    run: str
    ranks: int
    step: int | None = None
    mfu: float | None = None
    goodput: float | None = None
    step_seconds: float | None = None
    last_step_age: float | None = None
    checkpoint_age: float | None = None
    restarts: int | None = None
    #: False for a run Prometheus saw within the lookback that exports nothing now (ended or died).
    reporting: bool = True


@dataclass(frozen=True)
class NodeRow:
    """One host (a node agent target): GPU health and Xid errors."""

    instance: str
    gpus: int
    lost: tuple[str, ...] = ()
    xids: dict[str, int] = field(default_factory=dict)
    max_temperature: float | None = None
    mean_utilization: float | None = None

    @property
    def gpus_up(self) -> int:
        """GPUs answering their health queries."""
        return self.gpus - len(self.lost)


@dataclass(frozen=True)
class AlertRow:
    """One active alert (firing or pending) as Prometheus reports it."""

    name: str
    state: str
    severity: str
    labels: dict[str, str]
    since: float | None
    summary: str = ""

    def subject(self) -> str:
        """The labels that tell what the alert is about (run, host, GPU...)."""
        keys = ("run", "instance", "gpu", "xid", "path", "step")
        return " ".join(f"{k}={self.labels[k]}" for k in keys if k in self.labels)


@dataclass(frozen=True)
class Frame:
    """Everything one refresh of the view shows."""

    time: float
    source: str
    runs: tuple[RunRow, ...] = ()
    nodes: tuple[NodeRow, ...] = ()
    alerts: tuple[AlertRow, ...] | None = None  # None: the source cannot know (plain /metrics)
    errors: tuple[str, ...] = ()

    def alerts_for_run(self, run: str) -> list[AlertRow]:
        """Firing alerts labeled with ``run``."""
        return [a for a in self.alerts or () if a.state == "firing" and a.labels.get("run") == run]

    def alerts_for_node(self, instance: str) -> list[AlertRow]:
        """Firing alerts about ``instance`` that carry no run label."""
        return [
            a
            for a in self.alerts or ()
            if a.state == "firing" and a.labels.get("instance") == instance and "run" not in a.labels
        ]


class Source(Protocol):
    """Where frames come from."""

    def frame(self) -> Frame:
        """The current state; never raises for remote failures (they go into ``errors``)."""
        ...


def _get(url: str, timeout: float) -> bytes:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {url!r}")
    request = urllib.request.Request(url, headers={"Accept": "text/plain, application/json"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - scheme checked above
        body: bytes = response.read(_MAX_BODY + 1)
    if len(body) > _MAX_BODY:
        raise ValueError(f"{url}: response larger than {_MAX_BODY} bytes")
    return body


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
        self, url: str, *, window: str = "1m", lookback: str = "15m", timeout: float = _TIMEOUT
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--prometheus needs an http(s) URL such as http://127.0.0.1:9090, got {url!r}")
        self.url = url.rstrip("/")
        self.window = window
        self.lookback = lookback
        self.timeout = timeout

    def _query(self, expr: str) -> list[dict[str, Any]]:
        body = json.loads(
            _get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", self.timeout)
        )
        if body.get("status") != "success":
            raise ValueError(f"query failed: {body.get('error', body)}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else []

    def _by(self, expr: str, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for item in self._query(expr):
            value = _finite(item["value"][1])
            name = item["metric"].get(key)
            if name is not None and value is not None:
                out[name] = value
        return out

    def frame(self) -> Frame:
        """Query runs, nodes and alerts; a failed query leaves its column empty and adds an error."""
        errors: list[str] = []

        def by(expr: str, key: str) -> dict[str, float]:
            try:
                return self._by(expr, key)
            except (OSError, ValueError, KeyError, IndexError) as exc:
                errors.append(f"{self.url}: {exc}")
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
        nodes = self._nodes(errors)
        alerts = self._alerts(errors)
        return Frame(time.time(), f"prometheus {self.url}", runs, nodes, alerts, tuple(errors))

    def _nodes(self, errors: list[str]) -> tuple[NodeRow, ...]:
        try:
            up = self._query(N.GPU_UP.name)
            xids = self._query(f"sum by (instance, gpu, xid) ({N.GPU_XID_ERRORS.name})")
            temps = self._by(f"max by (instance) ({N.GPU_TEMPERATURE.name})", "instance")
            util = self._by(f"avg by (instance) ({N.GPU_UTILIZATION.name})", "instance")
        except (OSError, ValueError, KeyError, IndexError) as exc:
            errors.append(f"{self.url}: {exc}")
            return ()
        gpus: dict[str, dict[str, bool]] = {}
        for item in up:
            labels = item["metric"]
            gpus.setdefault(labels.get("instance", "?"), {})[labels.get("gpu", "?")] = (
                _finite(item["value"][1]) == 1.0
            )
        counts: dict[str, dict[str, int]] = {}
        for item in xids:
            labels = item["metric"]
            value = _finite(item["value"][1]) or 0.0
            per = counts.setdefault(labels.get("instance", "?"), {})
            code = labels.get("xid", "?")
            per[code] = per.get(code, 0) + int(value)
        return tuple(
            NodeRow(
                instance=instance,
                gpus=len(gpus.get(instance, {})),
                lost=tuple(sorted((g for g, ok in gpus.get(instance, {}).items() if not ok), key=_gpu_key)),
                xids={k: v for k, v in sorted(counts.get(instance, {}).items()) if v > 0},
                max_temperature=temps.get(instance),
                mean_utilization=util.get(instance),
            )
            for instance in sorted(set(gpus) | set(counts))
        )

    def _alerts(self, errors: list[str]) -> tuple[AlertRow, ...] | None:
        try:
            body = json.loads(_get(f"{self.url}/api/v1/alerts", self.timeout))
            raw = body["data"]["alerts"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            errors.append(f"{self.url}/api/v1/alerts: {exc}")
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


def _gpu_key(label: str) -> tuple[int, str]:
    """Numeric labels (GPU index, Xid code) in numeric order, others after them."""
    return (int(label), "") if label.isdigit() else (1 << 30, label)


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
            lost=tuple(sorted((g for g, ok in gpus.items() if not ok), key=_gpu_key)),
            xids=dict(sorted(self.xids.get(instance, {}).items())),
            max_temperature=self.temps.get(instance),
            mean_utilization=sum(utils) / len(utils) if utils else None,
        )


class MetricsSource:
    """Frames from ``/metrics`` endpoints (node agents, which also serve their trainers, or trackers)."""

    def __init__(self, urls: Sequence[str], *, timeout: float = _TIMEOUT) -> None:
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
        self._previous: dict[tuple[str, str], tuple[float, float]] = {}

    def frame(self) -> Frame:
        """Fetch every endpoint once; an endpoint that fails adds an error line."""
        from prometheus_client.parser import text_string_to_metric_families

        now = time.time()
        errors: list[str] = []
        acc = _Scraped()
        for url in self.urls:
            instance = urllib.parse.urlsplit(url).netloc
            try:
                text = _get(url, self.timeout).decode("utf-8", "replace")
                families = list(text_string_to_metric_families(text))
            except (OSError, ValueError) as exc:
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


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


def render(frame: Frame) -> Any:
    """The frame as a rich renderable: a runs table, a nodes table, the firing alerts, errors."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    stamp = time.strftime("%H:%M:%S", time.localtime(frame.time))
    parts: list[Any] = [Text(f"babysitter top  {stamp}  {frame.source}", style="bold")]
    runs = Table(title="Runs", title_justify="left", expand=False)
    for col in ("run", "ranks", "step", "MFU", "goodput", "step time", "last step", "last ckpt", "restarts"):
        runs.add_column(col, justify="left" if col == "run" else "right")
    if frame.alerts is not None:
        runs.add_column("firing alerts")
    for row in frame.runs:
        stale = row.last_step_age is not None and row.last_step_age > max(30.0, 10 * (row.step_seconds or 0))
        cells: list[Any] = [
            row.run if row.reporting else Text(f"{row.run} (not reporting)", style="bold red"),
            str(row.ranks),
            "-" if row.step is None else str(row.step),
            _pct(row.mfu),
            _pct(row.goodput),
            _secs(row.step_seconds),
            Text(_secs(row.last_step_age), style="bold red" if stale else ""),
            _secs(row.checkpoint_age),
            "-" if row.restarts is None else str(row.restarts),
        ]
        if frame.alerts is not None:
            cells.append(Text(", ".join(a.name for a in frame.alerts_for_run(row.run)), style="red"))
        runs.add_row(*cells)
    if not frame.runs:
        runs.add_row("(no runs)", *[""] * (len(runs.columns) - 1))
    parts.append(runs)
    nodes = Table(title="Nodes", title_justify="left", expand=False)
    for col in ("node", "GPUs up", "lost", "Xid (code x count)", "max temp", "util"):
        nodes.add_column(col, justify="left" if col in ("node", "lost", "Xid (code x count)") else "right")
    if frame.alerts is not None:
        nodes.add_column("firing alerts")
    for node in frame.nodes:
        healthy = not node.lost
        cells = [
            node.instance,
            Text(f"{node.gpus_up}/{node.gpus}", style="green" if healthy else "bold red"),
            Text(",".join(node.lost) or "-", style="" if healthy else "bold red"),
            Text(
                " ".join(f"{code}x{node.xids[code]}" for code in sorted(node.xids, key=_gpu_key)) or "-",
                style="yellow" if node.xids else "",
            ),
            "-" if node.max_temperature is None else f"{node.max_temperature:.0f}C",
            _pct(node.mean_utilization),
        ]
        if frame.alerts is not None:
            cells.append(Text(", ".join(a.name for a in frame.alerts_for_node(node.instance)), style="red"))
        nodes.add_row(*cells)
    if not frame.nodes:
        nodes.add_row("(no nodes)", *[""] * (len(nodes.columns) - 1))
    parts.append(nodes)
    if frame.alerts is not None:
        alerts = Table(title="Alerts", title_justify="left", expand=False)
        for col in ("alert", "state", "severity", "about", "for"):
            alerts.add_column(col)
        for a in frame.alerts:
            since = "-" if a.since is None else _secs(max(0.0, frame.time - a.since))
            style = "bold red" if a.state == "firing" and a.severity == "critical" else None
            alerts.add_row(a.name, a.state, a.severity, a.subject(), since, style=style)
        if not frame.alerts:
            alerts.add_row("(none)", "", "", "", "")
        parts.append(alerts)
    for error in frame.errors[:5]:
        parts.append(Text(f"! {error}", style="yellow"))
    return Group(*parts)


def run_top(
    source: Source,
    *,
    console: Any = None,
    interval: float = 2.0,
    once: bool = False,
    stop: Callable[[], bool] | None = None,
) -> int:
    """Show frames until Ctrl-C (or ``stop()``); ``once`` prints one. 0, or 1 when nothing answered."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    if once:
        frame = source.frame()
        console.print(render(frame))
        return 1 if frame.errors and not frame.runs and not frame.nodes else 0
    try:
        with Live(render(source.frame()), console=console, refresh_per_second=4, screen=False) as live:
            while not (stop and stop()):
                time.sleep(interval)
                live.update(render(source.frame()))
    except KeyboardInterrupt:
        pass
    return 0
