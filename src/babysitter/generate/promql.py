"""Small PromQL builders: selectors from catalog entries, ``by`` clauses, recording rule names.

Expressions stay plain strings (PromQL is the interface Grafana and Prometheus share); these helpers
only remove the error-prone parts: metric names (always from the catalog), matcher quoting, and the
``level:metric:operations`` naming of recording rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from babysitter.catalog import MetricSpec

__all__ = [
    "by",
    "eq",
    "growth",
    "join_matchers",
    "new_or_increased",
    "record_name",
    "regex",
    "select",
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


def record_name(level: Sequence[str], metric: str, operation: str) -> str:
    """A recording rule name ``level:metric:operations`` (kubernetes-mixin convention).

    ``level`` lists the labels the result keeps besides the cluster label, which every rule keeps.
    """
    name = f"{'_'.join(level)}:{metric}:{operation}"
    if not _RECORD.match(name):
        raise ValueError(f"bad recording rule name {name!r}")
    return name


def new_or_increased(selector: str, window: str, memory: str = "6h") -> str:
    """Series whose counter grew within ``window``, including growth across a gap in the scrapes.

    ``increase()`` needs two samples, so a counter created at 1 (the first Xid of a GPU) would never
    show an increase. The other branches compare the value now with the last one seen before the
    window, looking back ``memory``: no value then means a new series (all of it is new); a higher
    one, growth across a gap longer than the window (an agent down, counting its kernel log at
    start); a lower one, a reset (a node reboot: all of it is new). The same value after a gap (a
    failed scrape, an agent restart) is nothing new. ``offset`` alone would miss the earlier value
    whenever a stale marker lands at the offset, and page again for Xids already paged.
    """
    before = f"last_over_time({selector}[{memory}] offset {window})"
    return (
        f"(increase({selector}[{window}]) > 0"
        f" or ({selector} > 0 unless {before})"
        f" or ({selector} - {before} > 0)"
        f" or (({selector} < {before}) > 0))"
    )


def growth(selector: str, window: str, memory: str = "6h") -> str:
    """How much each counter grew in the last ``window``, exactly: the value now minus the last one
    seen before the window (within ``memory``); all of it for a series born in the window or reset.

    Unlike ``increase()`` it does not extrapolate to the window's edges, so summing its values at
    ``window`` intervals counts discrete events (Xid errors) once each, however sparse the samples.
    """
    before = f"last_over_time({selector}[{memory}] offset {window})"
    return (
        f"(({selector} - {before}) > 0 or ({selector} > 0 unless {before}) or (({selector} < {before}) > 0))"
    )
