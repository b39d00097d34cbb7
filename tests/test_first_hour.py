"""Issue 22's "small things that cost trust", each as a new user met it (fast, in-process)."""

from __future__ import annotations

import io
import json
import logging
import socket
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

import babysitter
from babysitter.cli import main
from test_ledger_helpers import Book


def test_report_on_a_missing_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "no ledger records in .../babysitter-ledger.jsonl" for a typo in the path."""
    assert main(["report", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert f"no such directory: {tmp_path / 'nope'}" in err
    assert "no ledger records" not in err


def test_report_on_the_demos_workdir_points_to_its_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo prints its work directory first; its ledger is in run/ under it."""
    (tmp_path / "run").mkdir()
    Book().start(0).steps(1, [1.0, 2.0, 3.0]).end(3.5).write(tmp_path / "run" / "babysitter-ledger.jsonl")
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"the ledger is in {tmp_path / 'run'}: babysitter report {tmp_path / 'run'}" in err
    assert main(["report", str(tmp_path / "run")]) == 0


def test_report_png_says_what_it_wrote_and_its_legend_has_every_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --png printed nothing, and its legend left out data_stall (booked in slivers no bar
    showed: the second-largest badput of the run the issue looked at)."""
    from babysitter.ledger import summarize
    from babysitter.views.report import legend

    run = tmp_path / "run"
    run.mkdir()
    book = Book().start(0, pst=-2.0).steps(1, [1.0 + k for k in range(20)], data_wait=4.0)
    book.save(21.0, 23.0, 20).hang(40.0, 20, 15.0).steps(21, [41.0, 42.0]).end(42.5)
    book.write(run / "babysitter-ledger.jsonl")
    summary = summarize(run)
    causes = [c for c, _ in legend(summary)]
    assert "data_stall" in causes and "hang" in causes and "checkpoint_save" in causes
    assert all(summary.totals.badput_seconds[c] > 0 for c in causes)
    png = tmp_path / "t.png"
    assert main(["report", str(run), "--png", str(png)]) == 0
    assert f"wrote {png}" in capsys.readouterr().out and png.stat().st_size > 10_000
    assert main(["report", str(run), "--json", "--png", str(png)]) == 0
    out = capsys.readouterr()
    json.loads(out.out)  # stdout stays JSON
    assert f"wrote {png}" in out.err


def test_the_step_time_panel_is_not_flattened_by_a_hang() -> None:
    """A 28 s stuck step among 0.1 s steps: the axis stops above the steps, the panel says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from babysitter.views.report import _clip_outliers

    fig, ax = plt.subplots()
    try:
        values = [0.1] * 200 + [0.14] * 100 + [28.0]
        ax.plot(range(len(values)), values)
        _clip_outliers(ax, values)
        assert ax.get_ylim()[1] < 1.0
        assert any("up to 28 s" in t.get_text() for t in ax.texts)
    finally:
        plt.close(fig)


def test_a_taken_port_is_logged_as_what_it_is(caplog: pytest.LogCaptureFixture) -> None:
    """Before: "internal error: port_in_use: ..." for a port another process holds."""
    caplog.set_level(logging.WARNING, logger="babysitter")
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        tracker = babysitter.watch(port=port, peak_flops=1e12, flops_per_token=6.0, tokens_per_step=10)
        try:
            assert tracker.metrics_url is not None and f":{port}/" not in tracker.metrics_url
        finally:
            tracker.close()
    finally:
        held.close()
    said = [r.getMessage() for r in caplog.records if "port" in r.getMessage()]
    assert any(f"metrics port {port} is taken" in m and "serving on http://127.0.0.1:" in m for m in said), (
        said
    )
    assert not any("internal error" in m for m in said), said
    assert tracker.errors.counts().get("port_in_use") == 1  # still counted


def test_mfu_above_one_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A peak set 1000x too low gives an MFU of hundreds: one warning naming what to check."""
    caplog.set_level(logging.WARNING, logger="babysitter")
    tracker = babysitter.watch(port=-1, peak_flops=1e6, flops_per_token=6e3, tokens_per_step=1000)
    try:
        for _ in range(3):
            for _ in range(5):
                time.sleep(0.002)
                tracker.step()
            tracker.housekeep()
        assert tracker.snapshot().mfu is not None and tracker.snapshot().mfu > 1  # type: ignore[operator]
    finally:
        tracker.close()
    said = [r.getMessage() for r in caplog.records if "above 1" in r.getMessage()]
    assert len(said) == 1, said
    assert "peak_flops=" in said[0] and "flops_per_token=" in said[0]


def test_the_demos_stack_file_names_the_live_trainer(tmp_path: Path) -> None:
    """Before: stack.json kept the pid of the trainer the scenario killed."""
    from babysitter.demo.runner import DemoOptions, _Demo
    from babysitter.demo.scenario import default_scenario

    demo = _Demo(DemoOptions(default_scenario(), workdir=tmp_path), Console(file=io.StringIO(), width=80))
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    demo.start_trainer = lambda: demo.stack.start("trainer", sleeper)  # type: ignore[method-assign]
    try:
        demo.agent_address = "127.0.0.1:1"
        demo.start_trainer()
        demo.write_stack_file()
        first = json.loads((tmp_path / "stack.json").read_text())["pids"]["trainer"]
        demo.stack.procs["trainer"].kill()
        demo.stack.procs["trainer"].wait(10)
        demo.restart_trainer()
        now = json.loads((tmp_path / "stack.json").read_text())["pids"]["trainer"]
        assert now != first and now == demo.stack.procs["trainer"].pid
    finally:
        demo.stack.close()


def test_demo_lines_fit_80_columns() -> None:
    """Pages and remediations printed on an 80-column terminal wrap under the clock, never past the
    edge (piped, to a log, lines stay whole: the e2e test and grep read them)."""
    from babysitter.demo.pager import Page
    from babysitter.demo.view import INDENT, DemoView

    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    view = DemoView(console, t0=time.time() - 42.9, duration=125, live=False, wrap=True)
    view.page(
        Page(
            time.time(),
            "firing",
            "GpuXidCritical",
            "critical",
            {"instance": "127.0.0.1:40951", "gpu": "3", "xid": "79"},
            "Xid 79 on GPU 3 of 127.0.0.1:40951: reboot.",
            "pager",
        )
    )
    view.remediation("REMEDIATE (dry run) drain host 127.0.0.1", '{"event":"action","result":"dry_run",' * 6)
    lines = out.getvalue().splitlines()
    assert len(lines) > 3 and max(len(line) for line in lines) <= 80, lines
    assert lines[0].startswith("[+ 42.9s] PAGE critical GpuXidCritical")
    assert all(line.startswith(" " * INDENT) for line in lines[1:] if not line.startswith("[+"))
    # The same words, none lost to the wrapping.
    assert "reboot." in " ".join(lines)
    piped = io.StringIO()
    DemoView(Console(file=piped, width=80, color_system=None), t0=time.time(), duration=125, live=False).say(
        "x " * 60
    )
    assert len(piped.getvalue().splitlines()) == 1


def test_the_demo_prints_the_explain_command_it_answered() -> None:
    """The command the demo prints parses, and asks for the window the demo explained."""
    from babysitter.cli import build_parser
    from babysitter.demo.explainer import explain_command

    end = 1_796_140_044.0
    line = explain_command("http://127.0.0.1:47415", "demo", end, 14.0, 30.0)
    args = build_parser().parse_args(line.split()[1:])
    assert (args.at, args.window, args.baseline, args.run) == (end, 14.0, 30.0, "demo")
    assert args.rate_window is None  # read from the loaded rules, not guessed


def test_a_restarted_demo_training_runs_on_its_gpu_as_it_is() -> None:
    """The training restarted after its GPU began throttling steps at the throttled clock (before:
    the restarted process dropped past events and ran at full speed on a GPU still throttled)."""
    from babysitter.demo.scenario import default_scenario
    from babysitter.demo.trainer import gpu_clock_at
    from babysitter.node.gpu.simulate import THROTTLED_CLOCK

    s = default_scenario()
    throttle = next(e for e in s.events if e.event == "throttle")
    kill = next(e for e in s.events if e.event == "kill")
    events = s.trainer_events(throttle.gpu)
    assert gpu_clock_at(events, throttle.at - 1) == 1.0
    assert gpu_clock_at(events, kill.at + 4) == THROTTLED_CLOCK
    cleared = [*events, {"at": kill.at, "event": "gpu_clock", "factor": 1.0}]
    assert gpu_clock_at(sorted(cleared, key=lambda e: float(e["at"])), kill.at + 4) == 1.0
