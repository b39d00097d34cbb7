"""Known answers for hand-written ledgers, and the exact accounting identity on random ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter.ledger.accounting import Accountant
from test_ledger_helpers import T0, US, Book, nonzero, ramp


def _identity(acc, span_us: int | None = None) -> None:  # type: ignore[no-untyped-def]
    assert acc.productive_us + sum(acc.badput_us.values()) == acc.wall_us
    if span_us is not None:
        assert acc.wall_us + acc.pending_us == span_us


def test_clean_run() -> None:
    # Steps 1..10 end at 10..19 s; a 0.5 s save of step 5 runs inside step 6; clean end at 20 s.
    book = Book().start(0).steps(1, ramp(10, 10)).save(14, 14.5, 5).end(20)
    acc = book.account()
    assert nonzero(acc) == {"startup": 10.0, "checkpoint_save": 0.5, "other": 1.0, "productive": 8.5}
    assert acc.wall_us == 20 * US
    assert acc.restarts == 0
    _identity(acc, 20 * US)


def test_restart_from_the_last_checkpoint() -> None:
    book = (
        Book()
        .start(0)
        .steps(1, ramp(10, 10))
        .save(14, 14.5, 5)
        .alive(19.5)  # killed after its last sign of life at 19.5 s
        .start(30, pst=28)
        .load(32, 33, 5)
        .steps(6, ramp(35, 5))
        .end(40)
    )
    acc = book.account()
    # Lost: steps 6..10 of the first incarnation (0.5 + 4 s, the save excluded) and its 0.5 s tail.
    assert nonzero(acc) == {
        "startup": 16.0,
        "checkpoint_load": 1.0,
        "checkpoint_save": 0.5,
        "lost_progress": 5.0,
        "downtime": 8.5,
        "other": 1.0,
        "productive": 8.0,
    }
    assert acc.restarts == 1
    _identity(acc, 40 * US)


def test_restart_from_an_older_checkpoint() -> None:
    book = (
        Book()
        .start(0)
        .steps(1, ramp(10, 10))
        .save(14, 14.5, 5)
        .save(17, 17.5, 8)  # inside step 9
        .alive(19.5)
        .start(30, pst=30)
        .load(31, 32, 5)  # checkpoint 8 was bad: back to 5
        .steps(6, ramp(35, 5))
        .end(40)
    )
    acc = book.account()
    # Steps 6..10 of incarnation 1 are lost even though 8 was saved: 0.5 + 1 + 1 + 0.5 + 1 = 4 s + tail.
    assert nonzero(acc)["lost_progress"] == 4.5
    assert nonzero(acc)["checkpoint_save"] == 1.0
    assert nonzero(acc)["productive"] == 4.0 + 4.0
    _identity(acc, 40 * US)


def test_resume_without_any_checkpoint_loses_everything_before() -> None:
    book = Book().start(0).steps(1, ramp(1, 5)).alive(5.5).start(10).steps(1, ramp(11, 5)).end(16)
    acc = book.account()
    # First incarnation: startup 1, steps 2..5 (4 s) and tail (0.5 s) lost; resumed from step 0.
    assert nonzero(acc) == {
        "startup": 2.0,
        "lost_progress": 4.5,
        "downtime": 4.5,
        "other": 1.0,
        "productive": 4.0,
    }
    _identity(acc, 16 * US)


def test_later_restart_from_an_even_older_step_loses_work_of_two_incarnations() -> None:
    book = (
        Book()
        .start(0)
        .steps(1, ramp(1, 10))  # steps 1..10 at 1..10
        .start(20)
        .load(20, 21, 8)
        .steps(9, ramp(22, 5))  # steps 9..13 at 22..26
        .start(30)
        .load(30, 31, 5)  # back to 5: steps 6..10 of the first and 9..13 of the second are lost
        .steps(6, ramp(32, 3))
        .end(35)
    )
    acc = book.account()
    assert nonzero(acc)["lost_progress"] == 5.0 + 4.0
    assert nonzero(acc)["productive"] == 4.0 + 2.0
    _identity(acc, 35 * US)


def test_a_hang() -> None:
    # Step 5 ends at 5 s; nothing until the watchdog fires at 65 s; step 6 finally ends at 100 s.
    book = Book().start(0).steps(1, ramp(1, 5)).hang(65, 5, 60).steps(6, [100, 101]).end(101)
    acc = book.account()
    assert nonzero(acc) == {"startup": 1.0, "hang": 95.0, "productive": 5.0}
    _identity(acc, 101 * US)


def test_long_downtime() -> None:
    day = 86400.0
    book = (
        Book()
        .start(0)
        .steps(1, ramp(1, 3))
        .save(3, 4, 3)
        .alive(4)
        .start(day, pst=day - 10)
        .load(day, day + 1, 3)
        .steps(4, ramp(day + 2, 3))
        .end(day + 5)
    )
    acc = book.account()
    assert acc.badput_us["downtime"] == round((day - 10 - 4) * US)
    assert acc.goodput < 0.001
    _identity(acc, round((day + 5) * US))


def test_a_failed_checkpoint_save() -> None:
    book = (
        Book()
        .start(0)
        .steps(1, ramp(1, 10))
        .save(3, 3.5, 3)  # inside step 4
        .save(7, 8, 7, ok=False)  # inside step 8: failed
        .alive(10.5)
        .start(20)
        .load(20, 21, 3)
        .steps(4, ramp(22, 2))
        .end(24)
    )
    acc = book.account()
    bad = nonzero(acc)
    assert bad["checkpoint_save"] == 1.5  # the failed save's time is badput too
    # Steps 4..10 of the first incarnation: 7 s minus 0.5 (save 3) minus 1 (failed save) + tail 0.5.
    assert bad["lost_progress"] == 6.0
    _identity(acc, 24 * US)


def test_a_run_still_in_progress() -> None:
    book = Book().start(0).steps(1, ramp(1, 10)).phase("eval", 10.2, 12)
    # Report view: up to now=15, the unfinished step counts as other.
    acc = book.account(now=15, live=True)
    assert nonzero(acc) == {"startup": 1.0, "eval": 1.8, "other": 3.2, "productive": 9.0}
    _identity(acc, 15 * US)
    # Live counters: the unfinished step is pending, never counted as something it later stops being.
    live = book.account(now=15, live=True, tail="exclude")
    assert live.pending_us == round(3.2 * US)
    assert live.badput_us["other"] == 0
    _identity(live, 15 * US)


def test_a_run_that_is_down_counts_downtime_to_now() -> None:
    book = Book().start(0).steps(1, ramp(1, 5)).alive(5.5)
    acc = book.account(now=100)
    assert nonzero(acc) == {"startup": 1.0, "lost_progress": 0.5, "downtime": 94.5, "productive": 4.0}
    _identity(acc, 100 * US)


def test_data_stall_and_user_phases() -> None:
    book = Book().start(0).steps(1, ramp(1, 5), data_wait=0.8).phase("warmup_ckpt_cleanup", 5, 6)
    book.phase("eval", 6, 7).steps(6, [8]).end(8)
    acc = book.account()
    # The data wait is shared by the record's 5 steps (0.16 s each); step 1's share is startup time.
    assert nonzero(acc) == {
        "startup": 1.0,
        "data_stall": 0.64,
        "phase": 1.0,
        "eval": 1.0,
        "productive": 4.36,
    }
    _identity(acc, 8 * US)


def test_rollback_within_one_incarnation_is_lost_progress() -> None:
    book = Book().start(0).steps(1, ramp(1, 10)).load(10, 11, 6).steps(7, ramp(12, 4)).end(15)
    acc = book.account()
    assert nonzero(acc)["lost_progress"] == 4.0  # steps 7..10, computed again after the reload
    assert acc.restarts == 0
    _identity(acc, 15 * US)


def test_windows_cut_gaps_exactly() -> None:
    book = Book().start(0).steps(1, ramp(10, 10)).save(14, 14.5, 5).alive(19.5).start(30, pst=28)
    book.load(32, 33, 5).steps(6, ramp(35, 5)).end(40)
    accountant = Accountant(book.timeline())
    w = accountant.window(T0 + 10, T0 + 35)
    assert nonzero(w) == {
        "startup": 6.0,
        "checkpoint_load": 1.0,
        "checkpoint_save": 0.5,
        "lost_progress": 5.0,
        "downtime": 8.5,
        "productive": 4.0,
    }
    whole = accountant.window(T0 - 100, T0 + 100)
    assert whole.badput_us == accountant.totals().badput_us
    assert whole.productive_us == accountant.totals().productive_us


@st.composite
def _ledgers(draw: st.DrawFn) -> Book:
    book = Book()
    t = 0.0
    step = 0
    for _ in range(draw(st.integers(1, 4))):
        t += draw(st.floats(0, 50))
        book.start(t, pst=t - draw(st.floats(0, 5)))
        t += draw(st.floats(0, 3))
        if step and draw(st.booleans()):
            back = draw(st.integers(0, step))
            book.load(t, t + 1, back)
            t += 1
            step = back
        for _ in range(draw(st.integers(0, 4))):
            n = draw(st.integers(1, 6))
            ends = []
            for _ in range(n):
                t += draw(st.floats(0.001, 3))
                ends.append(t)
            book.steps(step + 1, ends, data_wait=draw(st.floats(0, 2)))
            step += n
            what = draw(st.sampled_from(["none", "save", "failsave", "eval", "hang", "open"]))
            if what in ("save", "failsave"):
                book.save(t + 0.1, t + 0.1 + draw(st.floats(0, 3)), step, ok=what == "save")
            elif what == "eval":
                book.phase("eval", t, t + draw(st.floats(0, 3)))
            elif what == "hang":
                book.hang(t + 5, step, 5)
            elif what == "open":
                book.save(t + 0.2, None, step)
            t += draw(st.floats(0, 4))
        if draw(st.booleans()):
            book.alive(t)
    if draw(st.booleans()):
        book.end(t + 1, clean=draw(st.booleans()))
    return book


@settings(max_examples=150, deadline=None)
@given(_ledgers(), st.floats(0, 500), st.booleans())
def test_identity_holds_exactly_for_any_ledger(book: Book, later: float, live: bool) -> None:
    tl = book.timeline()
    now = T0 + (tl.incarnations[-1].last_t / US - T0) + later
    for tail in ("other", "exclude"):
        acc = Accountant(tl).totals(now=now, live=live, tail=tail)
        _identity(acc, acc.horizon_us - acc.start_us)
        assert all(us >= 0 for us in acc.badput_us.values())
        assert acc.productive_us >= 0
    # Incremental (cached, settled) and fresh accounting agree.
    acc_a = Accountant(tl, settle_seconds=1.0)
    first = acc_a.totals(now=now, live=live)
    again = acc_a.totals(now=now, live=live)
    assert first == again == Accountant(tl).totals(now=now, live=live)
    # Windows that tile the run add up to the whole run.
    total = Accountant(tl).totals(now=now, live=live)
    mid = (total.start_us + total.horizon_us) // 2 / US
    a = Accountant(tl).window(total.start_us / US, mid, now=now, live=live)
    b = Accountant(tl).window(mid, total.horizon_us / US, now=now, live=live)
    assert a.wall_us + b.wall_us == total.wall_us
    assert a.badput_us["downtime"] + b.badput_us["downtime"] == total.badput_us["downtime"]


def test_hold_keeps_uncheckpointed_steps_pending() -> None:
    book = Book().start(0).steps(1, ramp(1, 10)).save(5.2, 5.5, 5)
    held = book.account(now=10, live=True, tail="exclude", hold=True)
    # Steps 2..5 are covered by checkpoint 5 (4 s); 6..10 (4.7 s: the save's 0.3 s is save) are pending.
    assert nonzero(held) == {"startup": 1.0, "checkpoint_save": 0.3, "productive": 4.0}
    assert held.pending_us == round(4.7 * US)
    _identity(held, 10 * US)
    # A clean end keeps everything: the run finished.
    assert book.end(10.5).account(hold=True).productive_us == round(8.7 * US)


@st.composite
def _growing_runs(draw: st.DrawFn) -> Book:
    """Runs whose restarts resume from the newest completed checkpoint, as training scripts do."""
    book = Book()
    t, step, saved = 0.0, 0, 0
    for _ in range(draw(st.integers(1, 4))):
        t += draw(st.floats(0.5, 20))
        book.start(t, pst=t - draw(st.floats(0, 2)))
        if saved:
            book.load(t + 0.1, t + 0.5, saved)
            t += 0.5
        step = saved
        for _ in range(draw(st.integers(0, 5))):
            ends = []
            for _ in range(draw(st.integers(1, 4))):
                t += draw(st.floats(0.01, 2))
                ends.append(t)
            book.steps(step + 1, ends, data_wait=draw(st.floats(0, 0.5)))
            step += len(ends)
            if draw(st.booleans()):
                book.save(t + 0.01, t + 0.01 + draw(st.floats(0, 1)), step, ok=draw(st.booleans()))
                t += 1.1
                if book.records[-1].ok:  # type: ignore[union-attr]
                    saved = step
            if draw(st.booleans()):
                book.phase("eval", t, t + 0.5)
                t += 0.6
        t += draw(st.floats(0, 2))
        book.alive(t)
    return book


@settings(max_examples=80, deadline=None)
@given(_growing_runs())
def test_live_counters_never_decrease_as_the_run_grows_and_restarts(book: Book) -> None:
    """What a scrape of the live writer shows after every record: no counter ever goes down."""
    prev: dict[str, int] | None = None
    for k in range(1, len(book.records) + 1):
        part = Book()
        part.records = book.records[:k]
        tl = part.timeline()
        now = max(inc.last_t for inc in tl.incarnations) / US
        acc = Accountant(tl).totals(now=now, live=True, tail="exclude", hold=True)
        cur = {"productive": acc.productive_us, **acc.badput_us}
        if prev is not None:
            for key, value in cur.items():
                assert value >= prev[key], (k, key, prev[key], value)
        prev = cur


def test_a_checkpoint_begin_whose_end_was_lost_closes_at_the_next_begin() -> None:
    book = Book().start(0).steps(1, ramp(1, 3)).save(3.1, None, 3).steps(4, [5]).save(5.1, 5.6, 4)
    acc = book.steps(5, [6]).end(6).account()
    # The first save counts up to the second save's begin (2.0 s), not to the end of the run.
    assert nonzero(acc)["checkpoint_save"] == 2.5
    _identity(acc, 6 * US)
