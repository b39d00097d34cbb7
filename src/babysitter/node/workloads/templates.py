"""Serving a rank's families from templates of their text: parsed and checked once per shape, not per scrape.

A rank serves the same families, series and labels at every scrape; only the values change. So
each family's block of text is keyed by its skeleton (its lines, each sample's value cut off) and,
the first time a skeleton is seen, goes the full way (``full``: the trainers collector's parse and
checks, which may raise); what comes out is kept as a template: per sample line, the series' head
as the agent renders it (:func:`~babysitter.export.text.series_head`) and the sample it is. A block
with a known skeleton then only has its values read and its lines written, as
:class:`~babysitter.export.text.Lines` the renderer copies. The template vouches only for what the
full way saw: a value that is not a plain number token, or a block the template cannot stand for
(timestamps, whitespace around a line, a sample the checks dropped, a kind other than counter,
gauge, summary, histogram or untyped) goes the full way, every time. ``tests/test_node_templates.py``
checks both serve the same samples and bytes, for good text and bad.

Memory is bounded: templates hold at most ``max_bytes`` of skeletons in all (the host's trainers
serve at most 1 MiB per scrape), and are dropped with their registration; past the bound they are
all dropped and built again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Iterable

from prometheus_client.core import Metric

from babysitter.export.text import Lines, floatToGoString, series_head

__all__ = ["Templates"]

#: What the parser reads as a value without its slow path (exposition._SAMPLE's value group).
_TOKEN = re.compile(rb"[0-9a-zA-Z.+\-]+")
_KINDS = frozenset(("counter", "gauge", "summary", "histogram", "unknown"))

# A template: the number of sample lines, then per family (an empty family of its name, help, type
# and unit; its entries); an entry is [head, sample name, labels, last value token, last row] (the
# row reused while the token is).
_Entry = list[object]
_Family = tuple[Metric, list[_Entry]]
_Template = tuple[int, list[_Family]]


def _skeleton(text: bytes) -> tuple[tuple[bytes, ...], list[bytes]]:
    """The block's lines with each sample line cut at its last space; and the cut-off value tokens."""
    key: list[bytes] = []
    values: list[bytes] = []
    for line in text.split(b"\n"):
        if not line or line[0] == 35:  # a blank line or a comment ("#")
            key.append(line)
        else:
            head, _, value = line.rpartition(b" ")
            key.append(head)
            values.append(value)
    return tuple(key), values


class Templates:
    """Templates of the blocks each owner (a registration) serves. Not thread-safe: one collector's."""

    def __init__(self, max_bytes: int = 4 * 1024 * 1024) -> None:
        self._max_bytes = max_bytes
        self._owners: dict[Hashable, dict[tuple[bytes, ...], _Template | None]] = {}
        self._bytes = 0

    def keep(self, owners: Iterable[Hashable]) -> None:
        """Drop the templates of every owner not in ``owners`` (registrations gone)."""
        current = set(owners)
        for owner in [o for o in self._owners if o not in current]:
            del self._owners[owner]
        if not self._owners:
            self._bytes = 0

    def serve(self, owner: Hashable, text: bytes, full: Callable[[bytes], list[Metric]]) -> list[Metric]:
        """The families of one block of ``owner``'s text: from its template when there is one, else
        ``full(text)`` (whose errors propagate), remembered as a template when it can be."""
        key, values = _skeleton(text)
        known = self._owners.setdefault(owner, {})
        if key not in known:
            families = full(text)
            self._remember(known, key, _template(text, values, families))
            return families
        template = known[key]
        if template is not None and template[0] == len(values):
            served = _fill(template, values)
            if served is not None:
                return served
        return full(text)

    def _remember(
        self,
        known: dict[tuple[bytes, ...], _Template | None],
        key: tuple[bytes, ...],
        template: _Template | None,
    ) -> None:
        size = sum(len(part) + 1 for part in key)
        if self._bytes + size > self._max_bytes:
            for kept in self._owners.values():
                kept.clear()
            self._bytes = 0
        known[key] = template
        self._bytes += size


def _template(text: bytes, values: list[bytes], families: list[Metric]) -> _Template | None:
    """The template of a block the full way gave ``families`` for; None where it cannot stand for it."""
    if any(line != line.strip() for line in text.split(b"\n")):
        return None
    out: list[_Family] = []
    count = 0
    for family in families:
        if family.type not in _KINDS or type(family) is not Metric:
            return None
        entries: list[_Entry] = []
        for sample in family.samples:
            if sample.timestamp is not None or sample.exemplar is not None or count >= len(values):
                return None
            token = values[count]
            count += 1
            try:
                if not _TOKEN.fullmatch(token) or not _same(float(token), sample.value):
                    return None
            except ValueError:
                return None
            labels = dict(sample.labels)
            entries.append([series_head(sample.name, labels), sample.name, labels, None, None])
        shape = Metric(family.name, family.documentation, family.type)
        shape.unit = family.unit
        out.append((shape, entries))
    if count != len(values):
        return None  # the checks dropped a sample: the full way decides each time
    return count, out


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _fill(template: _Template, values: list[bytes]) -> list[Metric] | None:
    """The families of a block from its template and this scrape's value tokens; None when a token
    is not a plain number (the full way then decides what it is, or fails the endpoint)."""
    out: list[Metric] = []
    at = 0
    for shape, entries in template[1]:
        family = Lines.like(shape)
        rows = family.rows
        for entry in entries:
            token = values[at]
            at += 1
            if token != entry[3]:
                if not _TOKEN.fullmatch(token):
                    return None
                try:
                    value = float(token)
                except ValueError:
                    return None
                head = entry[0]
                entry[3] = token
                entry[4] = (head, f"{head} {floatToGoString(value)}\n", entry[1], entry[2], value)
            rows.append(entry[4])  # type: ignore[arg-type]
        out.append(family)
    return out
