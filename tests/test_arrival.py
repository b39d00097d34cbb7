"""The arrival score's arithmetic on simulated lockstep ranks: who the others wait for, whatever the clocks.

A small simulator plays what the flight recorder sees on each rank of a synchronous job: every rank
computes for its own time, enqueues the step's collectives, and a collective completes when the last
rank arrived (blocking) or runs in the background (async, like DDP's buckets). Each rank stamps times
with its own clock (true time + its offset). The rounds then go through exactly what the straggler
monitor does: completion stamps -> clock offsets, payloads, an element-wise max over ranks (what the
MAX all_reduce returns), evaluate, scores. The torchrun end-to-end run (tests/test_collectives_e2e.py)
checks the same on real gloo ranks.
"""

from __future__ import annotations

import math
import random

import pytest

from babysitter.training import arrival
from babysitter.training.arrival import ClockOffsets, arrival_scores, evaluate, payload, sample_seqs


def simulate(
    work: list[float],
    *,
    offsets: list[float] | None = None,
    steps: int = 40,
    collectives: int = 2,
    async_chain: bool = False,
    jitter: float = 0.0005,
    seed: int = 0,
    stop: tuple[int, int, float] | None = None,
) -> list[dict[int, float]]:
    """Each rank's recorded enqueue times (its own clock) by sequence number.

    ``work[r]``: rank r's compute per step; the step's collectives follow it (back to back, each
    blocking, or with ``async_chain`` issued during the work and waited for at the end). ``stop``:
    ``(rank, step, seconds)``, that rank stopped (SIGSTOP) for that long inside that step's work.
    """
    rng = random.Random(seed)
    ranks = len(work)
    offsets = offsets or [0.0] * ranks
    seen: list[dict[int, float]] = [{} for _ in range(ranks)]
    free = [0.0] * ranks  # true time each rank is free to compute
    seq = 0
    for step in range(steps):
        if stop is not None and stop[1] == step:
            free[stop[0]] += stop[2]
        if async_chain:
            # Buckets enqueued evenly during the work; the step ends when the last bucket completes.
            times = []
            for k in range(collectives):
                seq += 1
                arrive = [
                    free[r] + work[r] * (k + 1) / collectives + rng.uniform(0, jitter) for r in range(ranks)
                ]
                for r in range(ranks):
                    seen[r][seq] = arrive[r] + offsets[r]
                times.append(max(arrive))
            done = max(times) + 0.0001
            free = [done] * ranks
            continue
        for k in range(collectives):
            seq += 1
            lead = work if k == 0 else [0.00005] * ranks  # the first after the work, then back to back
            arrive = [free[r] + lead[r] + rng.uniform(0, jitter) for r in range(ranks)]
            for r in range(ranks):
                seen[r][seq] = arrive[r] + offsets[r]
            done = max(arrive) + 0.0001
            free = [done] * ranks
    return seen


def one_round(
    seen: list[dict[int, float]], corrections: list[float], *, round_index: int = 3
) -> tuple[list[float | None], list[float | None]]:
    """What the ranks compute from one round: the samples up to the newest collective, reduced."""
    x = max(seen[0])
    seqs = sample_seqs(x, (round_index - 1, x - 40), round_index, 2000)
    payloads, owns = [], []
    for r, arrivals in enumerate(seen):
        values, own = payload(seqs, arrivals, corrections[r])
        payloads.append(values)
        owns.append(own)
    reduced = [max(column) for column in zip(*payloads, strict=True)]
    results = [evaluate(reduced, seqs, owns[r]) for r in range(len(seen))]
    assert len({res.pairs for res in results}) == 1  # every rank counts the same pairs
    return arrival_scores([res.gap for res in results], [res.wait for res in results])


def settled_offsets(true_offsets: list[float], rounds: int = 9, seed: int = 1) -> ClockOffsets:
    """Offsets estimated as the monitor does: each round's all_gather completes at one instant, stamped
    on each rank's clock by a callback that can run late (waiting for the GIL) by up to 4 ms."""
    rng = random.Random(seed)
    clocks = ClockOffsets()
    for k in range(rounds):
        instant = 100.0 + k
        clocks.add(
            [instant + off + rng.choice((0.0, 0.0, 0.0, rng.uniform(0, 0.004))) for off in true_offsets]
        )
    return clocks


def test_a_rank_40_percent_slower_is_singled_out_and_the_others_stay_at_one() -> None:
    seen = simulate([0.05, 0.05, 0.07, 0.05])
    scores, lags = one_round(seen, [0.0] * 4)
    assert scores[2] == pytest.approx(1.4, abs=0.03)
    assert all(abs(s - 1.0) <= 0.05 for i, s in enumerate(scores) if i != 2), scores  # type: ignore[operator]
    # The others wait ~20 ms at the collective after the work, ~0 at the back-to-back one: ~10 ms mean.
    assert lags[2] == pytest.approx(0.01, abs=0.003) and all(abs(g) < 0.002 for g in lags[:2]), lags  # type: ignore[arg-type]


def test_a_rank_20_percent_slower_is_singled_out() -> None:
    seen = simulate([0.1] * 7 + [0.12])
    scores, _ = one_round(seen, [0.0] * 8)
    assert scores[7] == pytest.approx(1.2, abs=0.02)
    assert max(abs(s - 1.0) for s in scores[:7]) <= 0.05  # type: ignore[operator]


def test_a_healthy_run_scores_one_everywhere() -> None:
    scores, lags = one_round(simulate([0.05] * 4, jitter=0.002), [0.0] * 4)
    assert all(abs(s - 1.0) <= 0.05 for s in scores), scores  # type: ignore[operator]
    assert all(abs(g) < 0.002 for g in lags), lags  # type: ignore[arg-type]


@pytest.mark.parametrize("skew", [0.005, 0.025])
def test_a_rank_whose_clock_is_off_is_not_flagged_once_offsets_are_removed(skew: float) -> None:
    """Rank 1's clock runs ``skew`` ahead: uncorrected, its arrivals look late and it looks slow (the
    test would catch an implementation that compared raw timestamps); corrected, it is healthy."""
    true = [0.0, skew, 0.0, 0.0]
    seen = simulate([0.05, 0.05, 0.07, 0.05], offsets=true)
    raw, _ = one_round(seen, [0.0] * 4)
    if skew >= 0.025:
        assert raw[1] is not None and raw[1] > 1.2, raw  # flagged without the correction
    clocks = settled_offsets(true)
    assert clocks.settled
    assert abs(clocks.offset(1) - skew) < 0.001
    fixed, lags = one_round(seen, [clocks.offset(r) for r in range(4)])
    assert abs(fixed[1] - 1.0) <= 0.05, fixed  # type: ignore[operator]
    assert fixed[2] == pytest.approx(1.4, abs=0.03)
    assert abs(lags[1]) < 0.002  # type: ignore[arg-type]


def test_a_rank_stopped_once_and_resumed_is_no_straggler_in_any_round_that_samples_the_stop() -> None:
    """Rank 2 stopped for 30 s inside step 60 (a hang: TrainingStalled's page) and resumed. A round
    samples the last 32 pairs (16 steps here), so every round ending in steps 61 to 76 holds the stopped
    pair: with a round every 5 steps (the campaign's) that is three rounds in a row, enough to move the
    median of three. The one huge gap must not make rank 2 a straggler in any of them, nor the others'
    one huge wait a lag; a real straggler in the same rounds is still named."""
    for work, slow in (([0.05] * 4, None), ([0.05, 0.05, 0.05, 0.07], 3)):
        seen = simulate(work, steps=80, stop=(2, 60, 30.0))
        for end in range(61, 77):
            upto = [{seq: t for seq, t in rank.items() if seq <= 2 * end} for rank in seen]
            scores, lags = one_round(upto, [0.0] * 4)
            for r in range(4):
                if r == slow:
                    assert scores[r] == pytest.approx(1.4, abs=0.05), (end, scores)
                else:
                    assert abs(scores[r] - 1.0) <= 0.05, (end, scores)  # type: ignore[operator]
                    assert abs(lags[r]) < 0.005, (end, lags)  # type: ignore[arg-type]


def test_async_chains_count_only_at_their_sync_boundary() -> None:
    """DDP-like buckets issued during the work: inside the chain a gap says nothing and is left out;
    the first bucket after the end-of-step wait still times each rank's own work."""
    seen = simulate([0.05, 0.05, 0.06, 0.05], collectives=5, async_chain=True)
    scores, _ = one_round(seen, [0.0] * 4)
    assert scores[2] is not None and scores[2] > 1.1, scores
    assert all(abs(s - 1.0) <= 0.05 for i, s in enumerate(scores) if i != 2), scores  # type: ignore[operator]


def test_samples_spread_over_the_round_and_vary_where_in_the_step() -> None:
    """A fixed weight/bias pattern must not alias: the samples take both kinds of collective."""
    seqs = sample_seqs(10_000, (4, 8_000), 5, 2000)
    assert len(seqs) == 2 * arrival.PAIRS
    ends = seqs[1::2]
    assert {n % 2 for n in ends} == {0, 1}
    assert max(ends) <= 10_000 and min(ends) >= 10_000 - 1000  # within half the recorder's 2000 entries
    assert sample_seqs(10_000, (4, 8_000), 5, 2000) == seqs  # the same on every rank
    assert sample_seqs(1, None, 0, 2000) == []


def test_a_slot_any_rank_filled_differently_is_void_on_every_rank() -> None:
    seqs = [9, 10]
    a, own_a = payload(seqs, {9: 1.0, 10: 2.0}, 0.0)
    b, own_b = payload([10, 11], {10: 2.1, 11: 3.0}, 0.0)  # this rank sampled other collectives
    reduced = [max(x, y) for x, y in zip(a, b, strict=True)]
    assert math.isnan(evaluate(reduced, seqs, own_a).wait)
    assert math.isnan(evaluate(reduced, [10, 11], own_b).wait)
    c, _ = payload(seqs, {9: 1.0}, 0.0)  # a rank without collective 10
    reduced = [max(x, y) for x, y in zip(a, c, strict=True)]
    assert evaluate(reduced, seqs, own_a).pairs == 0


def test_a_round_without_every_rank_gives_no_score() -> None:
    # Rank 0 waited 10 ms for the others at each collective: it arrives 10 ms before the median rank.
    scores, lags = arrival_scores([1.0, math.nan, 1.2], [0.01, 0.0, 0.0])
    assert scores == [None, None, None] and lags == [-0.01, 0.0, 0.0]
    assert arrival_scores([0.0, 0.0], [math.nan, 0.0]) == ([None, None], [None, None])


def test_offsets_need_three_rounds_and_ignore_a_late_stamp() -> None:
    clocks = ClockOffsets()
    assert clocks.offset(0) == 0.0 and not clocks.settled
    assert not clocks.add([1.0, math.nan])
    for k in range(2):
        clocks.add([10.0 + k, 10.02 + k, 10.0 + k])
    assert not clocks.settled
    clocks.add([12.0, 12.02 + 0.5, 12.0])  # one stamp half a second late (a GIL stall)
    assert clocks.settled and clocks.offset(1) == pytest.approx(0.02)
