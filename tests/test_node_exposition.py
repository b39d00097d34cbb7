"""The fast text-format reader gives what prometheus_client's parser gives: families, samples and errors."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from babysitter.node.workloads.exposition import parse_text


def _theirs(text: str) -> str:
    try:
        return repr(list(text_string_to_metric_families(text)))  # repr: NaN equals NaN
    except Exception as exc:  # the comparison includes which error
        return type(exc).__name__


def _ours(text: str) -> str:
    try:
        return repr(parse_text(text))
    except Exception as exc:
        return type(exc).__name__


def _exposition() -> str:
    registry = CollectorRegistry()
    labels = ["run", "rank"]
    Counter("steps", "Steps, with a \\ and a\nnewline.", labels, registry=registry).labels("r1", "0").inc(3)
    Gauge("mfu_ratio", 'Quote " inside.', labels, registry=registry).labels('r"1', "0").set(0.41)
    Histogram("step_seconds", "h", labels, buckets=(0.1, 1.0), registry=registry).labels("r1", "0").observe(
        0.5
    )
    Summary("save_seconds", "s", labels, registry=registry).labels("r\\1", "0").observe(2.0)
    Info("train", "i", registry=registry).info({"uuid": "GPU-1", "pci_bus_id": "0000:9b:00"})
    return generate_latest(registry).decode()


CASES = [
    _exposition(),
    "",
    "\n\n",
    "# just a comment\nfoo 1\n",
    'foo{a="b",} 1\n',  # a trailing comma
    'foo{a="b"} 1 1712345678000\n',  # a timestamp
    "foo NaN\nbar +Inf\nbaz -Inf\nqux 1e+21\n",
    "foo 1_000\n",  # not a number
    'foo{a="b",a="c"} 1\n',  # a duplicate label: an error
    'foo{a="b\\"c\\\\d\\ne"} 1\n',  # every escape
    'foo{a="b"}  1\n',  # two spaces
    "foo\t1\n",
    "# TYPE foo counter\nfoo 1\n",  # a counter without _total
    "# TYPE foo_total counter\nfoo_total 1\n",
    '# HELP foo with "quotes" in help\n# TYPE foo gauge\nfoo 1\n',
    "# HELP foo  two  spaces\nfoo 1\n",
    "# TYPE foo\nfoo 1\n",  # TYPE without a type: an error
    "# TYPE 1foo gauge\n",  # a bad name: an error
    '# HELP "foo.bar" quoted name\n{"foo.bar"} 1\n',
    '{__name__="foo"} 1\n',
    "foo{a=b} 1\n",  # an unquoted value: an error
    "foo{",
    "foo 1 2 3\n",
    '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\nother 4\n',
    'foo{a="b"} 1\r\nbar 2\r\n',
]


@pytest.mark.parametrize("text", CASES)
def test_same_families_or_same_error(text: str) -> None:
    assert _ours(text) == _theirs(text)
    assert _ours(text) == _theirs(text), "the second time too, its comment lines remembered"


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(_TEXT, min_size=1, max_size=4),
    number=st.one_of(st.floats(allow_nan=False), st.integers(min_value=-(10**20), max_value=10**20)),
)
def test_any_label_value_and_number_reads_alike(values: list[str], number: float) -> None:
    """Label values with any characters (escaped as the exporters escape them), any number."""
    registry = CollectorRegistry()
    gauge = Gauge("g", "help", [f"l{i}" for i in range(len(values))], registry=registry)
    gauge.labels(*values).set(number)
    text = generate_latest(registry).decode()
    assert _ours(text) == _theirs(text)


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet='# \t\n{}=",.\\_aAeE019+-HELPTYPEcounter', max_size=60))
def test_garbage_reads_alike(text: str) -> None:
    """Whatever a hostile endpoint sends: the same families, or the same kind of error."""
    assert _ours(text) == _theirs(text)
