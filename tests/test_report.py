"""``babysitter report`` on a real run directory (the real tracker wrote it) and on edge cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysitter.cli import main
from babysitter.ledger import summarize
from node_helpers import wait_for

CHILD = Path(__file__).with_name("test_ledger_child.py")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with two incarnations: one killed mid-run, one that finished."""
    base = tmp_path_factory.mktemp("report")
    run = base / "run"
    env = {**os.environ, "BABYSITTER_LEDGER_FLUSH_SECONDS": "0.02"}
    argv = [
        sys.executable,
        str(CHILD),
        "--run-dir",
        str(run),
        "--step-seconds",
        "0.02",
        "--save-seconds",
        "0.05",
    ]
    truth = base / "t0"
    first = subprocess.Popen([*argv, "--truth", str(truth)], env=env)
    try:
        # Killed once it has stepped and saved (importing torch alone took 10 s on a loaded CI
        # machine: a kill at a fixed 1.5 s sometimes came before the first step, leaving no
        # incarnation to call killed), then a little later, mid-run.
        wait_for(lambda: truth.exists() and b"save_end" in truth.read_bytes(), timeout=120)
        time.sleep(0.3)
    finally:
        first.kill()
        first.wait()
    time.sleep(0.3)  # downtime before the restart
    subprocess.run([*argv, "--truth", str(base / "t1"), "--total", "60"], env=env, check=True, timeout=60)
    return run


def test_table(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "Where the wall time went" in out
    assert "productive" in out
    assert "Incarnations" in out
    assert "killed" in out
    assert "clean" in out


def test_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["restarts"] == 1
    assert data["incarnations"] == 2
    assert 0 < data["goodput"] < 1
    assert data["badput_seconds"]["checkpoint_save"] > 0
    assert data["badput_seconds"]["downtime"] >= 0.25
    total = data["productive_seconds"] + sum(data["badput_seconds"].values())
    assert total == pytest.approx(data["wall_seconds"], abs=1e-5)
    assert set(data["windows"]) == {"1h", "24h"}
    assert data["state"] == "ended"


def test_png_has_a_sensible_size_and_is_not_blank(run_dir: Path, tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    png = tmp_path / "timeline.png"
    assert main(["report", str(run_dir), "--json", "--png", str(png)]) == 0
    assert png.stat().st_size > 10_000
    img = mpimg.imread(png)
    height, width = img.shape[:2]
    assert 600 <= width <= 2000
    assert 400 <= height <= 1500
    rgb = img[..., :3].reshape(-1, 3)
    non_white = (rgb < 0.95).any(axis=1).mean()
    assert non_white > 0.03  # bars, lines and text, not an empty canvas
    colors = {tuple(c) for c in (rgb[:: max(1, len(rgb) // 20000)] * 255).astype(int)}
    assert len(colors) > 20


def test_summary_agrees_with_json_and_counts_the_kill(run_dir: Path) -> None:
    s = summarize(run_dir)
    assert [i.ending for i in s.incarnations] == ["killed", "clean"]
    assert s.incarnations[1].resumed_from == s.incarnations[1].first_step - 1
    assert s.checkpoints_ok >= 1


def test_empty_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "babysitter-ledger.jsonl").write_bytes(b"")
    assert main(["report", str(tmp_path)]) == 1
    assert "no ledger records" in capsys.readouterr().err


def test_a_ledger_of_invalid_lines_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not "no records yet", which sends one waiting for a run that wrote lines the report skipped."""
    (tmp_path / "babysitter-ledger.jsonl").write_text('{"not": "a record"}\nnor this\n')
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "2 line(s) skipped as invalid, torn or fenced" in err and "yet" not in err, err


def test_missing_ledger_says_what_writes_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: an empty directory named a ledger file that does not exist and gave no hint."""
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"no ledger in {tmp_path}" in err
    assert "babysitter.watch(..., run_dir=...)" in err, err
    assert "no ledger records" not in err
    assert err.count("\n") == 1


def test_missing_ledger_points_at_the_one_below(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger one directory down (the demo's work directory keeps its run in run/) is named, with the
    command that reads it."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "babysitter-ledger.jsonl").write_bytes(b"")
    assert main(["report", str(tmp_path)]) == 1
    assert f"babysitter report {tmp_path / 'run'}" in capsys.readouterr().err


def test_bad_ledger_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path), "--ledger", "../etc/passwd"]) == 2
    assert "file name" in capsys.readouterr().err


def test_missing_report_extra_gives_a_clear_error(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    assert main(["report", str(run_dir)]) == 2
    from babysitter._install import pip_install_extra

    assert pip_install_extra("report") in capsys.readouterr().err  # the extra, for this installation


def test_a_live_run_reports_running_up_to_now(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from babysitter.ledger import LedgerWriter

    writer = LedgerWriter(tmp_path, run="live", flush_interval=0.02)
    try:
        assert writer.wait_loaded(10)
        t0 = time.time() - 60
        writer.incarnation_start(time=t0, info={})
        writer.progress(
            boundaries=[(1, t0 + 10), (2, t0 + 11)], data_wait_seconds=0.0, model_flops=0.0, peak_flops=None
        )
        writer.flush()
        deadline = time.monotonic() + 5
        ledger = tmp_path / "babysitter-ledger.jsonl"
        while not ledger.exists() or b'"k":"prog"' not in ledger.read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        now = time.time()
        assert main(["report", str(tmp_path), "--json", "--now", str(now)]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["state"] == "running"
        assert data["horizon_time"] == pytest.approx(now, abs=1e-3)
        assert data["at_risk_seconds"] == pytest.approx(1.0)  # step 2, no checkpoint covers it
        assert data["incarnation_list"][0]["ending"] == "running"
    finally:
        writer.close(time=time.time(), clean=True)
    assert main(["report", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "ended"


def test_timeline_lines_break_across_long_gaps() -> None:
    """A hang between two points shows as a gap in the step-time line, not a slope."""
    import math

    from babysitter.views.report import _broken

    xs, ys = _broken([0.0, 1.0, 2.0, 3.0, 30.0, 31.0], [1.0, 1.0, 1.0, 1.0, 27.0, 1.0])
    assert xs == [0.0, 1.0, 2.0, 3.0, 16.5, 30.0, 31.0]
    assert math.isnan(ys[4])
    assert ys[:4] == [1.0] * 4
    assert ys[5:] == [27.0, 1.0]
    assert _broken([0.0, 1.0, 2.0], [1.0, 2.0, 3.0]) == ([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])


def test_markup_in_the_ledgers_strings_is_printed_as_text(tmp_path: Path) -> None:
    """A host or run name with rich markup (the file is on shared storage) is shown literally; before,
    a host of ``[/]x`` killed the table with a MarkupError."""
    import io

    from rich.console import Console

    from babysitter.ledger.records import Start
    from babysitter.views.report import render_table
    from test_ledger_helpers import Book, ramp

    book = Book().start(0.0).steps(1, ramp(0.5, 5)).end(10.0)
    first = book.records[0]
    assert isinstance(first, Start)
    book.records[0] = Start(t=first.t, pst=first.pst, id=first.id, host="[/]x", pid=1, run="r[bold]")
    book.write(tmp_path / "babysitter-ledger.jsonl")
    out = io.StringIO()
    render_table(summarize(tmp_path), console=Console(file=out, width=200, color_system=None))
    assert "[/]x" in out.getvalue() and "r[bold]" in out.getvalue()
