"""Remediation notes next to a ledger: each restart's cause, time to detect and time to recover in
``babysitter report`` (table and ``--json``), and a notes file that is untrusted input."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from babysitter.cli import main
from babysitter.ledger import summarize
from babysitter.ledger.remediations import MAX_BYTES, NOTES_FILE, match_restarts, read_notes
from babysitter.views.report import render_table
from test_ledger_helpers import T0, Book, ramp

CAUSE = "remediated: drained host n1 after Xid 79, requeued job 12"


def note(t: float, *, alert_start: float | None = None, run: str = "r", **extra: Any) -> dict[str, Any]:
    """A note as ``babysitter remediate`` writes it (``t`` and ``alert_start`` in seconds after T0)."""
    line: dict[str, Any] = {
        "v": 1,
        "t": T0 + t,
        "run": run,
        "action": "requeue",
        "job": "12",
        "host": "n1",
        "drained": "n1",
        "alert": "GpuXidCritical",
        "cause": CAUSE,
        "labels": {"xid": "79", "gpu": "1"},
        "resume_step": 20,
    }
    if alert_start is not None:
        line["alert_start"] = T0 + alert_start
    line.update(extra)
    return line


def write_notes(run_dir: Path, *lines: dict[str, Any] | bytes) -> None:
    with (run_dir / NOTES_FILE).open("ab") as fh:
        for line in lines:
            fh.write(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")


def three_incarnations(run_dir: Path) -> Path:
    """Incarnation 0 steps 1-30 (0.5..29.5 s) and dies; 1 starts at 40 s (first step ends at 45 s),
    steps until 70 s and dies; 2 starts at 80 s, first step ends at 83 s, ends cleanly at 100 s."""
    run_dir.mkdir(exist_ok=True)
    book = Book().start(0.0).steps(1, ramp(0.5, 30)).save(20.0, 20.2, 20)
    book.start(40.0).load(40.5, 41.0, 20).steps(21, ramp(45.0, 26)).alive(70.0)
    book.start(80.0).steps(47, ramp(83.0, 17)).end(100.0)
    return book.write(run_dir / "babysitter-ledger.jsonl")


def report_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["report", str(run_dir), "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def table(run_dir: Path) -> str:
    out = io.StringIO()
    render_table(summarize(run_dir), console=Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_a_remediated_restart_has_its_cause_time_to_detect_and_time_to_recover(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The note written at 31 s for an alert that started at 28 s explains restart 1: detected in
    3 s, recovered in 14 s (31 s -> the first step's end at 45 s); restart 2 has no note."""
    run = tmp_path / "r"
    three_incarnations(run)
    write_notes(run, note(31.0, alert_start=28.0))
    data = report_json(run, capsys)
    first, second = data["restart_list"]
    assert first["index"] == 1
    assert first["cause"] == CAUSE
    assert first["remediated"] is True
    assert first["after"] == "killed"
    assert first["time_to_detect_seconds"] == pytest.approx(3.0)
    assert first["time_to_recover_seconds"] == pytest.approx(14.0)
    assert first["downtime_seconds"] == pytest.approx(40.0 - 29.5)
    assert first["remediation"]["job"] == "12" and first["remediation"]["resume_step"] == 20
    assert second["remediated"] is False
    assert second["cause"] == "process died without an end record"
    assert second["time_to_detect_seconds"] is None and second["time_to_recover_seconds"] is None
    assert second["downtime_seconds"] == pytest.approx(10.0)
    # The restarts' downtimes are the run's downtime, split.
    assert first["downtime_seconds"] + second["downtime_seconds"] == pytest.approx(
        data["badput_seconds"]["downtime"]
    )
    assert [r["restart"] for r in data["remediations"]] == [1]
    assert data["remediation_notes"] == {"skipped": {}, "error": None}
    text = table(run)
    assert "Restarts" in text
    row = next(line for line in text.splitlines() if CAUSE in line)
    assert "3.0s" in row and "14.0s" in row and "10.5s" in row


def test_notes_are_matched_to_the_restart_they_caused(tmp_path: Path) -> None:
    """A note belongs to the restart that followed it: not to an earlier one, not when it came before
    the dead incarnation even began, and the newest of several before one restart wins."""
    run = tmp_path / "r"
    three_incarnations(run)
    write_notes(
        run,
        note(-5.0, cause="remediated: requeued job 1 after TrainingStalled"),  # before the run
        note(72.0, alert_start=70.0, cause="remediated: requeued job 12 after TrainingProcessExited"),
        note(60.0, alert_start=50.0, cause="remediated: requeued job 12 after TrainingStalled"),
    )
    summary = summarize(run)
    assert [r.remediation is not None for r in summary.restart_list] == [False, True]
    assert summary.restart_list[1].cause == "remediated: requeued job 12 after TrainingProcessExited"
    assert summary.restart_list[1].time_to_detect_seconds == pytest.approx(2.0)
    assert summary.restart_list[1].time_to_recover_seconds == pytest.approx(83.0 - 72.0)
    assert [k for _, k in summary.remediations] == [None, None, 2]  # oldest first


def test_a_note_within_the_clock_skew_after_the_restart_still_counts_and_one_long_before_does_not() -> None:
    """Stamped 1 s after the new process started (another host's clock): it caused that restart. One
    stamped more than KILL_LAG before the dead incarnation's last sign of life did not kill it."""
    from babysitter.ledger.remediations import RemediationNote

    def at(t: float) -> RemediationNote:
        return RemediationNote(t=t, action="requeue", cause=f"c{t}", alert="A")

    incs = [(0.0, 2000.0), (2010.0, 3000.0), (3010.0, 3100.0)]
    caused = match_restarts([at(100.0), at(2011.0), at(2500.0)], incs)
    assert caused[1].t == 2011.0  # 1 s after restart 1 began
    assert caused[2].t == 2500.0
    assert match_restarts([at(100.0)], incs) == {}  # 1,900 s before the death: not its cause


def test_a_down_run_with_a_requeue_not_restarted_yet_says_so(tmp_path: Path) -> None:
    """The requeue came after the last incarnation began and nothing restarted since: the table says
    so, so the person on call knows the run was requeued and is waiting on the scheduler."""
    run = tmp_path / "r"
    run.mkdir()
    Book().start(0.0).steps(1, ramp(0.5, 30)).write(run / "babysitter-ledger.jsonl")
    write_notes(run, note(35.0, alert_start=31.0))
    summary = summarize(run, now=T0 + 60)
    assert summary.state == "down" and summary.restart_list == []
    assert [k for _, k in summary.remediations] == [None]
    assert "no incarnation has started since" in table(run)


def test_no_notes_file_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without remediations.jsonl every restart gets the previous incarnation's ending as its cause."""
    run = tmp_path / "r"
    three_incarnations(run)
    data = report_json(run, capsys)
    assert [r["remediated"] for r in data["restart_list"]] == [False, False]
    assert data["remediations"] == []
    assert data["remediation_notes"] == {"skipped": {}, "error": None}


def bad(**fields: Any) -> bytes:
    """The good note with ``fields`` replaced."""
    return json.dumps({**note(31.0), **fields}).encode()


BAD_LINES: list[tuple[bytes, str]] = [
    (b"{torn", "torn"),
    (b"[" * 100_000 + b"\n", "too_long"),
    (b"[" * 5000, "torn"),  # nested too deep for the parser
    (b"null", "invalid"),
    (b"[]", "invalid"),
    (b'"x"', "invalid"),
    (bad(v=2), "invalid"),
    (bad(t=float("nan")), "invalid"),  # NaN, as Python's json writes it
    (bad(t=1e300), "invalid"),
    (bad(t="31"), "invalid"),
    (bad(t=True), "invalid"),
    (bad(alert_start=-(10**30)), "invalid"),
    (bad(resume_step=2**63), "invalid"),
    (bad(resume_step=-1), "invalid"),
    (bad(cause="\x1b[2J remediated"), "invalid"),  # a terminal escape
    (bad(cause="x" * 300), "invalid"),
    (bad(cause=None), "invalid"),
    (bad(host=["n1"]), "invalid"),
    (bad(job={"id": 1}), "invalid"),
    (bad(run="someone-else"), "other_run"),
]


@pytest.mark.parametrize(
    ("line", "reason"), BAD_LINES, ids=[f"{r}-{i}" for i, (_, r) in enumerate(BAD_LINES)]
)
def test_each_bad_line_is_skipped_and_counted_and_the_good_one_still_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: bytes, reason: str
) -> None:
    """One bad line costs only itself: it is counted by reason, the table warns, the good note after
    it still explains restart 1."""
    run = tmp_path / "r"
    three_incarnations(run)
    write_notes(run, line + (b"" if line.endswith(b"\n") else b"\n"), note(31.0, alert_start=28.0))
    data = report_json(run, capsys)
    assert data["remediation_notes"]["skipped"] == {reason: 1}
    assert data["restart_list"][0]["cause"] == CAUSE
    assert f"skipped 1 {reason}" in table(run)


def test_markup_in_a_note_is_printed_as_text(tmp_path: Path) -> None:
    """A cause with rich markup (printable, so accepted) is shown literally and cannot break the table."""
    run = tmp_path / "r"
    three_incarnations(run)
    write_notes(run, note(31.0, alert_start=28.0, cause="remediated: [/] [bold red]x"))
    assert "remediated: [/] [bold red]x" in table(run)


def test_a_huge_notes_file_is_read_from_its_end_only(tmp_path: Path) -> None:
    """Past MAX_BYTES only the file's end is read (older lines counted as not_read); the note at the
    end still explains its restart."""
    run = tmp_path / "r"
    three_incarnations(run)
    filler = json.dumps(note(-100.0, cause="remediated: requeued job 1 after TrainingStalled")).encode()
    with (run / NOTES_FILE).open("wb") as fh:
        fh.write((filler + b"\n") * (2 * MAX_BYTES // len(filler)))
    write_notes(run, note(31.0, alert_start=28.0))
    notes = read_notes(run, run="r")
    assert notes.skipped == {"not_read": 1}
    assert 0 < len(notes.notes) < MAX_BYTES // len(filler) + 1
    assert summarize(run).restart_list[0].cause == CAUSE


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink", "unreadable"])
def test_a_notes_path_that_is_not_a_readable_file_is_an_error_line_not_a_dead_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A FIFO (which would block a plain open), a directory, a symbolic link (never followed) or an
    unreadable file: the report still prints, says why the notes were not read, and blames nothing."""
    run = tmp_path / "r"
    three_incarnations(run)
    path = run / NOTES_FILE
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        target = tmp_path / "elsewhere.jsonl"
        write_notes(tmp_path, note(31.0))
        (tmp_path / NOTES_FILE).rename(target)
        path.symlink_to(target)
    else:
        write_notes(run, note(31.0))
        path.chmod(0)
        if os.access(path, os.R_OK):
            pytest.skip("running as root: a mode-0 file is still readable")
    data = report_json(run, capsys)
    assert data["remediation_notes"]["error"]
    assert [r["remediated"] for r in data["restart_list"]] == [False, False]
    assert "remediation notes:" in table(run)


def test_mutated_notes_never_crash_the_report(tmp_path: Path) -> None:
    """200 random mutations of a valid notes file (seeded): summarize, --json and the table always
    work, and every line is either a note or counted as skipped."""
    run = tmp_path / "r"
    three_incarnations(run)
    good = [json.dumps(note(31.0 + i, alert_start=28.0)).encode() for i in range(4)]
    seed = int(os.environ.get("BABYSITTER_FUZZ_SEED", "1817"))
    rng = random.Random(seed)
    junk = [b"\x00", b"\xff", b"NaN", b"1e999", b"[", b"]", b"{", b"}", b'"', b"\\", b"\n", b"\x1b[31m", b"-"]
    for _ in range(200):
        lines = [bytearray(line) for line in good]
        for _ in range(rng.randint(1, 6)):
            line = rng.choice(lines)
            at = rng.randrange(len(line) + 1)
            if rng.random() < 0.5 and line:
                del line[at : at + rng.randint(1, 8)]
            else:
                line[at:at] = rng.choice(junk)
        data = b"\n".join(bytes(line) for line in lines) + b"\n"
        (run / NOTES_FILE).write_bytes(data)
        summary = summarize(run)
        json.dumps(summary.to_json())
        table(run)
        lines_in_file = sum(1 for raw in data.split(b"\n") if raw.strip())
        assert len(summary.remediations) + sum(summary.notes_skipped.values()) == lines_in_file, seed
