"""The demo's terminal output: page and fault lines, status lines when piped, the live panel on a terminal."""

from __future__ import annotations

import io
import time

from rich.console import Console

from babysitter.demo.pager import Page
from babysitter.demo.scenario import DemoEvent
from babysitter.demo.view import DemoView
from babysitter.views.top import Frame, NodeRow, RunRow

FRAME = Frame(
    time=0.0,
    source="test",
    runs=(RunRow("demo", 1, 120, 0.05, 0.8, 0.1, 0.2, 3.0, 0),),
    nodes=(NodeRow("127.0.0.1:9946", 8, ("3",), {"79": 1}),),
    alerts=(),
)


def _page(status: str, receiver: str = "pager") -> Page:
    labels = {"alertname": "GpuDown", "severity": "critical", "gpu": "3", "instance": "127.0.0.1:9946"}
    return Page(time.time(), status, "GpuDown", "critical", labels, "GPU 3 does not answer.", receiver)


def test_piped_output_is_lines_with_a_status_now_and_then() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    view = DemoView(console, t0=time.time() - 42.0, duration=120, status_every=3600)
    assert not view.live_enabled
    view.start()
    view.event(DemoEvent(40, "xid79", gpu=3))
    view.page(_page("firing"))
    view.page(_page("resolved"))
    view.page(_page("firing", "chat"))
    view.page(_page("resolved", "chat"))
    view.page(_page("firing", "pager-training"))
    view.page(_page("resolved", "pager-training"))
    view.update(FRAME, None)
    view.update(FRAME, None)  # within status_every: no second status
    view.stop()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[+ 42.0s] FAULT Xid 79 on GPU 3: fallen off the bus")
    assert "PAGE critical GpuDown instance=127.0.0.1:9946 gpu=3: GPU 3 does not answer." in lines[1]
    assert lines[2].endswith("RESOLVED GpuDown instance=127.0.0.1:9946 gpu=3")
    # Each line says which receiver of the routing it went to: PAGE for the pager, else its name.
    assert "CHAT critical GpuDown instance=127.0.0.1:9946 gpu=3: GPU 3 does not answer." in lines[3]
    assert lines[4].endswith("RESOLVED GpuDown instance=127.0.0.1:9946 gpu=3 (to chat)")
    # A team's pager (routed by the alert's team label) pages too, and the line names whose.
    assert (
        "PAGE critical GpuDown instance=127.0.0.1:9946 gpu=3: GPU 3 does not answer. (to pager-training)"
        in (lines[5])
    )
    assert lines[6].endswith("RESOLVED GpuDown instance=127.0.0.1:9946 gpu=3 (to pager-training)")
    assert sum("run demo: step 120, MFU 5.0%, goodput 80.0%" in line for line in lines) == 1
    assert sum("7/8 GPUs up Xid 79 x1" in line for line in lines) == 1


def test_terminal_gets_a_live_panel() -> None:
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=True, color_system=None)
    view = DemoView(console, t0=time.time() - 10.0, duration=120)
    assert view.live_enabled
    view.start()
    try:
        view.update(FRAME, DemoEvent(25, "slow_checkpoint", args={"seconds": 6}))
        view.page(_page("firing"))
        text = Console(width=160, record=True, color_system=None)
        text.print(view._panel())
        rendered = text.export_text()
    finally:
        view.stop()
    assert "next fault in" in rendered and "slow checkpoint save (6 s)" in rendered
    assert "demo" in rendered and "7/8" in rendered
    assert "PAGE critical GpuDown" in out.getvalue()


def test_live_panel_fits_an_80x24_terminal() -> None:
    """The panel at 80x24 with a busy frame (a run not reporting, lost GPUs, more alerts than fit):
    every header and value on its own row, nothing cut or wrapped, and rows left for the event lines."""
    from babysitter.demo.panel import MAX_ALERTS, MAX_HEIGHT
    from babysitter.demo.scenario import default_scenario
    from babysitter.views.top import AlertRow

    now = time.time()
    alerts = (
        AlertRow("TrainingStalled", "firing", "critical", {"run": "demo"}, now - 20),
        AlertRow(
            "GpuXidCritical",
            "firing",
            "critical",
            {"instance": "127.0.0.1:33971", "gpu": "3", "xid": "79"},
            now - 30,
        ),
        AlertRow("GpuDown", "firing", "critical", {"instance": "127.0.0.1:33971", "gpu": "3"}, now - 25),
        AlertRow(
            "NodeTrainerRegistrationSkipped", "pending", "warning", {"instance": "127.0.0.1:33971"}, now - 2
        ),
        AlertRow("TrainingGoodputLow", "firing", "warning", {"run": "demo"}, now - 5),
        AlertRow("CheckpointOverdue", "pending", "warning", {"run": "demo"}, now - 5),
    )
    frame = Frame(
        time=now,
        source="prometheus http://127.0.0.1:45678",
        runs=(RunRow("demo", 1, 1234567, 0.0512, 0.5612, 0.1234, 22.0, 113.0, 12, reporting=False),),
        nodes=(NodeRow("127.0.0.1:33971", 8, ("3", "5"), {"79": 1, "48": 2}, 65.0, 0.4),),
        alerts=alerts,
    )
    for event in default_scenario().events:
        console = Console(width=80, height=24, record=True, color_system=None, file=io.StringIO())
        view = DemoView(console, t0=now - 10.0, duration=125, live=False, status_every=float("inf"))
        view.update(frame, event)
        console.print(view._panel())
        lines = console.export_text().splitlines()
        # title, next fault, runs (header + row), node (header + row), alerts (header + MAX_ALERTS),
        # "+N more", bottom border: one row each, so nothing wrapped.
        assert len(lines) == 1 + 1 + 2 + 2 + 1 + MAX_ALERTS + 1 + 1 <= MAX_HEIGHT, "\n".join(lines)
        text = "\n".join(lines)
        assert "…" not in text and "~" not in text, text
        assert f"s: {event.describe()}" in lines[1] and "next fault in" in lines[1]
    assert lines[2].split() == [
        "│",
        "run",
        "step",
        "MFU",
        "goodput",
        "step",
        "time",
        "last",
        "step",
        "last",
        "ckpt",
        "restarts",
        "│",
    ]
    assert lines[3].split()[1:-1] == [
        "demo",
        "?",
        "1234567",
        "5.1%",
        "56.1%",
        "123ms",
        "22.0s",
        "113.0s",
        "12",
    ]
    assert lines[5].split()[1:-1] == ["127.0.0.1:33971", "6/8", "3,5", "48x2", "79x1", "65C", "40.0%"]
    assert lines[7].split()[1:-1] == ["TrainingStalled", "firing", "critical", "run=demo", "20.0s"]
    assert lines[8].split()[1:-1] == ["GpuXidCritical", "firing", "critical", "gpu=3", "xid=79", "30.0s"]
    assert "+2 more alert(s)" in lines[11]
    assert "NodeTrainerRegistrationSkipped" not in text, "pending warnings sort last"
