"""Small PromQL builders: selectors from catalog entries, ``by`` clauses, recording rule names.

Expressions stay plain strings (PromQL is the interface Grafana and Prometheus share); these helpers
only remove the error-prone parts: metric names (always from the catalog), matcher quoting, and the
``level:metric:operations`` naming of recording rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from babysitter.catalog import MetricSpec

__all__ = [
    "by",
    "eq",
    "growth",
    "join_matchers",
    "new_or_increased",
    "newest",
    "record_name",
    "regex",
    "select",
    "total_growth",
    "unit_test",
]

_RECORD = re.compile(r"^[a-z_]+:[a-z_][a-z0-9_]*:[a-z0-9_]+$")
_SUFFIXES = {"", "_bucket", "_sum", "_count"}


def _quote(value: str) -> str:
    return json.dumps(value)


def eq(label: str, value: str) -> str:
    """``label="value"`` with the value escaped."""
    return f"{label}={_quote(value)}"


def regex(label: str, values: Iterable[str], *, negate: bool = False) -> str:
    """``label=~"a|b"`` (or ``!~``) matching exactly the given literal values."""
    alternatives = "|".join(re.escape(value) for value in values)
    return f"{label}{'!~' if negate else '=~'}{_quote(alternatives)}"


def join_matchers(*parts: str) -> str:
    """Comma-joined non-empty matcher strings (each may itself hold several matchers)."""
    return ", ".join(part.strip() for part in parts if part and part.strip())


def select(spec: MetricSpec, *matchers: str, suffix: str = "") -> str:
    """A series selector for a catalog entry; ``suffix`` picks a histogram's ``_bucket/_sum/_count``
    or a summary's ``_sum/_count``."""
    if suffix not in _SUFFIXES:
        raise ValueError(f"unknown series suffix {suffix!r}")
    if suffix and spec.kind not in ("histogram", "summary"):
        raise ValueError(f"{spec.name} is a {spec.kind}, it has no {suffix} series")
    if suffix == "_bucket" and spec.kind != "histogram":
        raise ValueError(f"{spec.name} is a summary, it has no _bucket series")
    inner = join_matchers(*matchers)
    name = spec.name + suffix
    return f"{name}{{{inner}}}" if inner else name


def by(labels: Sequence[str]) -> str:
    """``by (a, b)`` for an aggregation."""
    return f"by ({', '.join(labels)})"


def newest(selector: str, key: Sequence[str]) -> str:
    """``selector``'s newest series per ``key``: one per key, where a join needs one.

    A recording rule that labels a run with one value of many (its likely team, its slowdown's cause)
    has one series per run while its Prometheus runs: when the value changes, the rule marks the old
    series stale. A Prometheus that restarts has forgotten the old series, so it never marks it, and
    for the lookback (5 m) the run has two: every ``group_left`` join on them then fails to evaluate
    (many-to-many), blinding its alert (the campaign's restarted Prometheus failed TrainingMfuDrop so
    for 5 m). The series written last is the one that holds."""
    return f"({selector} and topk {by(key)} (1, timestamp({selector})))"


def record_name(level: Sequence[str], metric: str, operation: str) -> str:
    """A recording rule name ``level:metric:operations`` (kubernetes-mixin convention).

    ``level`` lists the labels the result keeps besides the cluster label, which every rule keeps.
    """
    name = f"{'_'.join(level)}:{metric}:{operation}"
    if not _RECORD.fullmatch(name):
        raise ValueError(f"bad recording rule name {name!r}")
    return name


def new_or_increased(selector: str, window: str, memory: str = "6h") -> str:
    """Series whose counter grew within ``window``, including growth across a gap in the scrapes.

    What :func:`growth` counts (a new series entirely, growth across a gap longer than the window:
    an agent down, counting its kernel log at start; after a reset, all of it), plus a counter that
    was reset in the window and has grown back to at least its old value (all of it since the reset
    is new). The same value after a gap (a failed scrape, an agent restart) is nothing new.

    Engine-neutral on purpose: ``increase()`` is not used, because it extrapolates on Prometheus
    (a page said "1.017 Xids") and counts a new series' first value from zero on VictoriaMetrics
    where Prometheus ignores it; ``resets()`` never counts a series' first sample on either engine.
    """
    return f"({growth(selector, window, memory)} or ({selector} > 0 and resets({selector}[{window}]) > 0))"


def growth(selector: str, window: str, memory: str = "6h") -> str:
    """How much each counter grew in the last ``window``, exactly: the value now minus the last one
    seen before the window (within ``memory``); all of it for a series born in the window or reset.

    Unlike ``increase()`` it does not extrapolate to the window's edges, so summing its values at
    ``window`` intervals counts discrete events (Xid errors) once each, however sparse the samples,
    and it means the same on Prometheus and VictoriaMetrics (``last_over_time`` and ``offset`` do). A
    value that stale markers remove at the offset is still found: ``last_over_time`` looks back
    ``memory``, where ``offset`` alone would miss it and page again for Xids already paged.
    """
    before = f"last_over_time({selector}[{memory}] offset {window})"
    # The value before where it is at most the value now, else 0 (no value before; a reset): one
    # ``before``, where ``(now - before) > 0 or (now > 0 unless before) or ((now < before) > 0)`` read
    # it three times, and each read loads every sample of ``memory``, the rule's main cost
    # (benchmarks/results/fatal_groups.md).
    return f"(({selector} - (({before} <= {selector}) or {selector} * 0)) > 0)"


def total_growth(selector: str, key: Sequence[str], per: Sequence[str], window: str, memory: str) -> str:
    """How much a total carried across restarts grew in the last ``window``, exactly, 0 included.

    ``selector`` picks counters that continue across restarts (the ledger's: a new incarnation's
    series starts at the old one's total, under another ``instance``). ``per`` are the labels of one
    such total (the run's and, for badput, the cause), ``key`` those of the result. Each total is the
    largest of its incarnations' series (the newest, even while an old one has not gone stale yet),
    now and at the last value before the window (within ``memory``, so a window that starts while the
    run was down still finds one); the result sums the totals' differences by ``key``. A total born
    in the window counts from zero (a run's first hang, its startup badput); a run with no total
    before the window counts whole (it is younger than the window); one whose total fell (its ledger
    was lost) counts what it holds now.

    Why not ``sum(increase(...))``: over a run younger than the window Prometheus ignores a series'
    first value while VictoriaMetrics counts it from zero when it is small (a young run's startup
    badput was 0.1 s on one engine, 4 s on the other); across a restart each engine guessed at the new
    series' first value again. This reads ``max``, ``last_over_time`` and ``offset``, which mean the
    same on both.
    """

    def total(series: str) -> str:
        one = f"max {by(per)} ({series})"
        return one if tuple(per) == tuple(key) else f"sum {by(key)} ({one})"

    now, before = total(selector), total(f"last_over_time({selector}[{memory}] offset {window})")
    return f"(\n  ({now}\n  - {before}) >= 0\n  or ({now} unless {before})\n  or ({now} < {before})\n)"


def unit_test(series: Any, cases: Any, *, interval: str = "1m", eval_time: str = "10m") -> dict[str, Any]:
    """One promtool rule test: input ``(series, values)`` pairs and ``(expr, [(labels, value)])`` cases,
    every case evaluated at ``eval_time`` (the shape every generated rules test file shares)."""
    return {
        "interval": interval,
        "input_series": [{"series": name, "values": values} for name, values in series],
        "promql_expr_test": [
            {
                "expr": expr,
                "eval_time": eval_time,
                "exp_samples": [{"labels": labels, "value": value} for labels, value in samples],
            }
            for expr, samples in cases
        ],
    }
