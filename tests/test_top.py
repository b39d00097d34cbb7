"""``babysitter top`` from /metrics: a real node agent (simulated GPUs, one lost after Xid 79) serving a
real tracker; unreachable sources and bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

import babysitter
from babysitter.cli import main
from babysitter.views.top import Frame, MetricsSource, NodeRow, PrometheusSource, RunRow, render
from promkit import free_port


def _text(frame: Frame) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(render(frame))
    return console.export_text()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A node agent with 4 simulated GPUs; GPU 1 falls off the bus (Xid 79) a second after start (once
    the Xid collector listens)."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"events": [{"at": 1, "gpu": 1, "event": "xid79"}]}))
    port_file, reg = tmp_path / "addr", tmp_path / "reg"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "babysitter", "node-agent",
            "--simulate", "4", "--scenario", str(scenario),
            "--port", "0", "--port-file", str(port_file),
            "--registry-dir", str(reg), "--simulate-kernel-log", str(tmp_path / "kern.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None, "node agent exited"
            assert time.monotonic() < deadline, "node agent did not start"
            time.sleep(0.05)
        yield f"http://{port_file.read_text().strip()}/metrics", reg
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_metrics_source_shows_runs_and_nodes(agent: tuple[str, Path], tmp_path: Path) -> None:
    url, reg = agent
    tracker = babysitter.watch(
        run="top-run",
        tokens_per_step=1000,
        flops_per_token=1e6,
        peak_flops=1e10,
        port=0,
        registry_dir=reg,
        run_dir=tmp_path / "run",
        flush_interval=0.1,
        mfu_window=5.0,
    )
    try:
        for _ in range(5):
            time.sleep(0.02)
            tracker.step()
        with tracker.checkpoint_save(step=5, nbytes=10):
            pass
        source = MetricsSource([url.removesuffix("/metrics")])  # the path is added when missing
        assert source.urls == [url]
        deadline = time.monotonic() + 20
        while True:
            frame = source.frame()
            node = frame.nodes[0] if frame.nodes else None
            if frame.runs and node is not None and node.lost and node.xids:
                break
            assert time.monotonic() < deadline, f"agent never showed the run and the lost GPU: {frame}"
            time.sleep(0.3)
        assert frame.errors == ()
        assert frame.alerts is None, "plain /metrics knows no alerts"
        [run] = frame.runs
        assert (run.run, run.ranks, run.step) == ("top-run", 1, 5)
        assert run.mfu is not None and 0 < run.mfu < 1
        assert run.step_seconds is not None and 0.015 < run.step_seconds < 1.0
        assert run.checkpoint_age is not None and run.checkpoint_age < 30
        assert run.goodput is not None
        assert (node.gpus, node.gpus_up, node.lost, node.xids) == (4, 3, ("1",), {"79": 1})
        # The next frame's step time covers only the steps between the two frames.
        for _ in range(3):
            time.sleep(0.2)
            tracker.step()
        time.sleep(0.3)  # a housekeeping pass folds the new steps
        later = source.frame()
        assert later.runs[0].step == 8
        assert later.runs[0].step_seconds is not None and later.runs[0].step_seconds > 0.15
        text = _text(later)
        assert "top-run" in text
        assert "3/4" in text and "79x1" in text
        assert "firing alerts" not in text
    finally:
        tracker.close()


def test_render_marks_stalled_runs_and_lists_alerts() -> None:
    from babysitter.views.top import AlertRow

    now = time.time()
    frame = Frame(
        time=now,
        source="test",
        runs=(
            RunRow("r1", 8, 100, 0.41, 0.93, 0.5, 400.0, 60.0, 2),
            RunRow("r0", 0, last_step_age=120.0, reporting=False),
        ),
        nodes=(NodeRow("n1:9946", 8, ("3",), {"79": 1, "13": 2}, 71.0, 0.95),),
        alerts=(
            AlertRow("TrainingStalled", "firing", "critical", {"run": "r1"}, now - 30, "stalled"),
            AlertRow("GpuDown", "firing", "critical", {"instance": "n1:9946", "gpu": "3"}, now - 5),
            AlertRow("GpuXidError", "pending", "warning", {"instance": "n1:9946", "gpu": "3"}, None),
        ),
    )
    text = _text(frame)
    run_line = next(line for line in text.splitlines() if "r1" in line and "41.0%" in line)
    assert "93.0%" in run_line and "500ms" in run_line and "6.7m" not in run_line
    assert "TrainingStalled" in run_line, "a run's firing alerts sit on its row"
    node_line = next(line for line in text.splitlines() if line.strip().startswith("│ n1:9946"))
    assert "7/8" in node_line and "13x2 79x1" in node_line and "GpuDown" in node_line
    assert "GpuXidError" not in node_line, "pending alerts are listed, not put on rows"
    assert "pending" in text
    gone = next(line for line in text.splitlines() if "r0" in line)
    assert "r0 (not reporting)" in gone and " 2m " in gone


def test_unreachable_prometheus_is_an_error_line_not_a_crash(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    frame = PrometheusSource(f"http://127.0.0.1:{port}", timeout=1.0).frame()
    assert frame.runs == () and frame.nodes == () and frame.alerts is None
    assert frame.errors and all(f"127.0.0.1:{port}" in e for e in frame.errors)
    assert main(["top", "--prometheus", f"http://127.0.0.1:{port}", "--once", "--timeout", "1"]) == 1
    assert "Connection refused" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["top", "--prometheus", "file:///etc/passwd", "--once"],
        ["top", "--metrics", "127.0.0.1:9946", "--once"],
        ["top", "--prometheus", "http://127.0.0.1:9", "--interval", "0"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "babysitter top:" in capsys.readouterr().err


def test_at_80_columns_nothing_is_cut_and_duplicate_alerts_are_merged() -> None:
    """Issue 22: at 80 columns the headers read "good…" and "Train…", and GpuThrottled was listed
    twice, once per throttle reason, with the reason hidden. Now every header and value is whole
    (firing alerts move under their table), and one row per alert says which reasons fired."""
    from babysitter.views.top import AlertRow
    from babysitter.views.top.screen import merged_alerts

    now = time.time()
    node = "127.0.0.1:43557"
    throttled = [
        AlertRow("GpuThrottled", "firing", "warning", {"instance": node, "gpu": "6", "reason": r}, now - 60)
        for r in ("hw_slowdown", "hw_thermal_slowdown")
    ]
    frame = Frame(
        time=now,
        source="prometheus http://127.0.0.1:47415",
        runs=(RunRow("demo", 1, 4108, 0.052, 0.898, 0.145, 0.705, 10.3, 1),),
        nodes=(NodeRow(node, 8, (), {"79": 1}, 96.0, 0.946),),
        alerts=(*throttled, AlertRow("TrainingGoodputLow", "firing", "warning", {"run": "demo"}, now - 500)),
    )
    console = Console(record=True, width=80, color_system=None)
    console.print(render(frame, 80))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text, text
    for header in ("goodput", "restarts", "ranks", "node"):
        assert header in text
    assert "  demo firing: TrainingGoodputLow" in text
    assert f"  {node} firing: GpuThrottled x2" in text
    rows = [line for line in lines if line.startswith("│ GpuThrottled")]
    assert len(rows) == 1, text
    assert "reason=hw_slowdown," in text and "hw_thermal_slowdown" in text
    merged = merged_alerts(frame.alerts or ())
    assert [(a.name, extra) for a, extra in merged] == [
        ("GpuThrottled", "reason=hw_slowdown, hw_thermal_slowdown"),
        ("TrainingGoodputLow", ""),
    ]
    # Wide terminals keep the alerts on the rows.
    wide = Console(record=True, width=200, color_system=None)
    wide.print(render(frame, 200))
    assert "TrainingGoodputLow" in next(line for line in wide.export_text().splitlines() if "4108" in line)
