"""No babysitter command ends in a Python traceback (issue 31): an unexpected error is one line that
says what failed, a hint, and how to see the traceback, with an exit status no command gives a
meaning to; and a run name that matplotlib read as mathtext no longer fails the report's PNG."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from babysitter.cli import CRASH_STATUS, DEBUG_ENV, main
from test_ledger_helpers import Book, ramp

ROOT = Path(__file__).resolve().parent.parent


def _boom(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("the ledger said \x1b[2Jno\nmore")


def test_an_unexpected_error_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What failed (the command, the error, its text without control characters), a hint, where the
    traceback is; nothing on stdout."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    (tmp_path / "babysitter-ledger.jsonl").write_bytes(b"")
    monkeypatch.setattr("babysitter.cli.report.summarize", _boom)
    assert main(["report", str(tmp_path)]) == CRASH_STATUS
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("babysitter report: failed: RuntimeError: the ledger said [2Jno more ("), err
    assert "Traceback" not in err and "\x1b" not in err
    assert f"{DEBUG_ENV}=1" in err and "babysitter --debug report" in err


@pytest.mark.parametrize("how", ["env", "flag"])
def test_the_traceback_is_there_when_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    (tmp_path / "babysitter-ledger.jsonl").write_bytes(b"")
    monkeypatch.setattr("babysitter.cli.report.summarize", _boom)
    argv = ["report", str(tmp_path)]
    if how == "env":
        monkeypatch.setenv(DEBUG_ENV, "1")
    else:
        monkeypatch.delenv(DEBUG_ENV, raising=False)
        argv = ["--debug", *argv]
    with pytest.raises(RuntimeError, match="the ledger said"):
        main(argv)


def test_the_hint_names_a_cause_it_can_know(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input nested past Python's recursion limit is said to be that, not "a bug"."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)

    def deep(*_args: object, **_kwargs: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    (tmp_path / "babysitter-ledger.jsonl").write_bytes(b"")
    monkeypatch.setattr("babysitter.cli.report.summarize", deep)
    assert main(["report", str(tmp_path)]) == CRASH_STATUS
    assert "nested too deeply" in capsys.readouterr().err


def test_ctrl_c_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("babysitter.cli.report.summarize", interrupted)
    monkeypatch.setattr("pathlib.Path.exists", lambda _self: True)
    assert main(["report", "/"]) == 130
    assert capsys.readouterr().err == "babysitter: interrupted\n"


def test_the_console_script_itself_prints_no_traceback(tmp_path: Path) -> None:
    """Through ``python -m babysitter`` (what the console script runs), with the failure planted by a
    sitecustomize: the process exits with the crash status and one line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import babysitter.cli.report as r\n"
        "def boom(*a, **k):\n"
        "    raise ValueError('planted')\n"
        "r.summarize = boom\n"
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "babysitter-ledger.jsonl").write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")])}
    env.pop(DEBUG_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-m", "babysitter", "report", str(run)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == CRASH_STATUS, proc.stderr
    assert proc.stderr.startswith("babysitter report: failed: ValueError: planted ("), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_a_dollar_in_the_run_name_does_not_fail_the_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``$\\foo{$`` in a run name is mathtext to matplotlib: on main, ``report --png`` ended in a
    ValueError traceback. It is a literal dollar now, and the PNG is written."""
    from babysitter.ledger.records import Start

    book = Book().start(0.0).steps(1, ramp(0.5, 5)).end(10.0)
    first = book.records[0]
    assert isinstance(first, Start)
    book.records[0] = Start(t=first.t, pst=first.pst, id=first.id, host="h", pid=1, run="run$\\foo{$")
    book.write(tmp_path / "babysitter-ledger.jsonl")
    png = tmp_path / "t.png"
    assert main(["report", str(tmp_path), "--json", "--png", str(png)]) == 0
    assert png.stat().st_size > 10_000
    assert "failed" not in capsys.readouterr().err
