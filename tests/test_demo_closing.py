"""The demo's closing output (issue 32): its tables fit 80 columns without cutting a name or a word,
the live panel tells apart alerts that differ only in a label, the checkpoint advice says its
goodput is Daly's model's, and no page prints after the final report."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from babysitter.demo.closing import fault_table, unscripted_table
from babysitter.demo.pager import Page
from babysitter.demo.panel import panel
from babysitter.demo.runner import FaultResult
from babysitter.demo.scenario import default_scenario
from babysitter.demo.view import DemoView
from babysitter.views.top import AlertRow, Frame, NodeRow, RunRow

#: Where the shipped routing sends each alert of the default scenario (exporters/alertmanager.yml).
RECEIVERS = {
    "GpuThrottled": ("chat",),
    "CheckpointSaveSlow": ("chat",),
    "GpuXidCritical": ("chat", "pager", "remediate"),
    "TrainingProcessExited": ("chat", "pager-training"),
    "TrainingStalled": ("chat", "pager-training"),
}


def _render(renderable: object, width: int = 80) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue().splitlines()


class _Pager:
    def __init__(self, pages: list[Page]) -> None:
        self.pages = pages

    def snapshot(self) -> list[Page]:
        return list(self.pages)


def _closing_tables(width: int) -> list[str]:
    """What the demo's runner prints after the scenario: its fault table (every alert of the default
    scenario paged 12.3 s after its fault, to the receivers the shipped routing names;
    CheckpointSaveSlow not)."""
    from babysitter.demo.runner import _Demo

    scenario = default_scenario()
    t0 = 1000.0
    pages = [
        Page(
            t0 + e.at + 12.3,
            "firing",
            name,
            "critical",
            {"gpu": str(e.gpu)} if e.gpu is not None else {},
            "",
            to,
        )
        for e in scenario.events
        for name in e.expect
        if name != "CheckpointSaveSlow"
        for to in RECEIVERS[name]
    ]
    out = io.StringIO()
    demo = _Demo.__new__(_Demo)  # the table needs no stack: only these
    demo.console = Console(file=out, width=width, color_system=None)
    demo.scenario, demo.t0, demo.pager, demo.routing_path = scenario, t0, _Pager(pages), None
    demo.fault_table()
    return out.getvalue().splitlines()


def test_the_fault_table_fits_80_columns_with_every_name_and_word_whole() -> None:
    """At 80 columns the boxed table wrapped a lone ")" and split "TrainingProcessExi/ted"."""
    events = default_scenario().events
    lines = _closing_tables(80)
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    for event in events:
        for name in event.expect:
            assert re.search(rf"\b{name}\b", text), f"{name} cut:\n{text}"
        words = set(re.findall(r"\S+", text))
        for word in event.describe().split():
            assert word in words, f"{word!r} of {event.describe()!r} split:\n{text}"
    for name, receivers in RECEIVERS.items():
        row = next(line for line in lines if re.search(rf"\b{name}\b", line))
        if name != "CheckpointSaveSlow":
            assert row.split(name, 1)[1].split()[0].rstrip(",") == receivers[0], (
                f"receivers on its row: {row}"
            )
        assert all(re.search(rf"(?<![\w-]){x}(?![\w-])", text) for x in receivers), text
    assert not any(line.strip() in (")", "d", "│ │") for line in lines)
    assert "not sent" in text


def test_fault_table_direct() -> None:
    results = [
        FaultResult(e, dict.fromkeys(e.expect, 1.0), {n: RECEIVERS[n] for n in e.expect})
        for e in default_scenario().events
    ]
    lines = _render(fault_table(results, pager=False))
    assert all(len(line) <= 80 for line in lines) and "no pager" in "\n".join(lines)


def test_the_unscripted_table_fits_80_columns() -> None:
    others = {"TrainingThroughputDropped": ("warning", ("chat", "pager-training", "remediate"))}
    lines = _render(unscripted_table(others))
    assert all(len(line) <= 80 for line in lines) and "TrainingThroughputDropped" in "\n".join(lines)


def test_the_panel_shows_the_label_that_tells_two_alerts_apart() -> None:
    """Two GpuThrottled rows of GPU 6 read the same ("gpu=6" twice): the reason is shown."""
    now = time.time()
    labels = {"instance": "127.0.0.1:40123", "gpu": "6", "uuid": "GPU-6", "team": "infra"}
    alerts = (
        AlertRow("GpuThrottled", "firing", "warning", {**labels, "reason": "hw_slowdown"}, now - 12),
        AlertRow("GpuThrottled", "firing", "warning", {**labels, "reason": "hw_thermal_slowdown"}, now - 12),
        AlertRow("TrainingProcessExited", "firing", "critical", {"run": "demo"}, now - 3),
    )
    frame = Frame(now, "x", (RunRow("demo", 1, 120, 0.3, 0.6),), (NodeRow("127.0.0.1:40123", 8),), alerts)
    lines = _render(panel(frame, None, t0=now - 40, duration=125))
    assert all(len(line) <= 80 for line in lines), lines
    throttled = [line for line in lines if "GpuThrottled" in line]
    assert len(throttled) == 2 and throttled[0] != throttled[1], lines
    assert "gpu=6 hw_slowdown" in throttled[0] and "gpu=6 hw_thermal_slowdown" in throttled[1], lines
    assert any("TrainingProcessExited" in line and "run=demo" in line for line in lines)


def test_a_short_distinguishing_label_is_named() -> None:
    now = time.time()
    alerts = tuple(
        AlertRow("GpuEccErrors", "firing", "warning", {"gpu": "1", "type": kind}, now)
        for kind in ("sbe", "dbe")
    )
    lines = _render(panel(Frame(now, "x", (), (), alerts), None, t0=now, duration=10))
    assert any("gpu=1 type=sbe" in line for line in lines) and any("gpu=1 type=dbe" in line for line in lines)


def test_no_page_prints_once_held() -> None:
    """The demo holds pages before its closing tables: a RESOLVED that arrives as the stack stops no
    longer prints after the final report (nor do explanations finishing late); --keep lets them
    print again after its message."""
    out = io.StringIO()
    view = DemoView(Console(file=out, width=120, color_system=None), t0=time.time(), duration=60, live=False)
    page = Page(time.time(), "resolved", "GpuThrottled", "warning", {"gpu": "6"}, "", "chat")
    view.hold()
    view.page(page)
    view.say("explained late", live=True)
    assert out.getvalue() == ""
    view.say("said by the demo itself")
    assert "said by the demo itself" in out.getvalue()
    view.hold(False)
    view.page(page)
    assert "RESOLVED GpuThrottled gpu=6" in out.getvalue()
