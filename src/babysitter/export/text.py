"""The Prometheus text format (0.0.4), rendered as prometheus_client's ``generate_latest`` renders it, faster.

The node agent renders hundreds of series per scrape (its GPUs, the fabric, and every local rank's
series); ``generate_latest`` checks every label name against a regular expression and formats every
sample through ``str.format``, which was a third of the agent's CPU per scrape
(benchmarks/results/node_agent.md). Here label names are checked once and remembered, label values
are escaped only when they hold a character that needs it, and everything else is the same:
``tests/test_export_text.py`` checks the bytes equal ``generate_latest``'s for every kind of family.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from math import copysign

from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as _om
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString as _go_float

__all__ = ["CONTENT_TYPE", "Lines", "Rows", "render_text", "series_head"]

#: What a response in this format says it is (prometheus_client's ``CONTENT_TYPE_PLAIN_0_0_4``).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ESCAPING = _om.UNDERSCORES
_MAX_CACHED = 4096
_label_names: dict[str, str] = {}
_metric_names: dict[str, str] = {}
_MAX_LINES = 16384
_lines: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, float, object, str]] = {}
_row_lines: dict[tuple[str, tuple[str, ...], tuple[str, ...]], tuple[str, float, str]] = {}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"counter": "counter", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}


def _label_name(name: str) -> str:
    escaped = _label_names.get(name)
    if escaped is None:
        escaped = _om.escape_label_name(name, _ESCAPING)
        if len(_label_names) < _MAX_CACHED:
            _label_names[name] = escaped
    return escaped


def _metric_name(name: str) -> str:
    escaped = _metric_names.get(name)
    if escaped is None:
        escaped = _om.escape_metric_name(name, _ESCAPING)
        if len(_metric_names) < _MAX_CACHED:
            _metric_names[name] = escaped
    return escaped


def _value(text: str) -> str:
    if "\\" in text or "\n" in text or '"' in text:
        return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return text


def _head(name: str, items: tuple[tuple[str, str], ...]) -> str:
    if items:
        inner = ",".join(f'{_label_name(k)}="{_value(v)}"' for k, v in items)
        return f"{_metric_name(name)}{{{inner}}}"
    return _metric_name(name)


def series_head(name: str, labels: dict[str, str]) -> str:
    """A series' line up to its value, as :func:`render_text` writes it (labels sorted by name)."""
    return _head(name, tuple(sorted(labels.items())))


def _line(
    name: str, labels: dict[str, str], value: float, timestamp: object, seen: set[str] | None = None
) -> str:
    """One sample line, remembered by series: a series keeps its labels, and often its value. With
    ``seen``, a series already written in this rendering gives "" (the caller counts it)."""
    # Remembered by the labels in their given order (no sort: a source gives them alike each time);
    # the head, written with them sorted, is what names the series, whatever the order.
    key = (name, tuple(labels.items()))
    cached = _lines.get(key)
    if cached is not None:
        head, last, stamp, line = cached
        if seen is not None:
            if head in seen:
                return ""
            seen.add(head)
        # 0 and -0.0 are equal but written apart; everything else equal is written alike.
        if last == value and stamp == timestamp and (value or copysign(1.0, value) == copysign(1.0, last)):
            return line
    else:
        head = _head(name, tuple(sorted(labels.items())))
        if seen is not None:
            if head in seen:
                return ""
            seen.add(head)
        if len(_lines) >= _MAX_LINES:
            _lines.clear()  # series come and go (ranks, runs): start over rather than grow
    if timestamp is not None:
        line = f"{head} {floatToGoString(value)} {int(float(timestamp) * 1000):d}\n"  # type: ignore[arg-type]
    else:
        line = f"{head} {floatToGoString(value)}\n"
    _lines[key] = (head, value, timestamp, line)
    return line


class Rows(Metric):
    """A gauge or counter family held as rows of label values, as the node agent's collectors make
    them: :func:`render_text` writes the rows without making a sample (a dict and a tuple) per
    series, which was a third of the cost of each of the agent's series. Everything else reads
    ``samples``, made from the rows when asked for: the same samples ``GaugeMetricFamily`` or
    ``CounterMetricFamily`` would hold (a read-only view; add rows with :meth:`add_metric`)."""

    def __init__(self, name: str, documentation: str, typ: str, labels: Iterable[str]) -> None:
        if typ not in ("gauge", "counter"):
            raise ValueError(f"Rows holds gauges and counters, not {typ}")
        super().__init__(name, documentation, typ)
        self.labelnames = tuple(labels)
        self.sample_name = f"{name}_total" if typ == "counter" else name
        self.rows: list[tuple[tuple[str, ...], float]] = []
        #: Whether a value is -0.0, which equals 0.0 but is written apart (no whole-family reuse then).
        self.negative_zero = False

    def add_metric(self, labels: Iterable[str], value: float) -> None:
        """One series: its label values, in :attr:`labelnames`' order, and its value."""
        if not value and copysign(1.0, value) < 0:
            self.negative_zero = True
        self.rows.append((tuple(labels), value))

    @property
    def samples(self) -> list[Sample]:
        names, name = self.labelnames, self.sample_name
        return [
            Sample(name, dict(zip(names, labels, strict=True)), value, None, None)
            for labels, value in self.rows
        ]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:  # Metric.__init__ sets [] and nothing else sets them
            raise TypeError("Rows' samples are made from its rows: use add_metric")


class Lines(Metric):
    """A family of sample lines already written, each with its head (the series: :func:`series_head`)
    and the sample it is: the node agent serves the ranks' series this way, from templates of their
    text (:mod:`babysitter.node.workloads.trainers`), so that :func:`render_text` copies lines and
    deduplicates by head without making and formatting a sample per series. Everything else reads
    ``samples``, made from the rows when asked for (a read-only view; add rows with :meth:`add_line`)."""

    def __init__(self, name: str, documentation: str, typ: str) -> None:
        super().__init__(name, documentation, typ)
        self.rows: list[tuple[str, str, str, dict[str, str], float]] = []

    @classmethod
    def like(cls, family: Metric) -> Lines:
        """An empty Lines family with ``family``'s name, help, type and unit, which were checked when
        it was made (the agent makes one per rank's family per scrape: no second check)."""
        lines = cls.__new__(cls)
        lines.name, lines.documentation, lines.type, lines.unit = (
            family.name,
            family.documentation,
            family.type,
            family.unit,
        )
        lines.samples = []
        lines.rows = []
        return lines

    def add_line(self, head: str, line: str, sample: str, labels: dict[str, str], value: float) -> None:
        """One series: its head, its whole line (``head value\\n``), and the sample name, labels and
        value the line says (the caller vouches that they agree)."""
        self.rows.append((head, line, sample, labels, value))

    @property
    def samples(self) -> list[Sample]:
        return [Sample(name, dict(labels), value, None, None) for _, _, name, labels, value in self.rows]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:  # Metric.__init__ sets [] and nothing else sets them
            raise TypeError("Lines' samples are made from its rows: use add_line")


def _row_line(
    name: str, names: tuple[str, ...], labels: tuple[str, ...], value: float, seen: set[str] | None
) -> tuple[str, str]:
    """:func:`_line` for a row, with its head: remembered by its label values, the head written from
    them sorted; the line is "" for a series already written (with ``seen``)."""
    key = (name, names, labels)
    cached = _row_lines.get(key)
    if cached is not None:
        head, last, line = cached
        if seen is not None:
            if head in seen:
                return head, ""
            seen.add(head)
        if last == value and (value or copysign(1.0, value) == copysign(1.0, last)):
            return head, line
    else:
        head = _head(name, tuple(sorted(zip(names, labels, strict=True))))
        if seen is not None:
            if head in seen:
                return head, ""
            seen.add(head)
        if len(_row_lines) >= _MAX_LINES:
            _row_lines.clear()
    line = f"{head} {floatToGoString(value)}\n"
    _row_lines[key] = (head, value, line)
    return head, line


#: Each Rows family's last rows, text and heads, by sample name and label names: most of a host's
#: series (link widths, states, error counts) are the same from one scrape to the next.
_row_families: dict[
    tuple[str, tuple[str, ...]], tuple[list[tuple[tuple[str, ...], float]], str, list[str]]
] = {}


def _render_rows(
    metric: Rows, out: list[str], seen: set[str] | None, on_duplicate: Callable[[str], None] | None
) -> None:
    sample, names, rows = metric.sample_name, metric.labelnames, metric.rows
    key = (sample, names)
    cached = _row_families.get(key)
    if cached is not None and cached[0] == rows and not metric.negative_zero:
        if seen is None:
            out.append(cached[1])
            return
        if seen.isdisjoint(cached[2]):
            out.append(cached[1])
            seen.update(cached[2])
            return
    lines: list[str] = []
    heads: list[str] = []
    whole = True
    for labels, value in rows:
        head, line = _row_line(sample, names, labels, value, seen)
        if line:
            lines.append(line)
            heads.append(head)
        else:
            whole = False
            on_duplicate(sample)  # type: ignore[misc]
    text = "".join(lines)
    out.append(text)
    if whole and not metric.negative_zero and len(set(heads)) == len(heads):  # reusable as a whole
        if len(_row_families) >= _MAX_CACHED:
            _row_families.clear()
        _row_families[key] = (list(rows), text, heads)


def floatToGoString(value: float) -> str:
    """A number as Go writes it (prometheus_client's ``floatToGoString``)."""
    return str(_go_float(value))  # type: ignore[no-untyped-call]


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


_headers: dict[tuple[str, str, str], tuple[str, str]] = {}
#: What the remembered headers may hold, in bytes of their text: a rank's help lines change when it
#: likes (60 endpoints rotating theirs filled 4,096 entries of 1 KiB each, about 12 MiB); past it
#: they are forgotten and written again as they come (a few microseconds each).
_MAX_HEADER_BYTES = 2 * 1024 * 1024
_header_bytes = 0


def _family_header(name: str, kind: str, documentation: str) -> tuple[str, str]:
    """A family's ``# HELP`` and ``# TYPE`` lines, and its help as written; remembered (a family
    keeps them), unless its help is long (a rank's text is untrusted)."""
    key = (name, kind, documentation)
    header = _headers.get(key)
    if header is None:
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name += "_info"
        elif kind == "unknown":
            kind = "untyped"
        kind = _TYPES.get(kind, kind)
        shown = _metric_name(name)
        doc = _help(documentation)
        header = (f"# HELP {shown} {doc}\n# TYPE {shown} {kind}\n", doc)
        if len(documentation) <= 1024:
            global _header_bytes
            size = 2 * len(header[0]) + len(documentation) + 300  # the strings, the key and the entry
            if len(_headers) >= _MAX_CACHED or _header_bytes + size > _MAX_HEADER_BYTES:
                _headers.clear()
                _header_bytes = 0
            _headers[key] = header
            _header_bytes += size
    return header


def render_text(families: Iterable[Metric], *, on_duplicate: Callable[[str], None] | None = None) -> bytes:
    """``families`` in the text format, byte for byte what ``generate_latest`` gives for them.

    With ``on_duplicate``, a series (name and labels) written once is not written again: it is told
    the sample name instead (the node agent merges the ranks' families and must never serve one series
    twice, which would fail the whole scrape)."""
    seen: set[str] | None = set() if on_duplicate is not None else None
    out: list[str] = []
    for metric in families:
        header = _family_header(metric.name, metric.type, metric.documentation)
        out.append(header[0])
        if type(metric) is Rows:
            _render_rows(metric, out, seen, on_duplicate)
            continue
        if type(metric) is Lines:
            for head, line, sample, _, _ in metric.rows:
                if seen is not None:
                    if head in seen:
                        on_duplicate(sample)  # type: ignore[misc]
                        continue
                    seen.add(head)
                out.append(line)
            continue
        extra: dict[str, list[str]] = {}
        base = metric.name
        for s in metric.samples:
            line = _line(s.name, s.labels, s.value, s.timestamp, seen)
            if not line:
                on_duplicate(s.name)  # type: ignore[misc]
                continue
            if s.name.startswith(base) and s.name[len(base) :] in _OM_SUFFIXES:
                extra.setdefault(s.name[len(base) :], []).append(line)
            else:
                out.append(line)
        for suffix, lines in sorted(extra.items()):
            shown = _metric_name(base + suffix)
            out.append(f"# HELP {shown} {header[1]}\n# TYPE {shown} gauge\n")
            out.extend(lines)
    return "".join(out).encode("utf-8")
