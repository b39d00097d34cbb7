"""The agent's text renderer writes exactly what prometheus_client's ``generate_latest`` writes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
)

from babysitter.export.text import Lines, Rows, render_text, series_head
from babysitter.node.agent import merge_families


class _Registry:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _both(families: list[Metric]) -> tuple[bytes, bytes]:
    return render_text(families), generate_latest(_Registry(families))  # type: ignore[arg-type]


def _every_kind() -> list[Metric]:
    gauge = GaugeMetricFamily("g", 'help with \\ and\nnewline and "quotes"', labels=["gpu", "model"])
    gauge.add_metric(["0", 'NVIDIA "H100"\\x\n'], 1.98e9)
    gauge.add_metric(["1", "é"], -0.0)
    counter = CounterMetricFamily("c", "counter", labels=["a"])
    counter.add_metric(["x"], 3, created=1700000000.5)
    histogram = HistogramMetricFamily("h", "histogram", labels=["a"])
    histogram.add_metric(["x"], [("0.1", 1), ("+Inf", 3)], 4.5)
    summary = SummaryMetricFamily("s", "summary", labels=["a"])
    summary.add_metric(["x"], 3, 4.5)
    unknown = Metric("u", "unknown", "unknown")
    unknown.add_sample("u", {}, math.nan)
    stamped = GaugeMetricFamily("t", "timestamp")
    stamped.add_metric([], 1e21, timestamp=1712345678.123)
    return [
        gauge,
        counter,
        histogram,
        summary,
        unknown,
        stamped,
        InfoMetricFamily("i", "info", value={"version": "1"}),
        GaugeHistogramMetricFamily("gh", "gauge histogram", buckets=[("1", 2), ("+Inf", 3)], gsum_value=5),
        StateSetMetricFamily("st", "state set", value={"a": True, "b": False}),
        CounterMetricFamily("bad.name", "a name that needs escaping", value=1),
    ]


def test_every_kind_of_family_renders_alike() -> None:
    ours, theirs = _both(_every_kind())
    assert ours == theirs


def test_a_series_whose_value_changes_is_written_anew() -> None:
    """Lines are remembered per series: a new value (or 0.0 after -0.0, equal but written apart) is
    written again, an unchanged one reused."""
    for value in (1.0, 2.0, 2.0, -0.0, 0.0, 0, math.inf, 1e300, 1234567.0):
        gauge = GaugeMetricFamily("changing", "h", labels=["a"])
        gauge.add_metric(["x"], value)
        ours, theirs = _both([gauge])
        assert ours == theirs, value


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.text(max_size=10), min_size=1, max_size=4),
    number=st.one_of(st.floats(), st.integers(min_value=-(10**30), max_value=10**30)),
)
def test_any_labels_and_number_render_alike(values: list[str], number: float) -> None:
    gauge = GaugeMetricFamily("g", "h", labels=[f"l{i}" for i in range(len(values))])
    gauge.add_metric(values, number)
    ours, theirs = _both([gauge])
    assert ours == theirs


def test_duplicates_dropped_while_rendering_as_when_merging() -> None:
    """The agent merges without deduplicating and lets the renderer drop duplicate series: the same
    bytes as merging with deduplication, each dropped series told once."""
    from babysitter.node.agent import merge_families

    def rank(number: str, value: float) -> Metric:
        family = GaugeMetricFamily("train_mfu_ratio", "MFU", labels=["run", "rank"])
        family.add_metric(["r1", number], value)
        family.add_metric(["r1", number], value + 1)  # a hostile endpoint repeats its series
        return family

    families = [rank("0", 0.4), rank("1", 0.5), rank("1", 0.6), *_every_kind()]
    dropped: list[str] = []
    fast = render_text(merge_families(families, dedupe=False), on_duplicate=dropped.append)
    assert fast == render_text(merge_families(families))
    assert dropped == ["train_mfu_ratio"] * 4


def test_a_duplicate_in_another_label_order_is_dropped_and_lines_stay_sorted() -> None:
    """Lines are remembered by the labels in their given order; the series is still named by its
    sorted labels, so the same series sent with its labels the other way round is dropped, and either
    order renders as generate_latest renders it."""
    forward = GaugeMetricFamily("train_mfu_ratio", "MFU", labels=["run", "rank"])
    forward.add_metric(["r1", "0"], 0.4)
    backward = GaugeMetricFamily("train_mfu_ratio", "MFU", labels=["rank", "run"])
    backward.add_metric(["0", "r1"], 0.5)
    for families in ([forward], [backward], [backward], [forward]):
        ours, theirs = _both(families)
        assert ours == theirs
    dropped: list[str] = []
    both = Metric("train_mfu_ratio", "MFU", "gauge")
    both.samples = [*forward.samples, *backward.samples]
    text = render_text([both], on_duplicate=dropped.append).decode()
    assert text.count("train_mfu_ratio{") == 1 and 'rank="0",run="r1"} 0.4' in text
    assert dropped == ["train_mfu_ratio"]


_VALUE = st.one_of(st.floats(), st.integers(min_value=-(10**30), max_value=10**30))


@settings(max_examples=100, deadline=None)
@given(
    kind=st.sampled_from(["gauge", "counter"]),
    rows=st.lists(st.tuples(st.text(max_size=6), st.text(max_size=6), _VALUE), max_size=5),
)
def test_rows_render_and_read_as_the_families_they_stand_for(
    kind: str, rows: list[tuple[str, str, float]]
) -> None:
    """A collector's Rows family gives the bytes and the samples of the Gauge- or CounterMetricFamily
    with the same series, twice in a row (its lines remembered), and with the agent's merge."""
    fast = Rows("r", "help", kind, ["zone", "gpu"])  # not in sorted order: written sorted
    slow = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
        "r", "help", labels=["zone", "gpu"]
    )
    for zone, gpu, value in rows:
        fast.add_metric((zone, gpu), value)
        slow.add_metric([zone, gpu], value)
    assert fast.samples == slow.samples
    for _ in range(2):
        assert render_text([fast]) == generate_latest(_Registry([slow]))  # type: ignore[arg-type]
    dropped: list[str] = []
    merged = merge_families([fast], dedupe=False)
    assert merged == [fast], "a family no other shares is served as it is"
    assert render_text(merged, on_duplicate=dropped.append) == render_text(merge_families([slow]))
    assert len(dropped) == len(rows) - len({(z, g) for z, g, _ in rows})


def test_rows_merge_with_other_families_of_their_name_and_duplicates_drop_across_both() -> None:
    """Where another family has the name (the agent's build info next to a tracker's), the rows
    are merged as samples; a series in both is written once, from the first."""
    rows = Rows("train_mfu_ratio", "MFU", "gauge", ["rank", "run"])
    rows.add_metric(("0", "r1"), 0.4)
    rows.add_metric(("1", "r1"), 0.5)
    other = GaugeMetricFamily("train_mfu_ratio", "MFU", labels=["run", "rank"])
    other.add_metric(["r1", "1"], 0.9)  # the same series as the second row
    other.add_metric(["r1", "2"], 0.6)
    dropped: list[str] = []
    text = render_text(merge_families([rows, other], dedupe=False), on_duplicate=dropped.append).decode()
    assert text == render_text(merge_families([rows, other])).decode()
    assert 'rank="1",run="r1"} 0.5' in text and "0.9" not in text and 'rank="2"' in text
    assert dropped == ["train_mfu_ratio"]
    plain = render_text([rows, other], on_duplicate=dropped.append).decode()  # not merged: still once
    assert plain.count('rank="1",run="r1"}') == 1


def test_rows_refuse_other_kinds_and_sample_assignment() -> None:
    with pytest.raises(ValueError):
        Rows("h", "histogram", "histogram", [])
    rows = Rows("g", "gauge", "gauge", [])
    samples = GaugeMetricFamily("g", "gauge", value=1).samples
    with pytest.raises(TypeError):
        rows.samples = samples  # made from the rows only: an assignment would be lost
    assert rows.rows == [] and rows.samples == []


@pytest.mark.parametrize("lines_first", [True, False])
def test_lines_merge_with_other_families_of_their_name_either_way_round(lines_first: bool) -> None:
    """A ranks' Lines family next to a plain family of its name (from a rank the full way, or the
    agent's own) merges into one, in the order given; a series in both is written once, from the
    first; the samples read back as the lines say."""
    lines = Lines("train_mfu_ratio", "MFU", "gauge")
    for rank, value in (("0", 0.4), ("1", 0.5)):
        labels = {"run": "r1", "rank": rank}
        head = series_head("train_mfu_ratio", labels)
        lines.add_line(head, f"{head} {value}\n", "train_mfu_ratio", labels, value)
    other = GaugeMetricFamily("train_mfu_ratio", "MFU", labels=["run", "rank"])
    other.add_metric(["r1", "1"], 0.9)  # the same series as the second line
    other.add_metric(["r1", "2"], 0.6)
    families: list[Metric] = [lines, other] if lines_first else [other, lines]
    dropped: list[str] = []
    text = render_text(merge_families(families, dedupe=False), on_duplicate=dropped.append).decode()
    assert text == render_text(merge_families(families)).decode()
    assert text.count("# TYPE train_mfu_ratio gauge") == 1
    assert ('rank="1",run="r1"} 0.5' in text) == lines_first and ("0.9" in text) != lines_first
    assert dropped == ["train_mfu_ratio"]
    assert [(s.labels["rank"], s.value) for s in lines.samples] == [("0", 0.4), ("1", 0.5)]
    with pytest.raises(TypeError):
        lines.samples = other.samples  # made from the rows only


def test_rows_reused_whole_only_while_nothing_differs() -> None:
    """A Rows family whose rows are as last time is written from its last text; a changed value,
    a -0.0 where 0.0 was (equal, written apart), or a series already written by an earlier family
    makes it written row by row again."""

    def rows(*values: float) -> Rows:
        family = Rows("w", "help", "gauge", ["gpu"])
        for gpu, value in enumerate(values):
            family.add_metric((str(gpu),), value)
        return family

    def reference(*values: float) -> bytes:
        slow = GaugeMetricFamily("w", "help", labels=["gpu"])
        for gpu, value in enumerate(values):
            slow.add_metric([str(gpu)], value)
        return generate_latest(_Registry([slow]))  # type: ignore[arg-type]

    for values in [(0.0, 1.0), (0.0, 1.0), (0.0, 2.0), (-0.0, 2.0), (0.0, 2.0), (0.0, 2.0)]:
        assert render_text([rows(*values)]) == reference(*values), values
        dropped: list[str] = []
        assert render_text([rows(*values)], on_duplicate=dropped.append) == reference(*values)
        assert dropped == []
    earlier = GaugeMetricFamily("v", "other", labels=["gpu"])
    earlier.add_metric(["0"], 5.0)
    earlier.samples[0] = earlier.samples[0]._replace(name="w")  # a series of w, written first
    dropped = []
    text = render_text([earlier, rows(0.0, 2.0)], on_duplicate=dropped.append).decode()
    assert text.count('w{gpu="0"}') == 1 and 'w{gpu="0"} 5.0' in text and dropped == ["w"]
    assert render_text([rows(0.0, 2.0)], on_duplicate=dropped.append) == reference(0.0, 2.0)
