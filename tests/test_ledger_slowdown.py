"""Slowdown as badput: the ideal step time, what is booked beyond it, and the identity around it.

Hand-written ledgers (``test_ledger_helpers.Book``) with known step times, so each test knows the
answer to the microsecond; the end-to-end tests with real trackers and ranks are in
``test_slowdown_e2e.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter.ledger.accounting import Accountant
from babysitter.ledger.slowdown import MIN_SAMPLES, WINDOW, SlowBook
from test_ledger_helpers import T0, US, Book


def _ends(t0: float, durations: list[float]) -> list[float]:
    out, t = [], t0
    for d in durations:
        t += d
        out.append(t)
    return out


def _book(durations: list[float], *, tokens: list[int] | None = None, first: float = 1.0) -> Book:
    """One incarnation: a 1 s first step (startup), then ``durations``, one progress line per 10 steps."""
    book = Book().start(0)
    steps = [first, *durations]
    work = None if tokens is None else [tokens[0], *tokens]
    ends = _ends(0, steps)
    for k in range(0, len(ends), 10):
        book.steps(
            k + 1,
            ends[k : k + 10],
            waits=[0.0] * len(ends[k : k + 10]),
            tokens=None if work is None else work[k : k + 10],
        )
    return book.end(ends[-1] + 0.5)


def _identity(acc) -> None:  # type: ignore[no-untyped-def]
    assert acc.productive_us + sum(acc.badput_us.values()) == acc.wall_us == acc.horizon_us - acc.start_us


def test_a_slow_stretch_books_exactly_its_time_beyond_the_ideal() -> None:
    healthy = [0.1] * 100
    slow = [0.14] * 50  # 40% slower: 50 x 40 ms beyond the ideal
    acc = _book([*healthy, *slow, *healthy]).account()
    _identity(acc)
    assert acc.badput_us["slowdown"] == 50 * 40_000
    # Nothing else moved: the 250 steps' ideal time is productive.
    assert acc.productive_us == 250 * 100_000


def test_jitter_within_the_tolerance_books_nothing() -> None:
    rng = random.Random(7)
    durations = [0.1 * rng.uniform(0.95, 1.05) for _ in range(2000)]
    acc = _book(durations).account()
    _identity(acc)
    assert acc.badput_us["slowdown"] == 0


def test_gc_pauses_are_booked_but_do_not_move_the_ideal() -> None:
    """A 2x step every 50th (a GC pause) is slow on its own; the steps around it are not judged
    against an ideal it pulled up (MLGM's median + 3 MAD rule keeps it out of the mean)."""
    durations = [0.2 if k % 50 == 49 else 0.1 for k in range(500)]
    acc = _book(durations).account()
    pauses = sum(1 for k in range(500) if k % 50 == 49)
    assert acc.badput_us["slowdown"] == pauses * 100_000


def test_a_slowdown_longer_than_the_window_is_still_measured_against_the_healthy_ideal() -> None:
    """The median of all steps would become the slow time after half the window: slow steps never
    enter the baseline, so the whole stretch is booked."""
    n_slow = 3 * WINDOW
    acc = _book([*([0.1] * 100), *([0.13] * n_slow)]).account()
    assert acc.badput_us["slowdown"] == n_slow * 30_000


def test_a_faster_run_lowers_the_ideal() -> None:
    """Faster steps are healthy: they enter the window and the ideal follows them down, so a later
    return to the old speed is slow against the new one."""
    durations = [*([0.1] * 100), *([0.08] * WINDOW * 2), *([0.1] * 50)]
    acc = _book(durations).account()
    assert acc.badput_us["slowdown"] == 50 * 20_000


def test_the_first_steps_of_a_level_are_never_booked() -> None:
    """A run slow from its first step establishes its ideal from those steps (docs: where it is wrong)."""
    acc = _book([*([0.14] * MIN_SAMPLES), *([0.1] * 200)]).account()
    assert acc.badput_us["slowdown"] == 0


def test_a_sequence_length_schedule_that_doubles_the_work_books_nothing() -> None:
    """Tokens double (and the step takes 2.2x: attention grows faster than linearly); then the work
    halves again, where the per-step overhead makes it more than half the time."""
    durations = [*([0.1] * 200), *([0.22] * 200), *([0.1] * 100)]
    tokens = [*([4096] * 200), *([8192] * 200), *([4096] * 100)]
    acc = _book(durations, tokens=tokens).account()
    _identity(acc)
    assert acc.badput_us["slowdown"] == 0
    # The same time series with no token counts is a 2.2x slowdown.
    assert _book(durations).account().badput_us["slowdown"] > 0


def test_steps_of_varying_tokens_are_compared_per_token() -> None:
    """Packed batches whose tokens vary by 2% share a level: a step of fewer tokens is not fast, one
    of more tokens is not slow, when both take time in proportion."""
    rng = random.Random(3)
    tokens = [4000 + rng.randrange(0, 80) for _ in range(1000)]
    durations = [t * 25e-6 for t in tokens]
    assert _book(durations, tokens=tokens).account().badput_us["slowdown"] == 0


def test_eval_phases_and_checkpoints_are_not_slow_steps() -> None:
    book = Book().start(0)
    ends = _ends(0, [1.0, *([0.1] * 60)])
    book.steps(1, ends, waits=[0.0] * len(ends))
    t = ends[-1]
    book.phase("eval", t + 0.01, t + 2.0)  # the step gap around it holds 2 s of eval
    later = _ends(t, [2.1, *([0.1] * 30)])
    book.steps(len(ends) + 1, later, waits=[0.0] * len(later))
    t = later[-1]
    book.save(t + 0.01, t + 1.0, len(ends) + len(later))
    last = _ends(t, [1.1, *([0.1] * 30)])
    book.steps(len(ends) + len(later) + 1, last, waits=[0.0] * len(last))
    acc = book.end(last[-1]).account()
    _identity(acc)
    assert acc.badput_us["slowdown"] == 0
    assert acc.badput_us["eval"] > 0 and acc.badput_us["checkpoint_save"] > 0


def test_data_waits_are_data_stall_not_slowdown() -> None:
    book = Book().start(0)
    ends = _ends(0, [1.0, *([0.1] * 60), *([0.5] * 10)])
    waits = [0.0] * 61 + [0.4] * 10  # the loader held each of the last 10 steps for 0.4 s
    book.steps(1, ends, waits=waits)
    acc = book.end(ends[-1]).account()
    assert acc.badput_us["slowdown"] == 0
    assert acc.badput_us["data_stall"] == 10 * 400_000


def test_the_ideal_carries_across_restarts_and_a_kill_mid_stretch_keeps_the_books_exact() -> None:
    """Killed in the middle of a slow stretch and restarted from a checkpoint: the new incarnation
    judges its steps against the ideal learned before the kill, its redone steps are lost progress at
    their ideal time, and the slow excess is slowdown whichever incarnation ran it."""
    book = Book().start(0)
    first = _ends(0, [1.0, *([0.1] * 100), *([0.15] * 20)])
    book.steps(1, first[:101], waits=[0.0] * 101).save(first[100] + 0.001, first[100] + 0.002, 101)
    book.steps(102, first[101:], waits=[0.0] * 20)  # 20 slow steps after the save, then SIGKILL
    begin = first[-1] + 5.0
    book.start(begin, pst=begin - 1.0).load(begin + 0.1, begin + 0.3, 101)
    second = _ends(begin + 0.3, [1.0, *([0.15] * 10), *([0.1] * 50)])
    book.steps(102, second, waits=[0.0] * len(second))
    acc = book.end(second[-1] + 0.1).account()
    _identity(acc)
    # 30 slow steps (20 before the kill, 10 after), each 50 ms beyond the 100 ms ideal; the first
    # after the save holds the save's millisecond, so it is not judged (not a plain step).
    assert acc.badput_us["slowdown"] == 29 * 50_000
    # The 20 steps redone after the restart: lost at their ideal time (the one holding the save at
    # all of its time less the save's 1 ms; no tail after the last boundary: the kill came right at it).
    assert acc.badput_us["lost_progress"] == 19 * 100_000 + 150_000 - 1_000


def test_the_live_counters_equal_the_report_and_never_go_down() -> None:
    """The writer's accountant sees the ledger grow line by line; its slowdown after the last line is
    the report's, and neither it nor productive time ever went down on the way."""
    rng = random.Random(11)
    durations = [0.1 * rng.uniform(0.97, 1.03) for _ in range(300)]
    for k in range(120, 160):
        durations[k] *= 1.5
    book = _book(durations)
    live = Book()
    accountant = Accountant(live.timeline(), settle_seconds=1.0)
    tl = accountant.timeline
    prev = (0, 0)
    for record in book.records:
        tl.add(record)
        now = max(inc.last_t for inc in tl.incarnations) / US
        acc = accountant.totals(now=now, live=True, tail="exclude", hold=True)
        cur = (acc.productive_us, acc.badput_us["slowdown"])
        assert cur[0] >= prev[0] and cur[1] >= prev[1]
        prev = cur
    report = book.account()
    assert prev[1] == report.badput_us["slowdown"]
    # 40 steps 50% slower than a ~100 ms ideal (the healthy steps jitter by 3%).
    assert report.badput_us["slowdown"] / US == pytest.approx(40 * 0.05, rel=0.1)


def test_windows_split_the_slowdown_exactly() -> None:
    durations = [*([0.1] * 100), *([0.2] * 40), *([0.1] * 60)]
    book = _book(durations)
    accountant = Accountant(book.timeline())
    total = accountant.totals()
    cut = T0 + 1.0 + 100 * 0.1 + 20 * 0.2 + 0.05  # inside the 21st slow step
    a = accountant.window(T0 - 1, cut)
    b = accountant.window(cut, T0 + 1000)
    assert a.badput_us["slowdown"] + b.badput_us["slowdown"] in (
        total.badput_us["slowdown"],
        total.badput_us["slowdown"] - 1,  # the cut step's share is rounded down on one side
    )
    assert a.wall_us + b.wall_us == total.wall_us


def test_book_queries_give_mlgm_metrics_and_the_stretch() -> None:
    durations = [*([0.1] * 100), *([0.14] * 50), *([0.1] * 100)]
    book = SlowBook(_book(durations).timeline())
    book.update()
    assert book.ideal_seconds() == pytest.approx(0.1)
    assert book.deviation_seconds() == pytest.approx(0.0, abs=1e-6)  # the last 100 steps are ideal
    (stretch,) = book.stretches()
    assert stretch.slow_steps == 50
    assert stretch.factor == pytest.approx(1.4)
    assert stretch.excess_us == 50 * 40_000


@st.composite
def _runs(draw: st.DrawFn) -> Book:
    """Runs with slow stretches, evals, saves, kills and restarts from the newest save."""
    book = Book()
    t, step, saved = 0.0, 0, 0
    for _ in range(draw(st.integers(1, 3))):
        t += draw(st.floats(0.5, 10))
        book.start(t, pst=t - draw(st.floats(0, 2)))
        if saved:
            book.load(t + 0.1, t + 0.5, saved)
            t += 0.5
        step = saved
        for _ in range(draw(st.integers(1, 6))):
            factor = draw(st.sampled_from([1.0, 1.0, 1.5, 3.0]))
            n = draw(st.integers(1, 25))
            ends = []
            for _ in range(n):
                t += 0.1 * factor * draw(st.floats(0.97, 1.03))
                ends.append(t)
            waits = [draw(st.sampled_from([0.0, 0.0, 0.01, 1.0])) for _ in ends]
            if step == saved:  # no wait before an incarnation's first batch: the live counters move
                waits[0] = 0.0  # it from startup to data_stall when its boundary comes (not slowdown's)
            book.steps(step + 1, ends, waits=waits, tokens=[draw(st.sampled_from([100, 200]))] * n)
            step += n
            what = draw(st.sampled_from(["none", "none", "save", "eval", "hang"]))
            if what == "save":
                book.save(t + 0.01, t + 0.2, step)
                saved = step
                t += 0.3
            elif what == "eval":
                book.phase("eval", t + 0.01, t + 0.5)
                t += 0.6
            elif what == "hang":
                book.hang(t + 3, step, 3)
                t += 4
        book.alive(t + 0.05)
    if draw(st.booleans()):
        book.end(t + 0.1)
    return book


@settings(max_examples=60, deadline=None)
@given(_runs())
def test_identity_and_monotone_live_counters_with_slowdown(book: Book) -> None:
    full = book.timeline()
    now = max(inc.last_t for inc in full.incarnations) / US + 1
    for live in (False, True):
        acc = Accountant(full).totals(now=now, live=live, tail="exclude" if live else "other")
        assert acc.productive_us + sum(acc.badput_us.values()) == acc.wall_us
        assert acc.wall_us + acc.pending_us == acc.horizon_us - acc.start_us
        assert min(acc.badput_us.values()) >= 0 and acc.productive_us >= 0
    prev: dict[str, int] | None = None
    grown = Accountant(Book().timeline(), settle_seconds=0.5)
    for record in book.records:
        grown.timeline.add(record)
        at = max(inc.last_t for inc in grown.timeline.incarnations) / US
        acc = grown.totals(now=at, live=True, tail="exclude", hold=True)
        cur = {"productive": acc.productive_us, **acc.badput_us}
        if prev is not None:
            assert all(cur[key] >= prev[key] for key in cur), (prev, cur)
        prev = cur
    # Grown line by line or read at once: the same slowdown, to the microsecond.
    assert prev is not None
    assert (
        prev["slowdown"]
        == Accountant(full).totals(now=now, live=True, tail="exclude", hold=True).badput_us["slowdown"]
    )


def test_the_straggler_verdicts_name_the_episode_they_fall_in() -> None:
    """A verdict during an episode (or standing when it began) names its rank, host and GPU; an
    episode after a verdict that no rank is slow any more stays unknown."""
    from babysitter.ledger.records import Straggler
    from babysitter.ledger.slowcause import split_from_ledger
    from test_ledger_helpers import s

    durations = [*([0.1] * 100), *([0.15] * 40), *([0.1] * 800), *([0.15] * 40), *([0.1] * 20)]
    book = _book(durations)
    end = book.records.pop()  # the verdicts go before the end record
    book.tags.pop()
    first_slow = 1.0 + 100 * 0.1  # the first stretch begins here (seconds after T0)
    book._add(Straggler(t=s(first_slow + 3.0), rank=2, score=1.45, host="n2", gpu="GPU-2"))
    book._add(Straggler(t=s(first_slow + 9.0), rank=None))
    book._add(end)
    timeline = book.timeline()
    slow = SlowBook(timeline)
    slow.update()
    split = split_from_ledger(slow, timeline)
    first, second = split.episodes
    assert (first.cause, first.rank, first.host, first.gpu) == ("straggler", 2, "n2", "GPU-2")
    assert "1.45x" in first.evidence[0]
    assert (second.cause, second.rank) == ("unknown", None)  # 80 s later: the verdict was cleared
    assert split.by_cause["straggler"] == pytest.approx(40 * 0.05)
    assert split.by_cause["unknown"] == pytest.approx(40 * 0.05)
    assert split.total_us == round(80 * 0.05 * US)


def test_token_counts_and_straggler_verdicts_round_trip_and_bad_ones_are_invalid_lines() -> None:
    """``tk`` is one number when every step of a line had the same tokens, a list otherwise; a
    malformed ``tk`` or ``strg`` is an invalid line (skipped, counted), never a crash."""
    import json

    from babysitter.ledger.reader import parse_ledger
    from babysitter.ledger.records import Progress, SchemaError, Straggler, decode, encode

    same = Progress(
        t=10, steps=(1, 2), ends=(5, 10), data_wait=0, model_flops=0.0, peak_flops=None, work=(8, 8)
    )
    mixed = Progress(
        t=10, steps=(1, 2), ends=(5, 10), data_wait=0, model_flops=0.0, peak_flops=None, work=(8, 9)
    )
    assert json.loads(encode(same))["tk"] == 8 and json.loads(encode(mixed))["tk"] == [8, 9]
    assert decode(json.loads(encode(same))).work == (8, 8)  # type: ignore[union-attr]
    assert decode(json.loads(encode(mixed))).work == (8, 9)  # type: ignore[union-attr]
    verdict = Straggler(t=5, rank=3, score=1.41, host="n3", gpu="GPU-3")
    assert decode(json.loads(encode(verdict, fence="abcd"))) == verdict
    cleared = Straggler(t=6, rank=None)
    assert decode(json.loads(encode(cleared))) == cleared
    for bad in ({"tk": [1]}, {"tk": -1}, {"tk": "8"}, {"tk": [1, "x"]}):
        line = {**json.loads(encode(mixed)), **bad}
        with pytest.raises(SchemaError):
            decode(line)
    head = b'{"v":2,"k":"start","t":1,"pst":1,"id":"abcd","host":"h","pid":1,"run":"r","info":{}}\n'
    lines = [
        b'{"v":2,"k":"prog","s":1,"b0":5,"d":[5],"tk":[1,2,3],"f":"abcd"}\n',
        b'{"v":2,"k":"strg","t":7,"rank":-1,"score":1.2,"f":"abcd"}\n',
        b'{"v":2,"k":"strg","t":7,"rank":1,"score":"x","f":"abcd"}\n',
        b'{"v":2,"k":"strg","t":7,"rank":1,"score":1.2,"host":5,"f":"abcd"}\n',
    ]
    parsed = parse_ledger(head + b"".join(lines))
    assert parsed.invalid_lines == len(lines)
    # The report's fast path (progress lines straight into the timeline) refuses the same line.
    from babysitter.ledger.reader import _parse
    from babysitter.ledger.timeline import Timeline

    timeline = Timeline()
    assert _parse(head + lines[0], timeline.add_raw).invalid_lines == 1
    assert timeline.incarnations[0].n == 0


def test_the_report_shows_the_slowdown_in_its_tables_json_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from babysitter.cli import main
    from babysitter.ledger import summarize
    from babysitter.ledger.records import Straggler
    from babysitter.views.report import legend
    from test_ledger_helpers import s

    book = _book([*([0.1] * 100), *([0.14] * 50), *([0.1] * 100)], tokens=[4096] * 250)
    end = book.records.pop()
    book.tags.pop()
    book._add(Straggler(t=s(1.0 + 10.0 + 2.0), rank=2, score=1.4, host="node-[b]", gpu="GPU-2"))
    book._add(end)
    run = tmp_path / "run"
    run.mkdir()
    book.write(run / "babysitter-ledger.jsonl")
    assert main(["report", str(run)]) == 0
    table = capsys.readouterr().out
    assert "Slowdown by cause" in table and "straggler" in table
    assert "node-[b]" in table  # the ledger's host printed as text, its brackets not taken for markup
    assert main(["report", str(run), "--json", "--png", str(tmp_path / "t.png")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["badput_seconds"]["slowdown"] == pytest.approx(2.0)
    assert data["slowdown"]["by_cause"]["straggler"] == pytest.approx(2.0)
    assert data["incarnation_list"][0]["slowdown_seconds"] == pytest.approx(2.0)
    assert (tmp_path / "t.png").stat().st_size > 10_000
    assert ("slowdown", "slowdown 2.0s") in legend(summarize(run))
