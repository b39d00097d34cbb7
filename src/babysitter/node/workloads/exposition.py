"""A fast reader of the Prometheus text format that gives exactly what prometheus_client's parser gives.

The trainers collector reads every registered rank's exposition at every scrape; prometheus_client's
parser walks each line character by character in Python and was most of the agent's CPU per scrape
(8 trainers: about 6 ms of 8, benchmarks/results/node_agent.md). Here each line that has the plain
shape the exporters write (``name{a="b",...} value [timestamp]``, ``# HELP``/``# TYPE`` without
quotes) is read with one compiled regular expression; every other line goes to prometheus_client's
own functions, so quirks, escapes and errors stay exactly theirs. ``tests/test_node_exposition.py``
checks the two give the same families, samples and errors.

What a comment line reads as is remembered in the ``headers`` the caller passes (a rank sends the same
lines every scrape): the trainers collector passes each registration's own part of one cache bounded
in bytes and entries and shared fairly between users
(:class:`~babysitter.node.workloads.fair_cache.FairCache`), so one user's rotating comment lines
evict their own entries, never an honest rank's.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import parser as _parser
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from babysitter.node.workloads.fair_cache import MISSING

__all__ = ["Headers", "header_size", "parse_text"]

#: prometheus_client's own (untyped, private) line functions: the slow path, whose behaviour is the reference.
_pc: Any = _parser

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
_SAMPLE = re.compile(
    rf"({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? ([0-9a-zA-Z.+\-]+)(?: ([0-9.+\-eE]+))?"
)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')
_COMMENT = re.compile(rf"# (HELP|TYPE) ({_NAME})(?: ([^\"]*))?")
#: Comment lines longer than this are read every time, never remembered (a rank's text is untrusted).
_MAX_HEADER = 1024
_getsizeof = sys.getsizeof

#: What a comment line reads as: (HELP or TYPE, family, documentation or type), or None (skipped).
Header = tuple[str, str, str] | None


class Headers(Protocol):
    """Where comment lines read before are remembered: one registration's part of the trainers'
    :class:`~babysitter.node.workloads.fair_cache.FairCache` (a ``Partition``)."""

    def get(self, key: str) -> Header | object:
        """What ``key`` read as, or :data:`~babysitter.node.workloads.fair_cache.MISSING`."""

    def put(self, key: str, value: Header, size: int) -> None:
        """Remember what ``key`` read as, counted as ``size`` bytes."""


def header_size(line: str, header: Header) -> int:
    """Bytes a remembered comment line holds: the line and what it read as (its strings, the tuple)."""
    if header is None:
        return _getsizeof(line)
    return _getsizeof(line) + _getsizeof(header) + _getsizeof(header[1]) + _getsizeof(header[2])


_ALLOWED = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}


def _value(text: str) -> float:
    if "_" in text:
        raise ValueError(f"Invalid value: {text!r}")
    try:
        return int(text)
    except ValueError:
        return float(text)


def _slow(line: str) -> Sample:
    sample: Sample = _pc._parse_sample(line)
    return sample


def _sample(line: str) -> Sample:
    match = _SAMPLE.fullmatch(line)
    if match is None:
        return _slow(line)
    name, block, value, stamp = match.groups()
    labels: dict[str, str] = {}
    if block:
        for key, raw in _PAIR.findall(block):
            if key in labels or key == "__name__":
                return _slow(line)  # a duplicate or a name label: theirs decides
            labels[key] = _pc._replace_escaping(raw) if "\\" in raw else raw
    return Sample(name, labels, _value(value), _value(stamp) / 1000 if stamp is not None else None)


def _comment(line: str) -> list[str]:
    match = _COMMENT.fullmatch(line)
    if match is None or "  " in line:
        return list(_pc._split_quoted(line, None, 3))
    kind, name, rest = match.groups()
    return ["#", kind, name] if rest is None else ["#", kind, name, rest]


def _header(line: str, headers: Headers | None) -> Header:
    """``(HELP or TYPE, family, documentation or type)`` of a comment line, None for one the parser
    skips; raises where it raises. Remembered in ``headers``: a rank sends the same lines every scrape."""
    if headers is None:
        return _read_header(line)
    got = headers.get(line)
    if got is not MISSING:
        return got  # type: ignore[return-value]
    read = _read_header(line)
    if len(line) <= _MAX_HEADER:
        headers.put(line, read, header_size(line, read))
    return read


def _read_header(line: str) -> tuple[str, str, str] | None:
    parts = _comment(line)
    if len(parts) < 2:
        return None
    candidate, quoted = "", False
    if len(parts) > 2:
        if parts[1] != "TYPE" and parts[1] != "HELP":
            return None
        candidate, quoted = _pc._unquote_unescape(parts[2])
        if not quoted and not _pc._is_valid_legacy_metric_name(candidate):
            raise ValueError
    if parts[1] == "HELP":
        return "HELP", candidate, _pc._replace_help_escaping(parts[3]) if len(parts) == 4 else ""
    if parts[1] == "TYPE":
        if len(parts) < 4:
            raise ValueError
        return "TYPE", candidate, parts[3]
    return None


def _build(name: str, documentation: str, typ: str, samples: list[Sample]) -> Metric:
    if typ == "counter":
        if name.endswith("_total"):
            name = name[:-6]
        else:
            samples = [Sample(s[0] + "_total", *s[1:]) for s in samples]
    metric = Metric(name, documentation, typ)
    metric.samples = samples
    return metric


def parse_text(text: str, headers: Headers | None = None) -> list[Metric]:
    """Every family in ``text``: ``list(prometheus_client.parser.text_string_to_metric_families(text))``;
    comment lines remembered in ``headers`` when given."""
    return list(_families(text.split("\n"), headers))  # StringIO's lines: only "\n" ends one


def _families(lines: Iterable[str], headers: Headers | None) -> Iterator[Metric]:
    name = ""
    documentation = ""
    typ = "untyped"
    samples: list[Sample] = []
    allowed: Iterable[str] = ()
    for raw in lines:
        line = raw.strip()
        if line.startswith("#"):
            header = _header(line, headers)
            if header is None:
                continue
            kind, candidate, payload = header
            if kind == "HELP":
                if candidate != name:
                    if name != "":
                        yield _build(name, documentation, typ, samples)
                    name = candidate
                    typ = "untyped"
                    samples = []
                    allowed = (candidate,)
                documentation = payload
            else:
                if candidate != name:
                    if name != "":
                        yield _build(name, documentation, typ, samples)
                    name = candidate
                    documentation = ""
                    samples = []
                typ = payload
                allowed = tuple(name + suffix for suffix in _ALLOWED.get(typ, ("",)))
        elif line == "":
            pass
        else:
            sample = _sample(line)
            if sample.name not in allowed:
                if name != "":
                    yield _build(name, documentation, typ, samples)
                name = ""
                documentation = ""
                typ = "untyped"
                samples = []
                allowed = ()
                yield _build(sample[0], documentation, typ, [sample])
            else:
                samples.append(sample)
    if name != "":
        yield _build(name, documentation, typ, samples)
