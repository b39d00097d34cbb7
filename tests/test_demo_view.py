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
