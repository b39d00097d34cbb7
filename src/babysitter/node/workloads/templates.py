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

Memory is bounded: templates are counted in the bytes they really hold (the skeleton, the family
shapes, each series' head, labels and the row its first fill writes: :func:`template_size`, checked
against tracemalloc in ``tests/test_node_templates_bound.py``), at most ``max_bytes`` in all (4 MiB
in the agent), and are dropped with their registration. Past the bound the least recently used
templates of the registration furthest over its fair share go
(:class:`~babysitter.node.workloads.fair_cache.FairCache`: the bound split per user, then per
registration), so a user whose comment lines change at every scrape churns their own templates
only, never an honest rank's.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, cast

from prometheus_client.core import Metric

from babysitter.export.text import Lines, floatToGoString, series_head
from babysitter.node.workloads.fair_cache import MISSING, FairCache

__all__ = ["Templates", "template_size"]

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

    def __init__(self, max_bytes: int = 4 * 1024 * 1024, max_entries: int = 16384) -> None:
        self._cache: FairCache[tuple[bytes, ...], _Template | None] = FairCache(
            max_bytes=max_bytes, max_entries=max_entries
        )

    @property
    def size(self) -> int:
        """Bytes the templates hold (counted as :func:`template_size` counts them)."""
        return self._cache.size

    @property
    def cache(self) -> FairCache[tuple[bytes, ...], _Template | None]:
        """Where the templates are kept (its counts: entries, evictions)."""
        return self._cache

    def keep(self, owners: Mapping[Any, Hashable] | Iterable[Hashable]) -> None:
        """Drop the templates of every owner not in ``owners`` (registrations gone); a mapping gives
        each owner's user (its uid), whose fair share of the bound it shares with the user's others."""
        self._cache.keep(owners if isinstance(owners, Mapping) else {o: o for o in owners})

    def serve(self, owner: Hashable, text: bytes, full: Callable[[bytes], list[Metric]]) -> list[Metric]:
        """The families of one block of ``owner``'s text: from its template when there is one, else
        ``full(text)`` (whose errors propagate), remembered as a template when it can be."""
        key, values = _skeleton(text)
        template = self._cache.get(owner, key)
        if template is MISSING:
            families = full(text)
            made = _template(text, values, families)
            self._cache.put(owner, key, made, template_size(key, made))
            return families
        if template is not None and template[0] == len(values):  # type: ignore[index]
            served = _fill(template, values)  # type: ignore[arg-type]
            if served is not None:
                return served
        return full(text)


_getsizeof = sys.getsizeof
#: What a template's first fill adds per series: the value token (bytes), the row (a 5-tuple), its line
#: (the head, a space, the value, a newline: the head's length is added) and the value (a float);
#: values taken as 12 characters (``1.2345678e+06``: most are shorter).
_ROW = _getsizeof(b"") + 12 + _getsizeof((1, 2, 3, 4, 5)) + _getsizeof("") + 14 + _getsizeof(1.0)
#: A family's shape (a Metric) besides its strings: the object, its attributes, its samples list
#: (171 bytes in CPython 3.11, measured with tracemalloc).
_SHAPE = 176


def template_size(key: tuple[bytes, ...], template: _Template | None) -> int:
    """Bytes a template and its skeleton hold in CPython: every object they keep alive, each counted
    once (a string its series share, ``run``'s value, is one object), as if nothing were shared with
    anything outside (an over-count where it is: tracemalloc measures 0.9-1 of this)."""
    size = _getsizeof(key) + sum(_getsizeof(part) for part in key)
    if template is None:
        return size
    seen: set[int] = set()

    def once(obj: object) -> int:
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        return _getsizeof(obj)

    _, families = template
    size += _getsizeof(template) + _getsizeof(families)
    for shape, entries in families:
        size += _getsizeof((shape, entries)) + _SHAPE + _getsizeof(entries)
        size += once(shape.name) + once(shape.documentation) + once(shape.type) + once(shape.unit)
        for entry in entries:
            head, name, labels = cast(str, entry[0]), entry[1], cast(dict[str, str], entry[2])
            size += _getsizeof(entry) + _getsizeof(head) + once(name) + _getsizeof(labels)
            size += sum(once(k) + once(v) for k, v in labels.items())
            size += _ROW + len(head)
    return size


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
